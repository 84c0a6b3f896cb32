#include "cc/python/collective_server.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "tensorflow/c/eager/tfe_context_internal.h"
#include "tensorflow/core/common_runtime/eager/context.h"
#include "tensorflow/core/distributed_runtime/server_lib.h"
#include "tensorflow/core/distributed_runtime/worker_env.h"
#include "tensorflow/core/framework/collective.h"
#include "tensorflow/core/protobuf/tensorflow_server.pb.h"

namespace tensorflow_elastic {
namespace {

using tensorflow::CancellationManager;
using tensorflow::CollectiveExecutor;
using tensorflow::CollectiveExecutorMgrInterface;
using tensorflow::CollectiveParams;
using tensorflow::CollGroupParams;
using tensorflow::DeviceAttributes;
using tensorflow::StatusCallback;

class ForwardingMgr;

// An update first waits this long for the calls in flight to end (calls aborted just before
// it end within milliseconds): TensorFlow's update frees the worker cache that their remote
// calls still use as they end, which no manager kept alive would protect.
constexpr std::chrono::seconds kDrainTimeout(3);

// A server manager the forwarder serves calls from, or served them from before an update.
// A retired one stays alive (and owned here) until no call uses it any more: callbacks of
// calls it was running when it was aborted may still run in it, and pointers to its resolvers
// handed out meanwhile stay valid until the update after the one that retired it.
struct Served {
  explicit Served(CollectiveExecutorMgrInterface* mgr) : mgr(mgr) {}

  CollectiveExecutorMgrInterface* const mgr;
  std::unique_ptr<CollectiveExecutorMgrInterface> owned;  // set when retired
  std::map<int64_t, CollectiveExecutor*> executors;      // one reference each
  int calls = 0;                                          // calls using it now
};

// A call's hold on a served manager and its executor for the call's step id, taken under the
// forwarder's lock: both stay alive until the hold is released (ForwardingMgr::Release).
struct Hold {
  Served* served;
  CollectiveExecutor* executor;  // one reference, for the call; none for a manager's call
};

// The executor the eager context's kernels hold for a step id: every call
// goes to the current server executor of that step id.
class ForwardingExecutor : public CollectiveExecutor {
 public:
  ForwardingExecutor(ForwardingMgr* mgr, int64_t step_id);

  void StartAbort(const absl::Status& s) override;
  void ExecuteAsync(tensorflow::OpKernelContext* ctx, const CollectiveParams* col_params,
                    const std::string& exec_key, StatusCallback done) override;
  void CompleteParamsAsync(const DeviceAttributes& device, CollectiveParams* cp,
                           CancellationManager* cancel_mgr, StatusCallback done) override;
  void CompleteGroupAsync(const DeviceAttributes& device, CollGroupParams* group_params,
                          CancellationManager* cancel_mgr, StatusCallback done) override;
  absl::Status LookupGroup(int32_t group_key, CollGroupParams* group) override;
  void RunClosure(std::function<void()> closure) override;
  tensorflow::CollectiveRemoteAccess* remote_access() override;
  void WaitForDependencies(const CollectiveParams& col_params) override;
  void UnblockDependencies(const CollectiveParams& col_params) override;

 private:
  // Runs `call` on the server's current executor for this step id, holding it meanwhile.
  template <typename Result>
  Result Synchronously(const std::function<Result(CollectiveExecutor*)>& call,
                       bool during_update = false);

  ForwardingMgr* const mgr_;
  const int64_t step_id_;
};

// Keeps the server's collective executor manager slot filled, for the moment of an update
// only: the update replaces (destroys) it, and the manager it stood for lives on, retired.
class StandIn : public CollectiveExecutorMgrInterface {
 public:
  explicit StandIn(CollectiveExecutorMgrInterface* retiring) : retiring_(retiring) {}

