// AssignAddVariableOp and AssignSubVariableOp on CPU for the floating-point
// types, registered above TensorFlow's own kernels (priority 1).
//
// A state's snapshot holds every variable's buffer between commits, so an
// optimizer's in-place update (Keras' Adam: assign_add on both slots,
// assign_sub on the weight) finds its buffer shared at every step. TensorFlow's
// kernel then copies the buffer and updates the copy: two passes over the
// variable. Here the new buffer is written once with `old + delta` (or
// `old - delta`), into `delta`'s own buffer when nothing else holds it, so a
// shared variable costs no more memory traffic than an unshared one. An
// unshared variable is updated in place, as TensorFlow does. The results are
// the same values, element by element.
//
// TFE_ONE_PASS_UPDATES=0 in the environment keeps TensorFlow's two passes
// (read once per process), e.g. to measure the difference.
#define EIGEN_USE_THREADS

#include <cstdlib>
#include <cstring>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/kernels/dense_update_functor.h"
#include "tensorflow/core/kernels/training_op_helpers.h"

namespace tensorflow_elastic {
namespace {

using tensorflow::AllocatorAttributes;
using tensorflow::DenseUpdateType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::Var;
using CPUDevice = Eigen::ThreadPoolDevice;

bool OnePassEnabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("TFE_ONE_PASS_UPDATES");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return enabled;
}

template <typename T, DenseUpdateType Op>
class OnePassUpdateVariableOp : public OpKernel {
 public:
  explicit OnePassUpdateVariableOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    tensorflow::core::RefCountPtr<Var> variable;
    OP_REQUIRES_OK(ctx, tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, 0),
                                                   &variable));
    const Tensor& delta = ctx->input(1);
    tensorflow::mutex_lock lock(*variable->mu());
    Tensor* current = variable->tensor();
    OP_REQUIRES(ctx, current->shape().IsSameSize(delta.shape()),
                absl::InvalidArgumentError(absl::StrCat(
                    "Cannot update variable with shape ", current->shape().DebugString(),
                    " using a Tensor with shape ", delta.shape().DebugString(),
                    ", shapes must be equal.")));
    OP_REQUIRES(ctx, current->dtype() == delta.dtype(),
                absl::InvalidArgumentError(
                    "DType of variable handle and value does not match."));
    const CPUDevice& device = ctx->eigen_device<CPUDevice>();
    const bool shared = variable->copy_on_read_mode.load() || !current->RefCountIsOne();
    if (!shared || !OnePassEnabled()) {
      OP_REQUIRES_OK(ctx, tensorflow::PrepareToUpdateVariable<CPUDevice, T>(
                              ctx, current, variable->copy_on_read_mode.load()));
      tensorflow::functor::DenseUpdate<CPUDevice, T, Op> update;
      update(device, current->flat<T>(), delta.flat<T>());
      return;
    }
    Tensor updated;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_temp({1}, current->dtype(),
                                                            current->shape(),
                                                            AllocatorAttributes(), &updated));
    auto out = updated.flat<T>();
    const auto old = const_cast<const Tensor*>(current)->flat<T>();
    const auto change = delta.flat<T>();
    if (Op == tensorflow::ADD) {
      out.device(device) = old + change;
    } else {
      out.device(device) = old - change;
    }
    *current = updated;
  }
};

#define REGISTER_ONE_PASS_UPDATES(T)                                                      \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("AssignAddVariableOp").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("dtype") \
          .Priority(1),                                                                   \
      OnePassUpdateVariableOp<T, tensorflow::ADD>);                                       \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("AssignSubVariableOp").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("dtype") \
          .Priority(1),                                                                   \
      OnePassUpdateVariableOp<T, tensorflow::SUB>);

TF_CALL_half(REGISTER_ONE_PASS_UPDATES);
TF_CALL_bfloat16(REGISTER_ONE_PASS_UPDATES);
TF_CALL_float(REGISTER_ONE_PASS_UPDATES);
TF_CALL_double(REGISTER_ONE_PASS_UPDATES);

#undef REGISTER_ONE_PASS_UPDATES

}  // namespace
}  // namespace tensorflow_elastic
