// A TensorFlow gRPC server that listens on its own task's address only.
//
// Stock TensorFlow's GrpcServer listens on every interface ("0.0.0.0:PORT") whatever
// address the cluster gives the task, and its services take no credentials: anyone who
// reaches the port on any of the host's networks can run collectives with the worker.
// This server is the same GrpcServer; only its listening address becomes the task's own
// host. A ServerDef asks for it with protocol kBoundProtocol.

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "grpcpp/server_builder.h"
#include "tensorflow/core/distributed_runtime/rpc/grpc_server_lib.h"
#include "tensorflow/core/distributed_runtime/server_lib.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/protobuf/tensorflow_server.pb.h"

namespace grpc {
namespace testing {

// The one class ServerBuilder lets read its listening ports (it names it a friend);
// ServerBuilder offers no other way to change an address already added.
class ServerBuilderPluginTest {
 public:
  static void Rebind(ServerBuilder* builder, const std::string& from, const std::string& to) {
    for (auto& port : builder->ports_) {
      if (port.addr == from) port.addr = to;
    }
  }
};

}  // namespace testing
}  // namespace grpc

namespace tensorflow_elastic {
namespace {

constexpr char kBoundProtocol[] = "grpc+tfe_bound";

// HOST of this task's HOST:PORT in the cluster ("" when the cluster does not name it).
std::string OwnHost(const tensorflow::ServerDef& server_def) {
  for (const auto& job : server_def.cluster().job()) {
    if (job.name() != server_def.job_name()) continue;
    auto task = job.tasks().find(server_def.task_index());
    if (task == job.tasks().end()) return "";
    const std::string& address = task->second;
    auto colon = address.find_last_of(':');
    return colon == std::string::npos ? "" : address.substr(0, colon);
  }
  return "";
}

class BoundGrpcServer : public tensorflow::GrpcServer {
 public:
  static absl::Status Create(const tensorflow::ServerDef& server_def,
                             tensorflow::DeviceMgr* local_device_mgr,
                             std::unique_ptr<tensorflow::ServerInterface>* out_server) {
    std::unique_ptr<BoundGrpcServer> server(
        new BoundGrpcServer(server_def, tensorflow::Env::Default(), OwnHost(server_def)));
    tensorflow::GrpcServerOptions options;
    options.local_device_mgr = local_device_mgr;
    absl::Status status = server->Init(options);
    if (!status.ok()) return status;
    *out_server = std::move(server);
    return absl::OkStatus();
  }

 protected:
  void MaybeMutateBuilder(::grpc::ServerBuilder* builder, int requested_port) override {
    if (host_.empty()) return;
    const std::string port = std::to_string(requested_port);
    ::grpc::testing::ServerBuilderPluginTest::Rebind(builder, "0.0.0.0:" + port,
                                                     host_ + ":" + port);
  }

 private:
  BoundGrpcServer(const tensorflow::ServerDef& server_def, tensorflow::Env* env,
                  std::string host)
      : GrpcServer(server_def, env), host_(std::move(host)) {}

  const std::string host_;
};

class BoundGrpcServerFactory : public tensorflow::ServerFactory {
 public:
  bool AcceptsOptions(const tensorflow::ServerDef& server_def) override {
    return server_def.protocol() == kBoundProtocol;
  }

  absl::Status NewServer(const tensorflow::ServerDef& server_def, const Options& options,
                         std::unique_ptr<tensorflow::ServerInterface>* out_server) override {
    return BoundGrpcServer::Create(server_def, options.local_device_mgr, out_server);
  }
};

class Registrar {
 public:
  Registrar() {
    tensorflow::ServerFactory::Register("ELASTIC_BOUND_GRPC_SERVER",
                                        new BoundGrpcServerFactory());
  }
};

const Registrar registrar;

}  // namespace
}  // namespace tensorflow_elastic
