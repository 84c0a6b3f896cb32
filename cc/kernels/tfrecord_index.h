// Random access into uncompressed TFRecord files: where each record lies, and
// one record read at its place with both of its CRCs checked.
//
// A TFRecord record is: uint64 length, uint32 masked CRC32C of the length,
// `length` bytes of data, uint32 masked CRC32C of the data. The index of a file
// (offset and length of every record) is read from the length headers alone;
// it is kept in memory, and in a cache directory if one is given, under the
// file's size and modification time, so a file that changed is indexed anew.
// Paths go through TensorFlow's Env: whatever tf.io.gfile reaches works.
#ifndef TENSORFLOW_ELASTIC_CC_KERNELS_TFRECORD_INDEX_H_
#define TENSORFLOW_ELASTIC_CC_KERNELS_TFRECORD_INDEX_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/tstring.h"

namespace tensorflow_elastic {

// The records of one file, as found when the file had `size` bytes and `mtime_nsec`.
struct TFRecordFileIndex {
  int64_t size = 0;
  int64_t mtime_nsec = 0;
  std::vector<int64_t> offsets;  // of each record's length header
  std::vector<int64_t> lengths;  // of each record's data
};

// The index of `path`: from memory or `cache_dir` (may be empty) if the file
// still has the size and modification time it had, else read from its length
// headers (and stored back). Errors name the file and the offset.
absl::StatusOr<std::shared_ptr<const TFRecordFileIndex>> IndexTFRecordFile(
    tensorflow::Env* env, const std::string& path, const std::string& cache_dir);

// Record `length` bytes long whose header is at `offset` of `path`, into `out`;
// both CRCs and the length in the header are checked against the index.
absl::Status ReadTFRecordAt(tensorflow::Env* env, const std::string& path, int64_t offset,
                            int64_t length, tensorflow::tstring* out);

}  // namespace tensorflow_elastic

#endif  // TENSORFLOW_ELASTIC_CC_KERNELS_TFRECORD_INDEX_H_
