// The library's Python binding (pybind11): the calls a commit makes at every
// step (VariableSnapshot), with no op dispatch and no tensor crossing into
// Python, and the update of the collective server at a membership change.
//
// It is built into the op library (_ops.so) rather than into a module of its
// own: the binding must reach the snapshots the op's kernel registered, and
// TensorFlow loads the library with RTLD_LOCAL, so a separate module would
// have to find _ops.so again (link to it by path, or dlopen and dlsym it).
// TensorFlow's collective abort and peer probe are bound here too, to run
// without the interpreter lock (see collective_server.h).
// Python loads this module from the library's file after TensorFlow has
// loaded it (tensorflow_elastic/ops/variable_snapshot.py): the dynamic loader
// hands back the library already loaded, with its snapshot registry.
#include "pybind11/pybind11.h"  // first: Python.h must precede the system headers

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cc/kernels/variable_snapshot.h"
#include "cc/python/collective_server.h"

namespace tensorflow_elastic {
namespace {

namespace py = pybind11;

// Raised in Python as tensorflow_elastic.ops.variable_snapshot.SnapshotError.
class SnapshotError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void Check(const absl::Status& status) {
  if (!status.ok()) throw SnapshotError(std::string(status.message()));
}

py::tuple ToTuple(const std::vector<double>& values) {
  py::tuple tuple(values.size());
  for (size_t i = 0; i < values.size(); ++i) tuple[i] = py::float_(values[i]);
  return tuple;
}

// One snapshot the op registered; the registry lets go of it with this object.
class SnapshotHandle {
 public:
  explicit SnapshotHandle(int64_t id) : id_(id), snapshot_(FindSnapshot(id)) {
    if (snapshot_ == nullptr) {
      throw SnapshotError(absl::StrCat("no variable snapshot with id ", id));
    }
  }
  ~SnapshotHandle() { ReleaseSnapshot(id_); }
  SnapshotHandle(const SnapshotHandle&) = delete;
  SnapshotHandle& operator=(const SnapshotHandle&) = delete;

  int64_t id() const { return id_; }

  // Takes the snapshot; with `read_index` >= 0 also returns the held value of
  // that variable (host float64, `count` elements), saving a second call.
  py::object Take(int read_index, size_t count) {
    std::vector<double> read(read_index >= 0 ? count : 0);
    {
      // Take() may wait for the variables' locks and frees the buffers the
      // previous take held once updates have replaced them.
      py::gil_scoped_release release;
      Check(snapshot_->Take());
      if (read_index >= 0) {
        Check(snapshot_->ReadFloat64(read_index, /*held=*/true, read.data(), count));
      }
    }
    if (read_index < 0) return py::none();
    return ToTuple(read);
  }

  // Gives every variable but variable `keep` (-1: none) its held value.
  void Restore(int keep) {
    py::gil_scoped_release release;  // waits for the variables' locks
    Check(snapshot_->Restore(keep));
  }

  // The current value of variable `index`, a host float64 variable.
  py::tuple ReadFloat64(int index, size_t count) const {
    std::vector<double> read(count);
    {
      py::gil_scoped_release release;  // waits for the variable's lock
      Check(snapshot_->ReadFloat64(index, /*held=*/false, read.data(), count));
    }
    return ToTuple(read);
  }

 private:
  const int64_t id_;
  const std::shared_ptr<VariableSnapshot> snapshot_;
};

// The TFE_Context* of `context_handle` (tensorflow's `context.context()._handle`).
TFE_Context* EagerContext(const py::capsule& context_handle) {
  return static_cast<TFE_Context*>(context_handle.get_pointer());
}

void CheckServer(const absl::Status& status) {
  if (!status.ok()) throw std::runtime_error(std::string(status.message()));
}

void DefineModule(py::module_& m) {
  m.doc() = "Variable snapshots (of the op ElasticVariableSnapshot) and collective server updates.";

  // The exception class is the Python API's, so callers catch one type.
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<py::object> error_type;
  error_type.call_once_and_store_result([] {
    return py::module_::import("tensorflow_elastic.ops.variable_snapshot").attr("SnapshotError");
  });
  py::register_local_exception_translator([](std::exception_ptr thrown) {
    try {
      if (thrown) std::rethrow_exception(thrown);
    } catch (const SnapshotError& e) {
      py::set_error(error_type.get_stored(), e.what());
    }
  });

  py::class_<SnapshotHandle>(m, "Snapshot")
      .def(py::init<int64_t>(), py::arg("snapshot_id"),
           "Holds the snapshot with this id (from the op); releases it when collected.")
      .def_property_readonly("id", &SnapshotHandle::id)
      .def("take", &SnapshotHandle::Take, py::arg("read_index") = -1, py::arg("count") = 0,
           "Holds every variable's current value; returns variable `read_index`'s held "
           "value, or None when it is negative.")
      .def("restore", &SnapshotHandle::Restore, py::arg("keep") = -1,
           "Gives every variable but variable `keep` (-1: none) the value the last take() "
           "holds, sharing its buffer (no copy).")
      .def("read_float64", &SnapshotHandle::ReadFloat64, py::arg("index"), py::arg("count"),
           "The current value of a host float64 variable of `count` elements.");

  m.def(
      "forward_collectives",
      [](const py::capsule& context_handle) {
        TFE_Context* context = EagerContext(context_handle);
        py::gil_scoped_release release;
        CheckServer(ForwardCollectives(context));
      },
      py::arg("context_handle"),
      "Routes the eager context's collectives through a manager that server updates keep.");
  m.def(
      "update_collective_server",
      [](const py::capsule& context_handle, const py::bytes& server_def) {
        TFE_Context* context = EagerContext(context_handle);
        std::string serialized = server_def;
        py::gil_scoped_release release;
        CheckServer(UpdateCollectiveServer(context, serialized));
      },
      py::arg("context_handle"), py::arg("server_def"),
      "Moves the running server to a serialized ServerDef; functions stay instantiated.");
  m.def(
      "abort_collectives",
      [](const py::capsule& context_handle, const std::string& reason) {
        TFE_Context* context = EagerContext(context_handle);
        py::gil_scoped_release release;
        CheckServer(AbortCollectives(context, absl::UnavailableError(reason)));
      },
      py::arg("context_handle"), py::arg("reason"),
      "Ends every pending collective with UnavailableError(reason), without holding the "
      "interpreter lock.");
  m.def(
      "check_peer_health",
      [](const py::capsule& context_handle, const std::string& task, int64_t timeout_ms) {
        TFE_Context* context = EagerContext(context_handle);
        py::gil_scoped_release release;
        CheckServer(CheckPeerHealth(context, task, timeout_ms));
      },
      py::arg("context_handle"), py::arg("task"), py::arg("timeout_ms"),
      "Returns when `task`'s server answers; raises RuntimeError when it does not within "
      "`timeout_ms`. Other Python threads run meanwhile.");
}

}  // namespace
}  // namespace tensorflow_elastic

PYBIND11_MODULE(_binding, m) { tensorflow_elastic::DefineModule(m); }
