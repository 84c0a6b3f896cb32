#include "cc/kernels/tfrecord_index.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/lib/hash/crc32c.h"
#include "tensorflow/core/lib/hash/hash.h"
#include "tensorflow/core/platform/file_statistics.h"
#include "tensorflow/core/platform/file_system.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/platform/path.h"

namespace tensorflow_elastic {
namespace {

using tensorflow::Env;
using tensorflow::mutex;
using tensorflow::mutex_lock;
using tensorflow::RandomAccessFile;

constexpr int64_t kHeaderBytes = 12;  // length (8) + masked CRC of the length (4)
constexpr int64_t kFooterBytes = 4;   // masked CRC of the data
// Headers are read through a window this large: small records cost one read per window,
// large ones one small read each.
constexpr int64_t kWindowBytes = 256 << 10;
constexpr char kCacheMagic[] = "TFE-TFRECORD-INDEX-1";

uint64_t DecodeFixed64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));  // TFRecord is little-endian, as are the hosts TF supports
  return v;
}

uint32_t DecodeFixed32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

bool MaskedCrcMatches(const char* data, size_t n, const char* masked) {
  return tensorflow::crc32c::Unmask(DecodeFixed32(masked)) == tensorflow::crc32c::Value(data, n);
}

// Open files, shared by every reader in the process; a file indexed anew is reopened.
class OpenFiles {
 public:
  static OpenFiles& Get() {
    static OpenFiles* files = new OpenFiles;
    return *files;
  }

  absl::StatusOr<std::shared_ptr<RandomAccessFile>> Open(Env* env, const std::string& path) {
    mutex_lock lock(mu_);
    auto found = files_.find(path);
    if (found != files_.end()) return found->second;
    std::unique_ptr<RandomAccessFile> file;
    absl::Status status = env->NewRandomAccessFile(path, &file);
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("TFRecord file ", path,
                                                      " cannot be opened: ", status.message()));
    }
    std::shared_ptr<RandomAccessFile> shared(std::move(file));
    files_.emplace(path, shared);
    return shared;
  }

  void Forget(const std::string& path) {
    mutex_lock lock(mu_);
    files_.erase(path);
  }

 private:
  mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<RandomAccessFile>> files_;
};

// Indexes kept for the life of the process.
class KeptIndexes {
 public:
  static KeptIndexes& Get() {
    static KeptIndexes* kept = new KeptIndexes;
    return *kept;
  }

  std::shared_ptr<const TFRecordFileIndex> Find(const std::string& path, int64_t size,
                                                int64_t mtime_nsec) {
    mutex_lock lock(mu_);
    auto found = indexes_.find(path);
    if (found == indexes_.end() || found->second->size != size ||
        found->second->mtime_nsec != mtime_nsec) {
      return nullptr;
    }
    return found->second;
  }

  void Keep(const std::string& path, std::shared_ptr<const TFRecordFileIndex> index) {
    mutex_lock lock(mu_);
    indexes_[path] = std::move(index);
  }

 private:
  mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const TFRecordFileIndex>> indexes_;
};

absl::Status Corrupt(const std::string& path, int64_t offset, const std::string& what) {
  return absl::DataLossError(absl::StrCat("TFRecord file ", path, ": ", what,
                                          " at offset ", offset));
}

// What a file that fails to parse as TFRecord probably is.
std::string CompressionHint(const char* start, int64_t size) {
  if (size >= 2 && static_cast<unsigned char>(start[0]) == 0x1f &&
      static_cast<unsigned char>(start[1]) == 0x8b) {
    return " (the file looks GZIP-compressed: records are addressed in uncompressed TFRecord "
           "files only; decompress the files, or read them as a stream)";
  }
  if (size >= 1 && static_cast<unsigned char>(start[0]) == 0x78) {
    return " (the file may be ZLIB-compressed: records are addressed in uncompressed TFRecord "
           "files only; decompress the files, or read them as a stream)";
  }
  return "";
}

