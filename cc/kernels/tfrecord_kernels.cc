// TFRecordIndex builds the record index of a list of files (in parallel across
// files); TFRecordRead fetches the record an index entry points at.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/kernels/tfrecord_index.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/blocking_counter.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tensorflow_elastic {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::TensorShapeUtils;

// Reading headers waits on storage more than on the CPU: more threads than cores pay off.
constexpr int kMaxIndexThreads = 16;

absl::Status CheckRank(const Tensor& tensor, int rank, const char* name) {
  if (tensor.dims() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must have rank ", rank, ", got shape ",
                                                   tensor.shape().DebugString()));
  }
  return absl::OkStatus();
}

class TFRecordIndexOp : public OpKernel {
 public:
  explicit TFRecordIndexOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& filenames = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckRank(filenames, 1, "filenames"));
    OP_REQUIRES_OK(ctx, CheckRank(ctx->input(1), 0, "cache_dir"));
    const std::string cache_dir(ctx->input(1).scalar<tensorflow::tstring>()());
    const int64_t files = filenames.NumElements();
    OP_REQUIRES(ctx, files > 0, absl::InvalidArgumentError("the list of TFRecord files is empty"));
    auto names = filenames.flat<tensorflow::tstring>();
    std::vector<absl::StatusOr<std::shared_ptr<const TFRecordFileIndex>>> indexes(
        files, absl::UnknownError("not indexed"));
    tensorflow::Env* env = ctx->env();
    {
      tensorflow::thread::ThreadPool pool(
          env, "tfrecord_index", static_cast<int>(std::min<int64_t>(files, kMaxIndexThreads)));
      tensorflow::BlockingCounter done(static_cast<int>(files));
      for (int64_t i = 0; i < files; ++i) {
        pool.Schedule([&, i] {
          indexes[i] = IndexTFRecordFile(env, std::string(names(i)), cache_dir);
          done.DecrementCount();
        });
      }
      done.Wait();
    }
    int64_t records = 0;
    for (const auto& index : indexes) {
      OP_REQUIRES_OK(ctx, index.status());  // the first failing file in list order
      records += static_cast<int64_t>((*index)->offsets.size());
    }
    Tensor *counts = nullptr, *offsets = nullptr, *lengths = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({files}), &counts));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({records}), &offsets));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({records}), &lengths));
    int64_t* offset_out = offsets->flat<int64_t>().data();
    int64_t* length_out = lengths->flat<int64_t>().data();
    for (int64_t i = 0; i < files; ++i) {
      const TFRecordFileIndex& index = **indexes[i];
      counts->flat<int64_t>()(i) = static_cast<int64_t>(index.offsets.size());
      offset_out = std::copy(index.offsets.begin(), index.offsets.end(), offset_out);
      length_out = std::copy(index.lengths.begin(), index.lengths.end(), length_out);
    }
  }
};

class TFRecordReadOp : public OpKernel {
 public:
  explicit TFRecordReadOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& filenames = ctx->input(0);
    const Tensor& file_ids = ctx->input(1);
    const Tensor& offsets = ctx->input(2);
    const Tensor& lengths = ctx->input(3);
    const Tensor& index_tensor = ctx->input(4);
    OP_REQUIRES_OK(ctx, CheckRank(filenames, 1, "filenames"));
    OP_REQUIRES_OK(ctx, CheckRank(file_ids, 1, "file_ids"));
    OP_REQUIRES_OK(ctx, CheckRank(offsets, 1, "offsets"));
    OP_REQUIRES_OK(ctx, CheckRank(lengths, 1, "lengths"));
    OP_REQUIRES_OK(ctx, CheckRank(index_tensor, 0, "index"));
    const int64_t records = offsets.NumElements();
    OP_REQUIRES(ctx, file_ids.NumElements() == records && lengths.NumElements() == records,
                absl::InvalidArgumentError("file_ids, offsets and lengths differ in length"));
    const int64_t index = index_tensor.scalar<int64_t>()();
    OP_REQUIRES(ctx, index >= 0 && index < records,
                absl::OutOfRangeError(absl::StrCat("record ", index, " of ", records)));
    const int64_t file = file_ids.flat<int64_t>()(index);
    OP_REQUIRES(ctx, file >= 0 && file < filenames.NumElements(),
                absl::InvalidArgumentError(absl::StrCat("file id ", file, " of record ", index,
                                                        " is not one of the ",
                                                        filenames.NumElements(), " files")));
    Tensor* record = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &record));
    OP_REQUIRES_OK(ctx, ReadTFRecordAt(ctx->env(),
                                       std::string(filenames.flat<tensorflow::tstring>()(file)),
                                       offsets.flat<int64_t>()(index),
                                       lengths.flat<int64_t>()(index),
                                       &record->scalar<tensorflow::tstring>()()));
  }
};

REGISTER_KERNEL_BUILDER(Name("TFRecordIndex").Device(tensorflow::DEVICE_CPU), TFRecordIndexOp);
REGISTER_KERNEL_BUILDER(Name("TFRecordRead").Device(tensorflow::DEVICE_CPU), TFRecordReadOp);

}  // namespace
}  // namespace tensorflow_elastic
