#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

REGISTER_OP("GlobalBatchSlice")
    .Input("cursor: int64")
    .Input("global_batch_size: int64")
    .Input("num_workers: int64")
    .Input("worker_index: int64")
    .Output("start: int64")
    .Output("size: int64")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      for (int i = 0; i < 4; ++i) {
        tensorflow::shape_inference::ShapeHandle unused;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
      }
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
This worker's slice of one global batch: elements [start, start + size) of the
global stream. The first global_batch_size % num_workers workers take one
element more; the slices of all workers cover the global batch exactly once.
Inputs are runtime tensors, so a traced function follows membership changes.
)doc");
