#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("TFRecordIndex")
    .Input("filenames: string")
    .Input("cache_dir: string")
    .Output("counts: int64")
    .Output("offsets: int64")
    .Output("lengths: int64")
    .SetIsStateful()  // the files may change between calls
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle filenames, unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &filenames));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      c->set_output(0, filenames);
      c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(2, c->Vector(InferenceContext::kUnknownDim));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The records of uncompressed TFRecord files: counts[i] records in filenames[i];
offsets and lengths of every record, file after file. Read from the length
headers only, in parallel across files; kept in memory (and in cache_dir if not
empty) under each file's size and modification time.
)doc");

REGISTER_OP("TFRecordRead")
    .Input("filenames: string")
    .Input("file_ids: int64")
    .Input("offsets: int64")
    .Input("lengths: int64")
    .Input("index: int64")
    .Output("record: string")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      for (int i = 0; i < 4; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 0, &unused));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Record `index` of an index in any order: lengths[index] bytes at
offsets[index] of filenames[file_ids[index]], read with both CRCs checked.
)doc");
