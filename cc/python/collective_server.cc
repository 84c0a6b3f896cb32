#include "cc/python/collective_server.h"

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>

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
  // The server's executor for this step id, with one reference for the caller.
  CollectiveExecutor* Current();

  // The callback `done`, then the reference that kept `target` alive meanwhile.
  static StatusCallback Releasing(CollectiveExecutor* target, StatusCallback done) {
    return [target, done = std::move(done)](const absl::Status& s) {
      done(s);
      target->Unref();
    };
  }

  ForwardingMgr* const mgr_;
  const int64_t step_id_;
};

// The eager context's collective executor manager for the life of the process.
class ForwardingMgr : public CollectiveExecutorMgrInterface {
 public:
  // `target` (the server's manager, not owned) serves every call from now on.
  void Retarget(CollectiveExecutorMgrInterface* target) {
    std::lock_guard<std::mutex> lock(mu_);
    ReleaseTargetExecutorsLocked();
    target_ = target;
  }

  // Runs `update` (which replaces the server's manager) holding no executor of the old
  // manager, then serves every call from the server's new manager. Calls wait meanwhile.
  absl::Status Update(tensorflow::ServerInterface* server,
                      const std::function<absl::Status()>& update) {
    std::lock_guard<std::mutex> lock(mu_);
    ReleaseTargetExecutorsLocked();
    absl::Status status = update();
    target_ = server->worker_env()->collective_executor_mgr.get();
    return status;
  }

  CollectiveExecutor* TargetExecutor(int64_t step_id) {
    std::lock_guard<std::mutex> lock(mu_);
    CollectiveExecutor*& executor = target_executors_[step_id];
    if (executor == nullptr) executor = target_->FindOrCreate(step_id);
    executor->Ref();
    return executor;
  }

  CollectiveExecutor* FindOrCreate(int64_t step_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    ForwardingExecutor*& executor = executors_[step_id];
    if (executor == nullptr) executor = new ForwardingExecutor(this, step_id);
    executor->Ref();  // the caller's
    return executor;
  }

  void Cleanup(int64_t step_id) override {
    CollectiveExecutorMgrInterface* target;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto forwarding = executors_.find(step_id);
      if (forwarding != executors_.end()) {
        forwarding->second->Unref();
        executors_.erase(forwarding);
      }
      auto held = target_executors_.find(step_id);
      if (held != target_executors_.end()) {
        held->second->Unref();
        target_executors_.erase(held);
      }
      target = target_;
    }
    if (target != nullptr) target->Cleanup(step_id);
  }

  void CleanupAll() override {
    CollectiveExecutorMgrInterface* target;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& entry : executors_) entry.second->Unref();
      executors_.clear();
      ReleaseTargetExecutorsLocked();
      target = target_;
    }
    if (target != nullptr) target->CleanupAll();
  }

  tensorflow::ParamResolverInterface* GetParamResolver() const override {
    return Target()->GetParamResolver();
  }
  tensorflow::DeviceResolverInterface* GetDeviceResolver() const override {
    return Target()->GetDeviceResolver();
  }
  tensorflow::NcclCommunicatorInterface* GetNcclCommunicator() const override {
    return Target()->GetNcclCommunicator();
  }
  void GetStepSequenceAsync(const tensorflow::GetStepSequenceRequest* request,
                            tensorflow::GetStepSequenceResponse* response,
                            const StatusCallback& done) override {
    Target()->GetStepSequenceAsync(request, response, done);
  }
  void RefreshStepIdSequenceAsync(int64_t graph_key, const StatusCallback& done) override {
    Target()->RefreshStepIdSequenceAsync(graph_key, done);
  }
  int64_t NextStepId(int64_t graph_key) override { return Target()->NextStepId(graph_key); }
  void RetireStepId(int64_t graph_key, int64_t step_id) override {
    Target()->RetireStepId(graph_key, step_id);
  }

 private:
  CollectiveExecutorMgrInterface* Target() const {
    std::lock_guard<std::mutex> lock(mu_);
    return target_;
  }

  void ReleaseTargetExecutorsLocked() {
    for (auto& entry : target_executors_) entry.second->Unref();
    target_executors_.clear();
  }

  mutable std::mutex mu_;
  CollectiveExecutorMgrInterface* target_ = nullptr;
  std::map<int64_t, ForwardingExecutor*> executors_;     // one reference each
  std::map<int64_t, CollectiveExecutor*> target_executors_;  // one reference each
};

ForwardingExecutor::ForwardingExecutor(ForwardingMgr* mgr, int64_t step_id)
    : CollectiveExecutor(mgr), mgr_(mgr), step_id_(step_id) {}

CollectiveExecutor* ForwardingExecutor::Current() { return mgr_->TargetExecutor(step_id_); }

void ForwardingExecutor::StartAbort(const absl::Status& s) {
  CollectiveExecutor* target = Current();
  target->StartAbort(s);
  target->Unref();
}

void ForwardingExecutor::ExecuteAsync(tensorflow::OpKernelContext* ctx,
                                      const CollectiveParams* col_params,
                                      const std::string& exec_key, StatusCallback done) {
  CollectiveExecutor* target = Current();
  target->ExecuteAsync(ctx, col_params, exec_key, Releasing(target, std::move(done)));
}

void ForwardingExecutor::CompleteParamsAsync(const DeviceAttributes& device,
                                             CollectiveParams* cp,
                                             CancellationManager* cancel_mgr,
                                             StatusCallback done) {
  CollectiveExecutor* target = Current();
  target->CompleteParamsAsync(device, cp, cancel_mgr, Releasing(target, std::move(done)));
}

void ForwardingExecutor::CompleteGroupAsync(const DeviceAttributes& device,
                                            CollGroupParams* group_params,
                                            CancellationManager* cancel_mgr,
                                            StatusCallback done) {
  CollectiveExecutor* target = Current();
  target->CompleteGroupAsync(device, group_params, cancel_mgr,
                             Releasing(target, std::move(done)));
}

absl::Status ForwardingExecutor::LookupGroup(int32_t group_key, CollGroupParams* group) {
  CollectiveExecutor* target = Current();
  absl::Status status = target->LookupGroup(group_key, group);
  target->Unref();
  return status;
}

void ForwardingExecutor::RunClosure(std::function<void()> closure) {
  CollectiveExecutor* target = Current();
  target->RunClosure(std::move(closure));
  target->Unref();
}

tensorflow::CollectiveRemoteAccess* ForwardingExecutor::remote_access() {
  // Valid until the next update: the manager holds the executor until then.
  CollectiveExecutor* target = Current();
  tensorflow::CollectiveRemoteAccess* access = target->remote_access();
  target->Unref();
  return access;
}

void ForwardingExecutor::WaitForDependencies(const CollectiveParams& col_params) {
  CollectiveExecutor* target = Current();
  target->WaitForDependencies(col_params);
  target->Unref();
}

void ForwardingExecutor::UnblockDependencies(const CollectiveParams& col_params) {
  CollectiveExecutor* target = Current();
  target->UnblockDependencies(col_params);
  target->Unref();
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
  // The update destroys the server's collective executor manager: nothing may hold its
  // executors then.
  return Forwarder()->Update(server, [&] { return server->UpdateServerDef(server_def); });
}

}  // namespace tensorflow_elastic
