// The per-commit calls of a VariableSnapshot as plain C functions, for ctypes:
// no op dispatch, no tensor crosses into Python. Each returns 0 on success,
// or -1 with the reason in TfeVariableSnapshotLastError().
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cc/kernels/variable_snapshot.h"

namespace {

thread_local std::string last_error;

int Report(const absl::Status& status) {
  if (status.ok()) return 0;
  last_error = std::string(status.message());
  return -1;
}

std::shared_ptr<tensorflow_elastic::VariableSnapshot> Find(int64_t id) {
  auto snapshot = tensorflow_elastic::FindSnapshot(id);
  if (snapshot == nullptr) last_error = absl::StrCat("no variable snapshot with id ", id);
  return snapshot;
}

}  // namespace

extern "C" {

// Takes the snapshot; with `read_index` >= 0 also copies the held value of
// that (host float64) variable into `out`, saving a second call per commit.
int TfeVariableSnapshotTake(int64_t id, int read_index, double* out, int64_t count) {
  auto snapshot = Find(id);
  if (snapshot == nullptr) return -1;
  absl::Status status = snapshot->Take();
  if (status.ok() && read_index >= 0) {
    status = snapshot->ReadFloat64(read_index, /*held=*/true, out, count);
  }
  return Report(status);
}

// The current value of variable `index`, a host float64 variable.
int TfeVariableSnapshotReadFloat64(int64_t id, int index, double* out, int64_t count) {
  auto snapshot = Find(id);
  return snapshot == nullptr
             ? -1
             : Report(snapshot->ReadFloat64(index, /*held=*/false, out, count));
}

int TfeVariableSnapshotRelease(int64_t id) {
  if (tensorflow_elastic::ReleaseSnapshot(id)) return 0;
  last_error = absl::StrCat("no variable snapshot with id ", id);
  return -1;
}

const char* TfeVariableSnapshotLastError() { return last_error.c_str(); }

}  // extern "C"