  CollectiveExecutor* FindOrCreate(int64_t step_id) override {
    return retiring_->FindOrCreate(step_id);
  }
  void Cleanup(int64_t step_id) override { retiring_->Cleanup(step_id); }
  void CleanupAll() override { retiring_->CleanupAll(); }
  tensorflow::ParamResolverInterface* GetParamResolver() const override {
    return retiring_->GetParamResolver();
  }
  tensorflow::DeviceResolverInterface* GetDeviceResolver() const override {
    return retiring_->GetDeviceResolver();
  }
  tensorflow::NcclCommunicatorInterface* GetNcclCommunicator() const override {
    return retiring_->GetNcclCommunicator();
  }
  void GetStepSequenceAsync(const tensorflow::GetStepSequenceRequest* request,
                            tensorflow::GetStepSequenceResponse* response,
                            const StatusCallback& done) override {
    retiring_->GetStepSequenceAsync(request, response, done);
  }
  void RefreshStepIdSequenceAsync(int64_t graph_key, const StatusCallback& done) override {
    retiring_->RefreshStepIdSequenceAsync(graph_key, done);
  }
  int64_t NextStepId(int64_t graph_key) override { return retiring_->NextStepId(graph_key); }
  void RetireStepId(int64_t graph_key, int64_t step_id) override {
    retiring_->RetireStepId(graph_key, step_id);
  }

 private:
  CollectiveExecutorMgrInterface* const retiring_;
};

// The eager context's collective executor manager for the life of the process.
class ForwardingMgr : public CollectiveExecutorMgrInterface {
 public:
  // `target` (the server's manager, not owned) serves every call from now on. The manager
  // served so far was replaced by TensorFlow itself (not owned here): only the references
  // held on its executors are let go, once its calls are done.
  void Retarget(CollectiveExecutorMgrInterface* target) {
    std::vector<std::unique_ptr<Served>> drained;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (current_ != nullptr) retired_.push_back(std::move(current_));
      current_ = std::make_unique<Served>(target);
      drained = TakeDrainedLocked();
    }
    Destroy(std::move(drained));
  }

  // Runs `update` (which replaces the server's manager), then serves every call from the
  // server's new manager; calls wait meanwhile. The old manager is kept (retired) until the
  // calls that use it are done: it is destroyed by a later update, never in a callback.
  absl::Status Update(tensorflow::ServerInterface* server,
                      const std::function<absl::Status()>& update) {
    std::vector<std::unique_ptr<Served>> drained;
    absl::Status status;
    {
      std::unique_lock<std::mutex> lock(mu_);
      updating_ = true;  // new calls wait
      changed_.wait_for(lock, kDrainTimeout,
                        [this] { return current_ == nullptr || current_->calls == 0; });
      std::unique_ptr<CollectiveExecutorMgrInterface>& slot =
          server->worker_env()->collective_executor_mgr;
      std::unique_ptr<CollectiveExecutorMgrInterface> old;
      if (current_ != nullptr && slot.get() == current_->mgr) {
        old = std::move(slot);
        slot = std::make_unique<StandIn>(old.get());
      }
      CollectiveExecutorMgrInterface* stand_in = old != nullptr ? slot.get() : nullptr;
      status = update();
      if (stand_in != nullptr && slot.get() == stand_in) {
        slot = std::move(old);  // the update failed before it replaced the manager
      } else {
        drained = TakeDrainedLocked();  // first: the manager retired now keeps its grace
        if (current_ != nullptr) {
          current_->owned = std::move(old);
          retired_.push_back(std::move(current_));
        }
        current_ = std::make_unique<Served>(slot.get());
      }
      updating_ = false;
    }
    changed_.notify_all();
    Destroy(std::move(drained));
    return status;
  }

