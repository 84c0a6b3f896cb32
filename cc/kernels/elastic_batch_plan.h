// Which part of a global batch one worker emits, and where its elements lie.
//
// Pure functions of (cursor, global batch size, world size, rank), so every
// worker derives the same plan from the same shared state, and a plan can be
// recomputed after any membership change without replaying the input.
#ifndef TENSORFLOW_ELASTIC_CC_KERNELS_ELASTIC_BATCH_PLAN_H_
#define TENSORFLOW_ELASTIC_CC_KERNELS_ELASTIC_BATCH_PLAN_H_

#include <algorithm>
#include <cstdint>

#include "cc/kernels/global_batch_slice.h"

namespace tensorflow_elastic {

struct WorkerBatch {
  int64_t start = 0;              // global index of the first element
  int64_t size = 0;               // elements this worker emits (may be 0)
  bool end_of_sequence = false;   // the pass is over, for every worker
};

// Plans this worker's part of global batch `cursor`, of which `available`
// elements exist (global_batch_size, or fewer for the last batch of a finite
// input). Every worker sees the same `available`, so all agree on the end of a
// pass. A partial last batch keeps each worker's full-batch slice clipped to
// the elements that exist (a worker past the end emits an empty batch): no
// worker ever needs an element outside its full slice, which lets a streaming
// input be read strictly forward. With drop_remainder the partial batch ends
// the pass instead.
// `slice` is this worker's slice of the full global batch (ComputeGlobalBatchSlice).
inline WorkerBatch PlanWorkerBatch(const BatchSlice& slice, int64_t cursor,
                                   int64_t global_batch_size, int64_t available,
                                   bool drop_remainder) {
  WorkerBatch batch;
  if (available <= 0 || (drop_remainder && available < global_batch_size)) {
    batch.end_of_sequence = true;
    return batch;
  }
  const int64_t end = cursor * global_batch_size + std::min(available, global_batch_size);
  batch.start = slice.start;
  batch.size = std::clamp<int64_t>(end - slice.start, 0, slice.size);
  return batch;
}

// Global index of the k-th element of the stream a worker reads when it takes
// its slice [offset, offset + size) of every `stride`-th global batch from
// `first_cursor` on (stride > 1: one of several readers taking turns). A pure
// function of k, so a prefetching input may run ahead of the reader.
inline int64_t SliceStreamIndex(int64_t k, int64_t first_cursor, int64_t stride,
                                int64_t global_batch_size, int64_t offset, int64_t size) {
  return (first_cursor + stride * (k / size)) * global_batch_size + offset + k % size;
}

}  // namespace tensorflow_elastic

#endif  // TENSORFLOW_ELASTIC_CC_KERNELS_ELASTIC_BATCH_PLAN_H_