absl::StatusOr<TFRecordFileIndex> ReadHeaders(RandomAccessFile* file, const std::string& path,
                                              int64_t size) {
  TFRecordFileIndex index;
  std::string window(kWindowBytes, '\0');
  int64_t window_start = 0, window_end = 0;
  const char* window_data = window.data();
  int64_t offset = 0;
  while (offset < size) {
    if (size - offset < kHeaderBytes) {
      return Corrupt(path, offset, absl::StrCat("truncated file: ", size - offset,
                                                " bytes where a record's 12-byte header starts"));
    }
    if (offset < window_start || offset + kHeaderBytes > window_end) {
      const int64_t n = std::min<int64_t>(kWindowBytes, size - offset);
      absl::string_view got;
      absl::Status status = file->Read(offset, n, &got, window.data());
      if (!status.ok() && !absl::IsOutOfRange(status)) {
        return absl::Status(status.code(), absl::StrCat("TFRecord file ", path, ": reading at offset ",
                                                        offset, ": ", status.message()));
      }
      if (static_cast<int64_t>(got.size()) < kHeaderBytes) {
        return Corrupt(path, offset, "the file is shorter than its size says (changed while read?)");
      }
      window_data = got.data();
      window_start = offset;
      window_end = offset + static_cast<int64_t>(got.size());
    }
    const char* header = window_data + (offset - window_start);
    if (!MaskedCrcMatches(header, 8, header + 8)) {
      return Corrupt(path, offset, absl::StrCat(
          "corrupt record (the CRC of its length does not match)",
          offset == 0 ? CompressionHint(header, window_end - window_start) : ""));
    }
    const uint64_t length = DecodeFixed64(header);
    const int64_t end = offset + kHeaderBytes + static_cast<int64_t>(length) + kFooterBytes;
    if (length > static_cast<uint64_t>(size) || end > size) {
      return Corrupt(path, offset, absl::StrCat("truncated file: the record claims ", length,
                                                " bytes, the file ends at ", size));
    }
    index.offsets.push_back(offset);
    index.lengths.push_back(static_cast<int64_t>(length));
    offset = end;
  }
  return index;
}

std::string CachePath(const std::string& cache_dir, const std::string& path) {
  return tensorflow::io::JoinPath(
      cache_dir, absl::StrCat(tensorflow::Hash64(path.data(), path.size()), ".tfrecord-index"));
}

// The layout of a cache file: magic, path, size, mtime, count, offsets, lengths.
std::string Serialize(const std::string& path, const TFRecordFileIndex& index) {
  std::string out = absl::StrCat(kCacheMagic, "\n", path, "\n");
  const int64_t head[3] = {index.size, index.mtime_nsec,
                           static_cast<int64_t>(index.offsets.size())};
  out.append(reinterpret_cast<const char*>(head), sizeof(head));
  out.append(reinterpret_cast<const char*>(index.offsets.data()),
             index.offsets.size() * sizeof(int64_t));
  out.append(reinterpret_cast<const char*>(index.lengths.data()),
             index.lengths.size() * sizeof(int64_t));
  return out;
}

// The cached index of `path` if the cache file holds the one for this size and mtime.
std::shared_ptr<const TFRecordFileIndex> ReadCached(Env* env, const std::string& cache_file,
                                                    const std::string& path, int64_t size,
                                                    int64_t mtime_nsec) {
  std::string data;
  if (!tensorflow::ReadFileToString(env, cache_file, &data).ok()) return nullptr;
  const std::string prefix = absl::StrCat(kCacheMagic, "\n", path, "\n");
  if (data.size() < prefix.size() + 24 || data.compare(0, prefix.size(), prefix) != 0) {
    return nullptr;
  }
  int64_t head[3];
  std::memcpy(head, data.data() + prefix.size(), sizeof(head));
  const int64_t n = head[2];
  if (head[0] != size || head[1] != mtime_nsec || n < 0 ||
      data.size() != prefix.size() + 24 + 16 * static_cast<size_t>(n)) {
    return nullptr;
  }
  auto index = std::make_shared<TFRecordFileIndex>();
  index->size = size;
  index->mtime_nsec = mtime_nsec;
  index->offsets.resize(n);
  index->lengths.resize(n);
  const char* arrays = data.data() + prefix.size() + 24;
  std::memcpy(index->offsets.data(), arrays, 8 * n);
  std::memcpy(index->lengths.data(), arrays + 8 * n, 8 * n);
  return index;
}