  // The current manager's executor for `step_id`, held for one call. A call waits while an
  // update is under way, but an abort (`during_update`) goes to the manager being replaced:
  // it ends the calls the update waits for.
  Hold Acquire(int64_t step_id, bool during_update = false) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this, during_update] { return during_update || !updating_; });
    CollectiveExecutor*& executor = current_->executors[step_id];
    if (executor == nullptr) executor = current_->mgr->FindOrCreate(step_id);
    executor->Ref();
    ++current_->calls;
    return Hold{current_.get(), executor};
  }

  void Release(Hold hold) {
    if (hold.executor != nullptr) hold.executor->Unref();  // its manager (held) keeps its own
    {
      std::lock_guard<std::mutex> lock(mu_);
      --hold.served->calls;
    }
    changed_.notify_all();
  }

  // The callback `done` of an asynchronous call, carrying the call's hold: the hold is
  // released with the last copy of the callback, i.e. once TensorFlow's code that ran the call
  // is done with it (it lets go of the callback after its own cleanup, e.g. of a remote call),
  // not when the callback runs.
  StatusCallback Releasing(Hold hold, StatusCallback done) {
    std::shared_ptr<void> lease(nullptr, [this, hold](void*) { Release(hold); });
    return [lease = std::move(lease), done = std::move(done)](const absl::Status& s) {
      done(s);
    };
  }

  CollectiveExecutor* FindOrCreate(int64_t step_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    ForwardingExecutor*& executor = executors_[step_id];
    if (executor == nullptr) executor = new ForwardingExecutor(this, step_id);
    executor->Ref();  // the caller's
    return executor;
  }

  // Under the lock, like every call into the current manager: an update cannot destroy it
  // meanwhile. Its Cleanup only drops its own references (it calls nothing of this one).
  void Cleanup(int64_t step_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto forwarding = executors_.find(step_id);
    if (forwarding != executors_.end()) {
      forwarding->second->Unref();
      executors_.erase(forwarding);
    }
    if (current_ == nullptr) return;
    auto held = current_->executors.find(step_id);
    if (held != current_->executors.end()) {
      held->second->Unref();
      current_->executors.erase(held);
    }
    current_->mgr->Cleanup(step_id);
  }

  void CleanupAll() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& entry : executors_) entry.second->Unref();
    executors_.clear();
    if (current_ == nullptr) return;
    ReleaseExecutors(*current_);
    current_->mgr->CleanupAll();
  }

  // Pointers into the current manager, taken under the lock; valid until the update after
  // the next one (see Served).
  tensorflow::ParamResolverInterface* GetParamResolver() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return current_->mgr->GetParamResolver();
  }
  tensorflow::DeviceResolverInterface* GetDeviceResolver() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return current_->mgr->GetDeviceResolver();
  }
  tensorflow::NcclCommunicatorInterface* GetNcclCommunicator() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return current_->mgr->GetNcclCommunicator();
  }
  void GetStepSequenceAsync(const tensorflow::GetStepSequenceRequest* request,
                            tensorflow::GetStepSequenceResponse* response,
                            const StatusCallback& done) override {
    Hold hold = Use();
    hold.served->mgr->GetStepSequenceAsync(request, response, Releasing(hold, done));
  }
  void RefreshStepIdSequenceAsync(int64_t graph_key, const StatusCallback& done) override {
    Hold hold = Use();
    hold.served->mgr->RefreshStepIdSequenceAsync(graph_key, Releasing(hold, done));
  }
  int64_t NextStepId(int64_t graph_key) override {
    std::lock_guard<std::mutex> lock(mu_);
    return current_->mgr->NextStepId(graph_key);
  }
  void RetireStepId(int64_t graph_key, int64_t step_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    current_->mgr->RetireStepId(graph_key, step_id);
  }

 private:
  // The current manager, held for one call of its own.
  Hold Use() {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this] { return !updating_; });
    ++current_->calls;
    return Hold{current_.get(), nullptr};
  }

  static void ReleaseExecutors(Served& served) {
    for (auto& entry : served.executors) entry.second->Unref();
    served.executors.clear();
  }

  // The retired managers no call uses any more, taken out of the list to destroy.
  std::vector<std::unique_ptr<Served>> TakeDrainedLocked() {
    std::vector<std::unique_ptr<Served>> drained;
    for (auto it = retired_.begin(); it != retired_.end();) {
      if ((*it)->calls == 0) {
        drained.push_back(std::move(*it));
        it = retired_.erase(it);
      } else {
        ++it;
      }
    }
    return drained;
  }

  // Outside the lock: a manager's destructor joins its threads, whose callbacks may call in.
  static void Destroy(std::vector<std::unique_ptr<Served>> drained) {
    for (auto& served : drained) {
      ReleaseExecutors(*served);
      served->owned.reset();
    }
  }

  mutable std::mutex mu_;
  std::condition_variable changed_;  // a call ended, or an update did
  bool updating_ = false;
  std::unique_ptr<Served> current_;
  std::vector<std::unique_ptr<Served>> retired_;
  std::map<int64_t, ForwardingExecutor*> executors_;  // one reference each
};

