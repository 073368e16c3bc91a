#include "tests/testing/grpc_health.h"

#include <condition_variable>
#include <mutex>
#include <vector>

#include "common/grpc/auth.h"
#include "common/grpc/status.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"

namespace specstream::testing {

// The request is the empty message; the response's field 1 is the status
// enum (1 SERVING, 2 NOT_SERVING).
std::string HealthCheck(const std::string& target, absl::Duration timeout) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::ByteBuffer request(nullptr, 0);
  grpc::ByteBuffer response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = std::move(s);
                   done = true;
                   cv.notify_all();
                 });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  if (!status.ok()) return "error: " + status.error_message();
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return "error: unreadable response";
  std::string bytes;
  for (const auto& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  if (bytes == std::string("\x08\x01", 2)) return "SERVING";
  if (bytes == std::string("\x08\x02", 2)) return "NOT_SERVING";
  return "unknown";
}

absl::StatusOr<std::vector<std::string>> ReflectionServices(const std::string& target,
                                                            const std::string& token) {
  using grpc::reflection::v1alpha::ServerReflection;
  using grpc::reflection::v1alpha::ServerReflectionRequest;
  using grpc::reflection::v1alpha::ServerReflectionResponse;
  auto stub =
      ServerReflection::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  AddBearer(context, token);
  auto stream = stub->ServerReflectionInfo(&context);
  ServerReflectionRequest request;
  request.set_list_services("");
  stream->Write(request);
  stream->WritesDone();
  ServerReflectionResponse response;
  std::vector<std::string> names;
  while (stream->Read(&response)) {
    for (const auto& service : response.list_services_response().service()) {
      names.push_back(service.name());
    }
  }
  if (grpc::Status status = stream->Finish(); !status.ok()) return FromGrpcStatus(status);
  return names;
}

}  // namespace specstream::testing
