// ReflectionService (common/grpc/reflection.h) over a real gRPC server and
// the generated reflection client, as grpcurl uses it: the token first, then
// one answer per request, and a missing name answered without ending the
// stream.
#include "common/grpc/reflection.h"

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc/auth.h"
#include "common/grpc/server_defaults.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "specstream/v1/coordinator.grpc.pb.h"
#include "tests/testing/grpc_health.h"

namespace specstream {
namespace {

using grpc::reflection::v1alpha::ServerReflection;
using grpc::reflection::v1alpha::ServerReflectionRequest;
using grpc::reflection::v1alpha::ServerReflectionResponse;

constexpr char kToken[] = "reflection-token";

class ReflectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_ = std::make_unique<ReflectionService>(
        std::vector<std::string>{v1::JobService::service_full_name()},
        [](grpc::ServerContext& context) { return CheckBearer(context, kToken); });
    EnableServerDefaults();
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  void TearDown() override { server_->Shutdown(); }

  // Sends `requests` on one stream with the token and collects the answers.
  std::vector<ServerReflectionResponse> Ask(const std::vector<ServerReflectionRequest>& requests) {
    auto stub = ServerReflection::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    AddBearer(context, kToken);
    auto stream = stub->ServerReflectionInfo(&context);
    for (const auto& request : requests) EXPECT_TRUE(stream->Write(request));
    stream->WritesDone();
    std::vector<ServerReflectionResponse> responses;
    ServerReflectionResponse response;
    while (stream->Read(&response)) responses.push_back(response);
    EXPECT_TRUE(stream->Finish().ok());
    return responses;
  }

  std::unique_ptr<ReflectionService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(ReflectionTest, RefusedWithoutTheTokenAndListsTheServicesWithIt) {
  for (const std::string token : {"", "wrong"}) {
    auto refused = testing::ReflectionServices(address_, token);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated) << token;
  }
  auto services = testing::ReflectionServices(address_, kToken);
  ASSERT_TRUE(services.ok()) << services.status();
  EXPECT_THAT(*services,
              ::testing::UnorderedElementsAre("specstream.v1.JobService", "grpc.health.v1.Health",
                                              "grpc.reflection.v1alpha.ServerReflection"));
}

// A symbol's file comes with every file it depends on, each once, so a
// client can build the descriptors; a missing name is answered NOT_FOUND
// and the stream goes on.
TEST_F(ReflectionTest, FilesComeWithTheirDependenciesAndAMissingNameKeepsTheStream) {
  // A server links the generated code of the services it registers; this
  // test registers none, so it links coordinator.proto's by naming a type.
  ASSERT_EQ(v1::Job::descriptor()->file()->name(), "specstream/v1/coordinator.proto");
  std::vector<ServerReflectionRequest> requests(4);
  requests[0].set_file_containing_symbol("specstream.v1.JobService");
  requests[1].set_file_containing_symbol("no.such.Symbol");
  requests[2].set_file_by_filename("specstream/v1/coordinator.proto");
  requests[3].set_all_extension_numbers_of_type("specstream.v1.Job");
  const std::vector<ServerReflectionResponse> responses = Ask(requests);
  ASSERT_EQ(responses.size(), 4u);

  const auto* file = google::protobuf::DescriptorPool::generated_pool()->FindFileContainingSymbol(
      "specstream.v1.JobService");
  ASSERT_NE(file, nullptr);
  std::set<std::string> expected;
  std::vector<const google::protobuf::FileDescriptor*> todo = {file};
  while (!todo.empty()) {
    const auto* f = todo.back();
    todo.pop_back();
    if (!expected.insert(f->name()).second) continue;
    for (int i = 0; i < f->dependency_count(); ++i) todo.push_back(f->dependency(i));
  }
  for (int r : {0, 2}) {
    const auto& protos = responses[r].file_descriptor_response().file_descriptor_proto();
    ASSERT_FALSE(protos.empty()) << r;
    std::vector<std::string> names;
    for (const std::string& bytes : protos) {
      google::protobuf::FileDescriptorProto proto;
      ASSERT_TRUE(proto.ParseFromString(bytes));
      names.push_back(proto.name());
    }
    EXPECT_EQ(names.front(), "specstream/v1/coordinator.proto") << r;
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected) << r;
    EXPECT_EQ(names.size(), expected.size()) << r << ": a file sent twice";
  }
  EXPECT_EQ(responses[0].original_request().file_containing_symbol(), "specstream.v1.JobService");
  EXPECT_EQ(responses[1].error_response().error_code(),
            static_cast<int32_t>(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(responses[1].error_response().error_message(),
              ::testing::HasSubstr("no.such.Symbol"));
  EXPECT_EQ(responses[3].all_extension_numbers_response().base_type_name(), "specstream.v1.Job");
}

}  // namespace
}  // namespace specstream
