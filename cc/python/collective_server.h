// Moves this process's TensorFlow server to a new membership without making
// TensorFlow instantiate every function again.
//
// Stock `enable_collective_ops(server_def)` on a running server
// (EagerContext::StoreCollectiveOpsServer) updates the server, then clears
// the eager kernel cache and replaces the process function library runtime:
// every function (the training step: forward, backward, optimizer) is
// optimized and instantiated again at its next call, 0.5-1 s for a 100 MB
// transformer and seconds for a ResNet-50. Only the collective executors need
// replacing (the server builds new ones for the new peers, and an aborted
// executor stays aborted). So the eager context gets, once, a collective
// executor manager that forwards to the server's current one; an update then
// replaces the server's executors behind it and keeps every instantiated
// function and cached kernel.
#ifndef TENSORFLOW_ELASTIC_CC_PYTHON_COLLECTIVE_SERVER_H_
#define TENSORFLOW_ELASTIC_CC_PYTHON_COLLECTIVE_SERVER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "tensorflow/c/eager/c_api.h"

namespace tensorflow_elastic {

// Makes `context`'s collectives go through a forwarding manager (after
// `enable_collective_ops` started the server). Idempotent.
absl::Status ForwardCollectives(TFE_Context* context);

// Updates the running server to `serialized_server_def` (a ServerDef) and
// points the forwarding manager at the server's new collective executors.
absl::Status UpdateCollectiveServer(TFE_Context* context,
                                    const std::string& serialized_server_def);

// TensorFlow's own TFE_AbortCollectiveOps and TFE_CollectiveOpsCheckPeerHealth
// are bound to Python with the interpreter lock held, so a probe of a silent
// peer (up to its timeout) stalled every Python thread of the worker: its
// heartbeats too. These do the same work; the binding calls them without the
// lock.

// Aborts every collective of `context` (pending and future ones, until the
// next update) with `reason`.
absl::Status AbortCollectives(TFE_Context* context, const absl::Status& reason);

// OK when `task`'s server answers within `timeout_ms` (InvalidArgument unless above 0:
// TensorFlow takes 0 for no bound); else why not. Call it from the thread that updates the
// server: the probe uses the executors of the server's current membership.
absl::Status CheckPeerHealth(TFE_Context* context, const std::string& task, int64_t timeout_ms);

}  // namespace tensorflow_elastic

#endif  // TENSORFLOW_ELASTIC_CC_PYTHON_COLLECTIVE_SERVER_H_
