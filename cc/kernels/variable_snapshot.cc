#include "cc/kernels/variable_snapshot.h"

#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/types.h"

namespace tensorflow_elastic {

using tensorflow::mutex;
using tensorflow::mutex_lock;
using tensorflow::Tensor;
using tensorflow::tf_shared_lock;
using tensorflow::Var;

VariableSnapshot::VariableSnapshot(std::vector<tensorflow::core::RefCountPtr<Var>> variables,
                                   std::vector<bool> on_host)
    : variables_(std::move(variables)), on_host_(std::move(on_host)) {}

absl::Status VariableSnapshot::Take() {
  std::vector<Tensor> values(variables_.size());
  for (size_t i = 0; i < variables_.size(); ++i) {
    Var* variable = variables_[i].get();
    if (variable->copy_on_read_mode.load()) {
      // Sparse updates write in place while the variable is in copy-on-read
      // mode. Leaving the mode while the buffer is shared makes the next
      // sparse update copy it first (EnsureSparseVariableAccess), exactly as
      // dense updates copy a buffer that a read still holds.
      mutex_lock lock(*variable->mu());
      variable->copy_on_read_mode.store(false);
      values[i] = *variable->tensor();
    } else {
      tf_shared_lock lock(*variable->mu());
      if (!variable->is_initialized) {
        return absl::FailedPreconditionError(
            absl::StrCat("variable ", i, " of the snapshot is not initialized"));
      }
      values[i] = *variable->tensor();
    }
  }
  mutex_lock lock(mu_);
  saved_.swap(values);
  taken_ = true;
  return absl::OkStatus();
}

absl::Status VariableSnapshot::Saved(std::vector<Tensor>* values) const {
  mutex_lock lock(mu_);
  if (!taken_) return absl::FailedPreconditionError("no snapshot has been taken yet");
  *values = saved_;
  return absl::OkStatus();
}

absl::Status VariableSnapshot::Restore(int keep) {
  mutex_lock lock(mu_);
  if (!taken_) return absl::FailedPreconditionError("no snapshot has been taken yet");
  for (size_t i = 0; i < variables_.size(); ++i) {
    if (static_cast<int>(i) == keep) continue;
    Var* variable = variables_[i].get();
    mutex_lock variable_lock(*variable->mu());
    *variable->tensor() = saved_[i];
    variable->is_initialized = true;
    // A sparse update in copy-on-read mode would write into the shared buffer.
    variable->copy_on_read_mode.store(false);
  }
  return absl::OkStatus();
}

absl::Status VariableSnapshot::ReadFloat64(int index, bool held, double* out,
                                           int64_t count) const {
  if (index < 0 || index >= size()) {
    return absl::OutOfRangeError(
        absl::StrCat("variable index ", index, " is outside [0, ", size(), ")"));
  }
  if (!on_host_[index]) {
    return absl::InvalidArgumentError(
        absl::StrCat("variable ", index, " is not in host memory"));
  }
  Tensor value;
  if (held) {
    mutex_lock lock(mu_);
    if (!taken_) return absl::FailedPreconditionError("no snapshot has been taken yet");
    value = saved_[index];
  } else {
    Var* variable = variables_[index].get();
    tf_shared_lock lock(*variable->mu());
    value = *variable->tensor();
  }
  if (value.dtype() != tensorflow::DT_DOUBLE || value.NumElements() != count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "variable ", index, " holds ", tensorflow::DataTypeString(value.dtype()), "[",
        value.NumElements(), "], not float64[", count, "]"));
  }
  std::memcpy(out, value.flat<double>().data(), count * sizeof(double));
  return absl::OkStatus();
}

namespace {

struct Registry {
  mutex mu;
  int64_t next_id TF_GUARDED_BY(mu) = 1;
  absl::flat_hash_map<int64_t, std::shared_ptr<VariableSnapshot>> snapshots TF_GUARDED_BY(mu);
};

Registry& GetRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

}  // namespace

int64_t RegisterSnapshot(std::shared_ptr<VariableSnapshot> snapshot) {
  Registry& registry = GetRegistry();
  mutex_lock lock(registry.mu);
  const int64_t id = registry.next_id++;
  registry.snapshots[id] = std::move(snapshot);
  return id;
}

std::shared_ptr<VariableSnapshot> FindSnapshot(int64_t id) {
  Registry& registry = GetRegistry();
  mutex_lock lock(registry.mu);
  auto it = registry.snapshots.find(id);
  return it == registry.snapshots.end() ? nullptr : it->second;
}

bool ReleaseSnapshot(int64_t id) {
  std::shared_ptr<VariableSnapshot> released;  // destroyed outside the lock
  Registry& registry = GetRegistry();
  mutex_lock lock(registry.mu);
  auto it = registry.snapshots.find(id);
  if (it == registry.snapshots.end()) return false;
  released = std::move(it->second);
  registry.snapshots.erase(it);
  return true;
}

}  // namespace tensorflow_elastic
