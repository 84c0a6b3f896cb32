// The two ops around a VariableSnapshot: one creates it (once per state), one
// hands its held values back as tensors (only when a state is restored).
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/kernels/variable_snapshot.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/device_name_utils.h"

namespace tensorflow_elastic {
namespace {

using tensorflow::DataTypeVector;
using tensorflow::DeviceNameUtils;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::ResourceHandle;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::Var;

bool OnHost(const ResourceHandle& handle) {
  DeviceNameUtils::ParsedName name;
  return DeviceNameUtils::ParseFullName(handle.device(), &name) && name.has_type &&
         name.type == tensorflow::DEVICE_CPU;
}

class ElasticVariableSnapshotOp : public OpKernel {
 public:
  explicit ElasticVariableSnapshotOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    std::vector<tensorflow::core::RefCountPtr<Var>> variables;
    std::vector<bool> on_host;
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsScalar(ctx->input(i).shape()),
                  absl::InvalidArgumentError(absl::StrCat(
                      "resource ", i, " must be a scalar handle, got shape ",
                      ctx->input(i).shape().DebugString())));
      const ResourceHandle& handle = tensorflow::HandleFromInput(ctx, i);
      tensorflow::core::RefCountPtr<Var> variable;
      OP_REQUIRES_OK(ctx, tensorflow::LookupResource(ctx, handle, &variable));
      variables.push_back(std::move(variable));
      on_host.push_back(OnHost(handle));
    }
    Tensor* id = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &id));
    id->scalar<int64_t>()() = RegisterSnapshot(
        std::make_shared<VariableSnapshot>(std::move(variables), std::move(on_host)));
  }
};

class ElasticVariableSnapshotValuesOp : public OpKernel {
 public:
  explicit ElasticVariableSnapshotValuesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dtypes", &dtypes_));
  }

  void Compute(OpKernelContext* ctx) override {
    // Eager calls skip the op's shape function: a non-scalar id would abort the process.
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsScalar(ctx->input(0).shape()),
                absl::InvalidArgumentError(absl::StrCat(
                    "the snapshot id must be a scalar, got shape ",
                    ctx->input(0).shape().DebugString())));
    const int64_t id = ctx->input(0).scalar<int64_t>()();
    std::shared_ptr<VariableSnapshot> snapshot = FindSnapshot(id);
    OP_REQUIRES(ctx, snapshot != nullptr,
                absl::NotFoundError(absl::StrCat("no variable snapshot with id ", id)));
    std::vector<Tensor> values;
    OP_REQUIRES_OK(ctx, snapshot->Saved(&values));
    OP_REQUIRES(ctx, values.size() == dtypes_.size(),
                absl::InvalidArgumentError(absl::StrCat("the snapshot holds ", values.size(),
                                                        " values, ", dtypes_.size(),
                                                        " dtypes were given")));
    for (size_t i = 0; i < values.size(); ++i) {
      OP_REQUIRES(ctx, values[i].dtype() == dtypes_[i],
                  absl::InvalidArgumentError(absl::StrCat(
                      "value ", i, " is ", tensorflow::DataTypeString(values[i].dtype()),
                      ", expected ", tensorflow::DataTypeString(dtypes_[i]))));
      ctx->set_output(i, values[i]);
    }
  }

 private:
  DataTypeVector dtypes_;
};

// DEVICE_DEFAULT: the kernels touch no tensor data, so they serve variables on
// any device (a snapshot's values stay in their variable's memory).
REGISTER_KERNEL_BUILDER(Name("ElasticVariableSnapshot").Device(tensorflow::DEVICE_CPU),
                        ElasticVariableSnapshotOp);
REGISTER_KERNEL_BUILDER(Name("ElasticVariableSnapshot")
                            .Device(tensorflow::DEVICE_DEFAULT)
                            .HostMemory("snapshot_id"),
                        ElasticVariableSnapshotOp);
REGISTER_KERNEL_BUILDER(Name("ElasticVariableSnapshotValues").Device(tensorflow::DEVICE_CPU),
                        ElasticVariableSnapshotValuesOp);
REGISTER_KERNEL_BUILDER(Name("ElasticVariableSnapshotValues")
                            .Device(tensorflow::DEVICE_DEFAULT)
                            .HostMemory("snapshot_id"),
                        ElasticVariableSnapshotValuesOp);

}  // namespace
}  // namespace tensorflow_elastic
