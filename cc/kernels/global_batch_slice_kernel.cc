#include "cc/kernels/global_batch_slice.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tensorflow_elastic {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// Runtime inputs rather than attributes: the world size changes while the
// graph that calls this op stays traced.
class GlobalBatchSliceOp : public OpKernel {
 public:
  explicit GlobalBatchSliceOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    // Eager calls skip the op's shape function: a non-scalar input would abort the process.
    static const char* const kNames[] = {"cursor", "global_batch_size", "num_workers",
                                           "worker_index"};
    for (int i = 0; i < 4; ++i) {
      OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsScalar(ctx->input(i).shape()),
                  absl::InvalidArgumentError(absl::StrCat(
                      kNames[i], " must be a scalar, got shape ",
                      ctx->input(i).shape().DebugString())));
    }
    BatchSlice slice;
    OP_REQUIRES_OK(ctx, ComputeGlobalBatchSlice(Scalar(ctx, 0), Scalar(ctx, 1), Scalar(ctx, 2),
                                                Scalar(ctx, 3), &slice));
    Tensor* start = nullptr;
    Tensor* size = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &start));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &size));
    start->scalar<int64_t>()() = slice.start;
    size->scalar<int64_t>()() = slice.size;
  }

 private:
  static int64_t Scalar(OpKernelContext* ctx, int index) {
    return ctx->input(index).scalar<int64_t>()();
  }
};

REGISTER_KERNEL_BUILDER(Name("GlobalBatchSlice").Device(tensorflow::DEVICE_CPU),
                        GlobalBatchSliceOp);

}  // namespace
}  // namespace tensorflow_elastic