// A cache that cannot be written only costs the next process a rebuild.
void WriteCached(Env* env, const std::string& cache_dir, const std::string& cache_file,
                 const std::string& path, const TFRecordFileIndex& index) {
  if (!env->RecursivelyCreateDir(cache_dir).ok()) return;
  const std::string temporary = absl::StrCat(cache_file, ".tmp", env->NowMicros());
  if (tensorflow::WriteStringToFile(env, temporary, Serialize(path, index)).ok()) {
    if (!env->RenameFile(temporary, cache_file).ok()) env->DeleteFile(temporary).IgnoreError();
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<const TFRecordFileIndex>> IndexTFRecordFile(
    Env* env, const std::string& path, const std::string& cache_dir) {
  tensorflow::FileStatistics stat;
  absl::Status status = env->Stat(path, &stat);
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("TFRecord file ", path,
                                                    " cannot be read: ", status.message()));
  }
  if (stat.is_directory) {
    return absl::InvalidArgumentError(absl::StrCat("TFRecord file ", path, " is a directory"));
  }
  if (auto kept = KeptIndexes::Get().Find(path, stat.length, stat.mtime_nsec)) return kept;
  const std::string cache_file = cache_dir.empty() ? "" : CachePath(cache_dir, path);
  std::shared_ptr<const TFRecordFileIndex> index;
  if (!cache_file.empty()) index = ReadCached(env, cache_file, path, stat.length, stat.mtime_nsec);
  if (index == nullptr) {
    OpenFiles::Get().Forget(path);  // the file may have been replaced since it was opened
    auto file = OpenFiles::Get().Open(env, path);
    if (!file.ok()) return file.status();
    auto built = ReadHeaders(file->get(), path, stat.length);
    if (!built.ok()) return built.status();
    built->size = stat.length;
    built->mtime_nsec = stat.mtime_nsec;
    if (!cache_file.empty()) WriteCached(env, cache_dir, cache_file, path, *built);
    index = std::make_shared<const TFRecordFileIndex>(*std::move(built));
  }
  KeptIndexes::Get().Keep(path, index);
  return index;
}

absl::Status ReadTFRecordAt(Env* env, const std::string& path, int64_t offset, int64_t length,
                            tensorflow::tstring* out) {
  auto file = OpenFiles::Get().Open(env, path);
  if (!file.ok()) return file.status();
  const int64_t n = kHeaderBytes + length + kFooterBytes;
  out->resize_uninitialized(n);
  absl::string_view got;
  absl::Status status = (*file)->Read(offset, n, &got, out->mdata());
  if (static_cast<int64_t>(got.size()) < n) {
    return Corrupt(path, offset, absl::StrCat(
        "the record is cut short (the file changed since it was indexed?)",
        status.ok() || absl::IsOutOfRange(status) ? "" : absl::StrCat(": ", status.message())));
  }
  if (got.data() != out->data()) std::memmove(out->mdata(), got.data(), n);
  const char* record = out->data();
  if (!MaskedCrcMatches(record, 8, record + 8) ||
      DecodeFixed64(record) != static_cast<uint64_t>(length)) {
    return Corrupt(path, offset, "the record's header differs from the index (the file changed "
                                 "since it was indexed?)");
  }
  if (!MaskedCrcMatches(record + kHeaderBytes, length, record + kHeaderBytes + length)) {
    return Corrupt(path, offset, "corrupt record (the CRC of its data does not match)");
  }
  std::memmove(out->mdata(), record + kHeaderBytes, length);
  out->resize(length);
  return absl::OkStatus();
}

}  // namespace tensorflow_elastic
