#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

REGISTER_OP("ElasticBatchDataset")
    .Input("input_dataset: variant")
    .Input("global_batch_size: int64")
    .Input("world_size: resource")
    .Input("rank: resource")
    .Input("cursor: resource")
    .Output("handle: variant")
    .Attr("drop_remainder: bool = false")
    .Attr("local_replicas: int = 1")
    .Attr("output_types: list(type) >= 1")
    .Attr("output_shapes: list(shape) >= 1")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      return tensorflow::shape_inference::ScalarShape(c);
    })
    .Doc(R"doc(
This worker's slice of each global batch of input_dataset, resharded at runtime.

At every GetNext the op reads the scalar int64 variables world_size, rank and
cursor (the next global batch of the current pass), emits this worker's slice
of global batch `cursor` (the GlobalBatchSlice rule) stacked into one batch, and
sets cursor to cursor + 1; at the end of a pass it sets cursor to 0. The last
partial global batch keeps each worker's slice clipped to the elements that
exist (possibly empty), or ends the pass if drop_remainder is set. Nothing may
buffer elements after this dataset, or the cursor would run ahead of training.
With local_replicas = k > 1, world_size counts replicas and rank is this
worker's first replica: it emits the slices of replicas rank .. rank + k - 1,
one contiguous range.
)doc");
