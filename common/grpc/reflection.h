// Server reflection (grpc.reflection.v1alpha.ServerReflection, the protocol
// grpcurl and grpc_cli speak) behind the server's own credential check.
// gRPC's reflection plugin answers anyone; every SpecStream server takes a
// bearer token on its other calls, so reflection asks for the same one (the
// health service alone stays open, for Kubernetes probes).
//
// The call is checked before any request is read: a refusal ends it with
// its status (UNAUTHENTICATED, or RESOURCE_EXHAUSTED from a peer limiter)
// and nothing is answered. Once admitted, each request gets one response, in
// order: list_services (the names the server gave), file_by_filename,
// file_containing_symbol, file_containing_extension and
// all_extension_numbers_of_type from the process's generated descriptor
// pool, each file followed by its dependencies (each once per response). A
// name the pool lacks is an error_response NOT_FOUND, as the protocol has
// it, and the stream goes on.
//
// Thread-safe: calls share nothing but the immutable service list.
#ifndef SPECSTREAM_COMMON_GRPC_REFLECTION_H_
#define SPECSTREAM_COMMON_GRPC_REFLECTION_H_

#include <functional>
#include <string>
#include <vector>

#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/status.h"

namespace specstream {

class ReflectionService final : public grpc::reflection::v1alpha::ServerReflection::Service {
 public:
  // OK when the call may be answered, else the status it ends with. May
  // block (a teacher's verdict on a job token can take a heartbeat).
  using Authorize = std::function<grpc::Status(grpc::ServerContext& context)>;

  // `services`: the fully qualified names list_services answers (the
  // server's own, health's, and this one's are added). `authorize` null:
  // no check (a server with authentication off).
  ReflectionService(std::vector<std::string> services, Authorize authorize);

  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<grpc::reflection::v1alpha::ServerReflectionResponse,
                               grpc::reflection::v1alpha::ServerReflectionRequest>* stream)
      override;

 private:
  std::vector<std::string> services_;
  Authorize authorize_;
};

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_GRPC_REFLECTION_H_