ForwardingExecutor::ForwardingExecutor(ForwardingMgr* mgr, int64_t step_id)
    : CollectiveExecutor(mgr), mgr_(mgr), step_id_(step_id) {}

template <typename Result>
Result ForwardingExecutor::Synchronously(const std::function<Result(CollectiveExecutor*)>& call,
                                         bool during_update) {
  Hold hold = mgr_->Acquire(step_id_, during_update);
  if constexpr (std::is_void_v<Result>) {
    call(hold.executor);
    mgr_->Release(hold);
  } else {
    Result result = call(hold.executor);
    mgr_->Release(hold);
    return result;
  }
}

void ForwardingExecutor::StartAbort(const absl::Status& s) {
  Synchronously<void>([&](CollectiveExecutor* target) { target->StartAbort(s); },
                      /*during_update=*/true);
}

void ForwardingExecutor::ExecuteAsync(tensorflow::OpKernelContext* ctx,
                                      const CollectiveParams* col_params,
                                      const std::string& exec_key, StatusCallback done) {
  Hold hold = mgr_->Acquire(step_id_);
  hold.executor->ExecuteAsync(ctx, col_params, exec_key,
                              mgr_->Releasing(hold, std::move(done)));
}

void ForwardingExecutor::CompleteParamsAsync(const DeviceAttributes& device,
                                             CollectiveParams* cp,
                                             CancellationManager* cancel_mgr,
                                             StatusCallback done) {
  Hold hold = mgr_->Acquire(step_id_);
  hold.executor->CompleteParamsAsync(device, cp, cancel_mgr,
                                     mgr_->Releasing(hold, std::move(done)));
}

void ForwardingExecutor::CompleteGroupAsync(const DeviceAttributes& device,
                                            CollGroupParams* group_params,
                                            CancellationManager* cancel_mgr,
                                            StatusCallback done) {
  Hold hold = mgr_->Acquire(step_id_);
  hold.executor->CompleteGroupAsync(device, group_params, cancel_mgr,
                                    mgr_->Releasing(hold, std::move(done)));
}

absl::Status ForwardingExecutor::LookupGroup(int32_t group_key, CollGroupParams* group) {
  return Synchronously<absl::Status>(
      [&](CollectiveExecutor* target) { return target->LookupGroup(group_key, group); });
}

void ForwardingExecutor::RunClosure(std::function<void()> closure) {
  Synchronously<void>(
      [&](CollectiveExecutor* target) { target->RunClosure(std::move(closure)); });
}

tensorflow::CollectiveRemoteAccess* ForwardingExecutor::remote_access() {
  // Valid until the update after the next one: the retired manager keeps its executors.
  return Synchronously<tensorflow::CollectiveRemoteAccess*>(
      [](CollectiveExecutor* target) { return target->remote_access(); });
}

void ForwardingExecutor::WaitForDependencies(const CollectiveParams& col_params) {
  Synchronously<void>([&](CollectiveExecutor* target) { target->WaitForDependencies(col_params); });
}

