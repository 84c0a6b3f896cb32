#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

REGISTER_OP("ElasticVariableSnapshot")
    .Input("resources: N * resource")
    .Attr("N: int >= 1")
    .Output("snapshot_id: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Creates a snapshot of the given resource variables and returns its id. The
snapshot holds nothing until taken (through the library's Python binding, at
every commit); taking it references the variables' buffers without copying
them. The binding's object for the id releases it.
)doc");

REGISTER_OP("ElasticVariableSnapshotValues")
    .Input("snapshot_id: int64")
    .Attr("dtypes: list(type) >= 1")
    .Output("values: dtypes")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::UnknownShape)
    .Doc(R"doc(
The values held by the last take of snapshot `snapshot_id`, in the order its
variables were given, e.g. to assign them back after a failed step.
)doc");
