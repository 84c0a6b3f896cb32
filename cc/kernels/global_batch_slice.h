// The rule that splits one global batch among the current members.
//
// The global batch `cursor` covers elements [cursor * G, (cursor + 1) * G) of
// the global stream. With n workers, worker r takes a contiguous slice: the
// first G % n workers take G / n + 1 elements, the others G / n. The slices
// cover the global batch exactly once whatever n is, which is what keeps
// samples exactly-once when the world size changes between two global batches.
#ifndef TENSORFLOW_ELASTIC_CC_KERNELS_GLOBAL_BATCH_SLICE_H_
#define TENSORFLOW_ELASTIC_CC_KERNELS_GLOBAL_BATCH_SLICE_H_

#include <cstdint>
#include <limits>

#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/platform/status.h"

namespace tensorflow_elastic {

struct BatchSlice {
  int64_t start = 0;  // index of the slice's first element in the global stream
  int64_t size = 0;   // number of elements in the slice
};

inline absl::Status ComputeGlobalBatchSlice(int64_t cursor, int64_t global_batch_size,
                                            int64_t num_workers, int64_t worker_index,
                                            BatchSlice* slice) {
  if (global_batch_size <= 0) {
    return tensorflow::errors::InvalidArgument(
        "global_batch_size must be positive, got ", global_batch_size);
  }
  if (num_workers <= 0) {
    return tensorflow::errors::InvalidArgument("num_workers must be positive, got ",
                                               num_workers);
  }
  if (worker_index < 0 || worker_index >= num_workers) {
    return tensorflow::errors::InvalidArgument("worker_index must be in [0, ", num_workers,
                                               "), got ", worker_index);
  }
  if (global_batch_size < num_workers) {
    return tensorflow::errors::InvalidArgument(
        "global_batch_size (", global_batch_size, ") is smaller than the number of workers (",
        num_workers, "): every worker needs at least one element; raise the global batch size "
        "or lower max_nodes");
  }
  if (cursor < 0) {
    return tensorflow::errors::InvalidArgument("cursor must be non-negative, got ", cursor);
  }
  if (cursor > std::numeric_limits<int64_t>::max() / global_batch_size - 1) {
    return tensorflow::errors::OutOfRange("cursor ", cursor, " times global_batch_size ",
                                          global_batch_size, " overflows int64");
  }
  const int64_t base = global_batch_size / num_workers;
  const int64_t extra = global_batch_size % num_workers;
  slice->size = base + (worker_index < extra ? 1 : 0);
  slice->start = cursor * global_batch_size + worker_index * base +
                 (worker_index < extra ? worker_index : extra);
  return absl::OkStatus();
}

// A worker that drives several replicas takes the slices of `count` consecutive
// replicas from `first_replica` on, of `num_replicas` in the whole job: one
// contiguous range, which its own runtime cuts again per replica by the same
// rule (the first of them take the extra elements, as in the whole job).
inline absl::Status ComputeReplicaRangeSlice(int64_t cursor, int64_t global_batch_size,
                                             int64_t num_replicas, int64_t first_replica,
                                             int64_t count, BatchSlice* slice) {
  BatchSlice first;
  BatchSlice last;
  TF_RETURN_IF_ERROR(ComputeGlobalBatchSlice(cursor, global_batch_size, num_replicas,
                                             first_replica, &first));
  if (count <= 0 || first_replica + count > num_replicas) {
    return tensorflow::errors::InvalidArgument(
        "a worker's ", count, " replica(s) from replica ", first_replica,
        " do not fit in the job's ", num_replicas, " replicas");
  }
  TF_RETURN_IF_ERROR(ComputeGlobalBatchSlice(cursor, global_batch_size, num_replicas,
                                             first_replica + count - 1, &last));
  slice->start = first.start;
  slice->size = last.start + last.size - first.start;
  return absl::OkStatus();
}

}  // namespace tensorflow_elastic

#endif  // TENSORFLOW_ELASTIC_CC_KERNELS_GLOBAL_BATCH_SLICE_H_