void ForwardingExecutor::UnblockDependencies(const CollectiveParams& col_params) {
  Synchronously<void>([&](CollectiveExecutor* target) { target->UnblockDependencies(col_params); });
}

// One per process, never destroyed: kernels and the eager context point at it.
ForwardingMgr* Forwarder() {
  static ForwardingMgr* const forwarder = new ForwardingMgr();
  return forwarder;
}

absl::Status Server(TFE_Context* context, tensorflow::EagerContext** eager,
                    tensorflow::ServerInterface** server) {
  if (context == nullptr) return absl::InvalidArgumentError("no eager context");
  *eager = tensorflow::ContextFromInterface(tensorflow::unwrap(context));
  *server = (*eager)->GetServer();
  if (*server == nullptr || (*server)->worker_env()->collective_executor_mgr == nullptr) {
    return absl::FailedPreconditionError(
        "TensorFlow's server is not running: call enable_collective_ops first");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AbortCollectives(TFE_Context* context, const absl::Status& reason) {
  if (context == nullptr) return absl::InvalidArgumentError("no eager context");
  tensorflow::ContextFromInterface(tensorflow::unwrap(context))
      ->GetCollectiveExecutorHandle()
      ->get()
      ->StartAbort(reason);
  return absl::OkStatus();
}

absl::Status CheckPeerHealth(TFE_Context* context, const std::string& task, int64_t timeout_ms) {
  // TensorFlow reads a timeout of 0 as no bound: the wait below would have none either.
  if (timeout_ms <= 0) {
    return absl::InvalidArgumentError("timeout_ms=" + std::to_string(timeout_ms) +
                                      ": a peer's probe needs a bound above 0 milliseconds");
  }
  if (context == nullptr) return absl::InvalidArgumentError("no eager context");
  std::unique_ptr<CollectiveExecutor::Handle> handle =
      tensorflow::ContextFromInterface(tensorflow::unwrap(context))->GetCollectiveExecutorHandle();
  tensorflow::CollectiveRemoteAccess* remote = handle->get()->remote_access();
  if (remote == nullptr) {
    return absl::FailedPreconditionError(
        "TensorFlow's server is not running: no peer can be probed");
  }
  std::mutex mu;
  std::condition_variable answered;
  bool done = false;
  absl::Status result;
  remote->CheckPeerHealth(task, timeout_ms, [&](const absl::Status& status) {
    std::lock_guard<std::mutex> lock(mu);
    result = status;
    done = true;
    answered.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu);
  answered.wait(lock, [&] { return done; });
  return result;
}

absl::Status ForwardCollectives(TFE_Context* context) {
  tensorflow::EagerContext* eager;
  tensorflow::ServerInterface* server;
  absl::Status status = Server(context, &eager, &server);
  if (!status.ok()) return status;
  ForwardingMgr* forwarder = Forwarder();
  if (eager->collective_executor_mgr() == forwarder) return absl::OkStatus();
  forwarder->Retarget(server->worker_env()->collective_executor_mgr.get());
  eager->SetCollectiveExecutorMgr(forwarder);
  // Kernels cached so far hold the server's executors directly.
  eager->ClearCachesAndThreadExecutors();
  return absl::OkStatus();
}

absl::Status UpdateCollectiveServer(TFE_Context* context,
                                    const std::string& serialized_server_def) {
  tensorflow::ServerDef server_def;
  if (!server_def.ParseFromString(serialized_server_def)) {
    return absl::InvalidArgumentError("not a serialized tensorflow.ServerDef");
  }
  absl::Status status = ForwardCollectives(context);
  if (!status.ok()) return status;
  tensorflow::EagerContext* eager;
  tensorflow::ServerInterface* server;
  status = Server(context, &eager, &server);
  if (!status.ok()) return status;
  // The update replaces the server's collective executor manager; the forwarder keeps the old
  // one until its calls are done.
  return Forwarder()->Update(server, [&] { return server->UpdateServerDef(server_def); });
}

}  // namespace tensorflow_elastic
