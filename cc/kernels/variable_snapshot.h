// VariableSnapshot: the values of a fixed list of variables as of the last
// Take(), held without copying.
//
// An elastic commit runs after every training step, so it must be cheap. A
// snapshot holds a reference to each variable's buffer, as ReadVariableOp
// does, so the next in-place update of the variable copies the buffer
// (TensorFlow's copy-on-write) and the snapshot keeps the old values. Taking
// one is a direct call from Python (cc/python/binding_module.cc): an
// eager op would cost 50-250 us of dispatch per commit in TensorFlow 2.21.
#ifndef TENSORFLOW_ELASTIC_CC_KERNELS_VARIABLE_SNAPSHOT_H_
#define TENSORFLOW_ELASTIC_CC_KERNELS_VARIABLE_SNAPSHOT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/platform/refcount.h"

namespace tensorflow_elastic {

class VariableSnapshot {
 public:
  // `on_host[i]` tells whether variable i lives in host memory (only those can
  // be read with ReadFloat64).
  VariableSnapshot(std::vector<tensorflow::core::RefCountPtr<tensorflow::Var>> variables,
                   std::vector<bool> on_host);

  int size() const { return static_cast<int>(variables_.size()); }

  // Holds every variable's current value. Must not run while ops update the
  // variables (a commit runs between steps).
  absl::Status Take();

  // The values held by the last Take().
  absl::Status Saved(std::vector<tensorflow::Tensor>* values) const;

  // Gives every variable but variable `keep` (-1: none kept) the value the last
  // Take() holds, without copying: the variable shares the held buffer, so its
  // next in-place update copies it and the snapshot keeps its values. Must not
  // run while ops use the variables (a restore runs between steps).
  absl::Status Restore(int keep);

  // Copies the value of variable `index`, a host float64 variable of `count`
  // elements, into `out`: its current value, or with `held` the one the last
  // Take() holds.
  absl::Status ReadFloat64(int index, bool held, double* out, int64_t count) const;

 private:
  const std::vector<tensorflow::core::RefCountPtr<tensorflow::Var>> variables_;
  const std::vector<bool> on_host_;
  mutable tensorflow::mutex mu_;
  std::vector<tensorflow::Tensor> saved_ TF_GUARDED_BY(mu_);
  bool taken_ TF_GUARDED_BY(mu_) = false;
};

// Snapshots are addressed by id from Python: an unknown id is an error, not a
// dangling pointer.
int64_t RegisterSnapshot(std::shared_ptr<VariableSnapshot> snapshot);
std::shared_ptr<VariableSnapshot> FindSnapshot(int64_t id);
bool ReleaseSnapshot(int64_t id);

}  // namespace tensorflow_elastic

#endif  // TENSORFLOW_ELASTIC_CC_KERNELS_VARIABLE_SNAPSHOT_H_
