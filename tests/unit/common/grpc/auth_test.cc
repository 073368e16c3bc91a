#include "common/grpc/auth.h"

#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace specstream {
namespace {

// --- LoadToken -----------------------------------------------------------

// Sets or unsets $SPECSTREAM_TOKEN for one test and restores it after.
class ScopedTokenEnv final {
 public:
  explicit ScopedTokenEnv(const char* value) {
    if (const char* old = std::getenv(kTokenEnvVar)) old_ = old;
    had_old_ = std::getenv(kTokenEnvVar) != nullptr;
    if (value == nullptr) {
      unsetenv(kTokenEnvVar);
    } else {
      setenv(kTokenEnvVar, value, 1);
    }
  }
  ~ScopedTokenEnv() {
    if (had_old_) {
      setenv(kTokenEnvVar, old_.c_str(), 1);
    } else {
      unsetenv(kTokenEnvVar);
    }
  }

 private:
  bool had_old_ = false;
  std::string old_;
};

TEST(LoadTokenTest, ReadsFileAndTrimsWhitespace) {
  ScopedTokenEnv env(nullptr);
  testing::TempDir dir;
  testing::WriteFile(dir.Join("token"), "  s3cret-token\n\n");
  absl::StatusOr<std::string> token = LoadToken(dir.Join("token"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cret-token");
}

TEST(LoadTokenTest, FallsBackToEnvironment) {
  ScopedTokenEnv env(" env-token\t\n");
  absl::StatusOr<std::string> token = LoadToken("");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "env-token");
}

TEST(LoadTokenTest, FileTakesPrecedenceOverEnvironment) {
  ScopedTokenEnv env("env-token");
  testing::TempDir dir;
  testing::WriteFile(dir.Join("token"), "file-token");
  absl::StatusOr<std::string> token = LoadToken(dir.Join("token"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "file-token");
}

TEST(LoadTokenTest, NoFileNoEnvironmentMeansNoToken) {
  ScopedTokenEnv env(nullptr);
  absl::StatusOr<std::string> token = LoadToken("");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "");
}

TEST(LoadTokenTest, MissingOrEmptyFileIsInvalidArgumentNamingPath) {
  ScopedTokenEnv env("env-token");  // never used as a fallback for a bad file
  testing::TempDir dir;
  std::string missing = dir.Join("missing-token");
  absl::StatusOr<std::string> token = LoadToken(missing);
  EXPECT_EQ(token.status().code(), absl::StatusCode::kInvalidArgument) << token.status();
  EXPECT_NE(token.status().message().find(missing), std::string::npos) << token.status();

  std::string blank = dir.Join("blank-token");
  testing::WriteFile(blank, " \n\t\n");
  token = LoadToken(blank);
  EXPECT_EQ(token.status().code(), absl::StatusCode::kInvalidArgument) << token.status();
  EXPECT_NE(token.status().message().find(blank), std::string::npos) << token.status();

  // A directory is unreadable as a file.
  token = LoadToken(dir.path());
  EXPECT_EQ(token.status().code(), absl::StatusCode::kInvalidArgument) << token.status();
}

TEST(LoadTokenTest, RejectsTokensMetadataCannotCarry) {
  testing::TempDir dir;
  testing::WriteFile(dir.Join("token"),
                     "abc\x01"
                     "def\n");
  EXPECT_EQ(LoadToken(dir.Join("token")).status().code(), absl::StatusCode::kInvalidArgument);
  ScopedTokenEnv env("two words");
  absl::StatusOr<std::string> token = LoadToken("");
  EXPECT_EQ(token.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(token.status().message().find(kTokenEnvVar), std::string::npos) << token.status();
}

// --- Credentials: argument checks ----------------------------------------

TEST(CredentialsTest, EmptyFilesGiveInsecureCredentials) {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> server =
      MakeServerCredentials(TlsServerFiles{});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_NE(*server, nullptr);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> client =
      MakeChannelCredentials(TlsClientFiles{});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_NE(*client, nullptr);
}

TEST(CredentialsTest, BadCombinationsAndFilesNameTheField) {
  testing::TempDir dir;
  std::string pem = dir.Join("x.pem");
  testing::WriteFile(pem, "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n");
  std::string text = dir.Join("x.txt");
  testing::WriteFile(text, "not pem");

  auto server_error = [](const TlsServerFiles& files) {
    return MakeServerCredentials(files).status();
  };
  auto client_error = [](const TlsClientFiles& files) {
    return MakeChannelCredentials(files).status();
  };
  struct Case {
    absl::Status status;
    std::string expected_substring;
  };
  std::vector<Case> cases = {
      {server_error({pem, "", ""}), "tls.key"},
      {server_error({"", pem, ""}), "tls.cert"},
      {server_error({"", "", pem}), "tls.cert"},
      {server_error({dir.Join("nope.pem"), pem, ""}),
       "tls.cert: cannot open " + dir.Join("nope.pem")},
      {server_error({pem, dir.Join("nope.key"), ""}),
       "tls.key: cannot open " + dir.Join("nope.key")},
      {server_error({pem, pem, text}), "tls.client_ca: " + text + " is not a PEM file"},
      {client_error({"", pem, pem}), "tls.ca"},
      {client_error({pem, pem, ""}), "tls.key"},
      {client_error({dir.Join("nope.pem"), "", ""}), "tls.ca: cannot open"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status.code(), absl::StatusCode::kInvalidArgument) << c.status;
    EXPECT_NE(c.status.message().find(c.expected_substring), std::string::npos)
        << c.status << " lacks " << c.expected_substring;
  }
}

// --- A real server ---------------------------------------------------------

// Answers every method: checks the bearer token like a real handler would,
// then replies with the token it saw (or "<none>").
class EchoTokenReactor final : public grpc::ServerGenericBidiReactor {
 public:
  EchoTokenReactor(grpc::GenericCallbackServerContext* context, const std::string& expected) {
    grpc::Status status = CheckBearer(*context, expected);
    if (!status.ok()) {
      Finish(status);
      return;
    }
    std::string seen = BearerToken(*context).value_or("<none>");
    grpc::Slice slice(seen);
    reply_ = grpc::ByteBuffer(&slice, 1);
    StartRead(&request_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::INTERNAL, "no request"));
      return;
    }
    StartWriteAndFinish(&reply_, grpc::WriteOptions(), grpc::Status::OK);
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer request_;
  grpc::ByteBuffer reply_;
};

class EchoTokenService final : public grpc::CallbackGenericService {
 public:
  explicit EchoTokenService(std::string expected) : expected_(std::move(expected)) {}
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    return new EchoTokenReactor(context, expected_);
  }

 private:
  std::string expected_;
};

struct TestServer {
  std::unique_ptr<EchoTokenService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  ~TestServer() {
    if (server) server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
};

std::unique_ptr<TestServer> StartServer(std::shared_ptr<grpc::ServerCredentials> credentials,
                                        const std::string& expected_token) {
  auto result = std::make_unique<TestServer>();
  result->service = std::make_unique<EchoTokenService>(expected_token);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", std::move(credentials), &result->port);
  builder.RegisterCallbackGenericService(result->service.get());
  result->server = builder.BuildAndStart();
  if (result->server == nullptr || result->port == 0) return nullptr;
  return result;
}

struct CallResult {
  grpc::Status status;
  std::string reply;
};

CallResult Call(const std::shared_ptr<grpc::Channel>& channel,
                const std::function<void(grpc::ClientContext&)>& prepare = {}) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (prepare) prepare(context);
  grpc::Slice slice(std::string("ping"));
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/specstream.test.Echo/Call", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status status) { done.set_value(std::move(status)); });
  CallResult result;
  result.status = done.get_future().get();
  if (result.status.ok()) {
    std::vector<grpc::Slice> slices;
    if (response.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) {
        result.reply.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
  }
  return result;
}

std::shared_ptr<grpc::Channel> InsecureChannel(const TestServer& server) {
  return grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
}

TEST(BearerTest, MissingWrongAndRightTokens) {
  std::unique_ptr<TestServer> server = StartServer(grpc::InsecureServerCredentials(), "s3cret");
  ASSERT_NE(server, nullptr);
  auto channel = InsecureChannel(*server);

  CallResult missing = Call(channel);
  EXPECT_EQ(missing.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(missing.status.error_message(), "missing bearer token");

  CallResult empty_token = Call(channel, [](grpc::ClientContext& c) { AddBearer(c, ""); });
  EXPECT_EQ(empty_token.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(empty_token.status.error_message(), "missing bearer token");

  CallResult wrong = Call(channel, [](grpc::ClientContext& c) { AddBearer(c, "s3cre"); });
  EXPECT_EQ(wrong.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(wrong.status.error_message(), "wrong bearer token");

  CallResult longer = Call(channel, [](grpc::ClientContext& c) { AddBearer(c, "s3cret!"); });
  EXPECT_EQ(longer.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(longer.status.error_message(), "wrong bearer token");

  CallResult basic =
      Call(channel, [](grpc::ClientContext& c) { c.AddMetadata("authorization", "Basic s3cret"); });
  EXPECT_EQ(basic.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(basic.status.error_message(), "missing bearer token");

  CallResult right = Call(channel, [](grpc::ClientContext& c) { AddBearer(c, "s3cret"); });
  EXPECT_TRUE(right.status.ok()) << right.status.error_message();
  EXPECT_EQ(right.reply, "s3cret");

  // The scheme is case-insensitive.
  CallResult lower = Call(
      channel, [](grpc::ClientContext& c) { c.AddMetadata("authorization", "bearer s3cret"); });
  EXPECT_TRUE(lower.status.ok()) << lower.status.error_message();
  EXPECT_EQ(lower.reply, "s3cret");
}

TEST(BearerTest, EmptyExpectedTokenTurnsAuthOff) {
  std::unique_ptr<TestServer> server = StartServer(grpc::InsecureServerCredentials(), "");
  ASSERT_NE(server, nullptr);
  auto channel = InsecureChannel(*server);
  CallResult none = Call(channel);
  EXPECT_TRUE(none.status.ok()) << none.status.error_message();
  EXPECT_EQ(none.reply, "<none>");
  CallResult some = Call(channel, [](grpc::ClientContext& c) { AddBearer(c, "anything"); });
  EXPECT_TRUE(some.status.ok()) << some.status.error_message();
  EXPECT_EQ(some.reply, "anything");
}

// --- TLS -------------------------------------------------------------------

// A CA and a server ("localhost", 127.0.0.1) and a client certificate it
// signed, made with the openssl CLI.
class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveOpenssl()) GTEST_SKIP() << "openssl CLI not found";
    const std::string error = testing::MakeTestCertificates(dir_.path());
    ASSERT_EQ(error, "") << "openssl failed:\n" << error;
  }

  std::string Path(const std::string& name) const { return dir_.Join(name); }

  std::shared_ptr<grpc::Channel> Channel(const TestServer& server, const TlsClientFiles& files) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        MakeChannelCredentials(files);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    if (!credentials.ok()) return nullptr;
    return grpc::CreateChannel(server.address(), *credentials);
  }

  testing::TempDir dir_;
};

TEST_F(TlsTest, TlsClientConnectsAndPlaintextClientFails) {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials({Path("server.pem"), Path("server.key"), ""});
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  std::unique_ptr<TestServer> server = StartServer(*credentials, "tok");
  ASSERT_NE(server, nullptr);

  auto bearer = [](grpc::ClientContext& c) { AddBearer(c, "tok"); };
  CallResult tls = Call(Channel(*server, {Path("ca.pem"), "", ""}), bearer);
  EXPECT_TRUE(tls.status.ok()) << tls.status.error_message();
  EXPECT_EQ(tls.reply, "tok");

  CallResult tls_no_token = Call(Channel(*server, {Path("ca.pem"), "", ""}));
  EXPECT_EQ(tls_no_token.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);

  CallResult plaintext = Call(InsecureChannel(*server), bearer);
  EXPECT_FALSE(plaintext.status.ok());
  EXPECT_NE(plaintext.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);

  // A client that trusts some other CA refuses the server.
  CallResult wrong_ca = Call(Channel(*server, {Path("client.pem"), "", ""}), bearer);
  EXPECT_FALSE(wrong_ca.status.ok());
}

TEST_F(TlsTest, MutualTlsRequiresClientCertificate) {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials({Path("server.pem"), Path("server.key"), Path("ca.pem")});
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  std::unique_ptr<TestServer> server = StartServer(*credentials, "tok");
  ASSERT_NE(server, nullptr);
  auto bearer = [](grpc::ClientContext& c) { AddBearer(c, "tok"); };

  CallResult without_cert = Call(Channel(*server, {Path("ca.pem"), "", ""}), bearer);
  EXPECT_FALSE(without_cert.status.ok());
  EXPECT_NE(without_cert.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);

  CallResult with_cert =
      Call(Channel(*server, {Path("ca.pem"), Path("client.pem"), Path("client.key")}), bearer);
  EXPECT_TRUE(with_cert.status.ok()) << with_cert.status.error_message();
  EXPECT_EQ(with_cert.reply, "tok");

  // A self-signed client certificate (not signed by the client CA) is
  // refused too.
  ASSERT_EQ(std::system(("cd '" + dir_.path() +
                         "' && openssl req -x509 -config ca.cnf -newkey ec -pkeyopt "
                         "ec_paramgen_curve:prime256v1 -nodes -subj /CN=rogue -keyout "
                         "rogue.key -out rogue.pem -days 2 >/dev/null 2>&1")
                            .c_str()),
            0);
  CallResult rogue =
      Call(Channel(*server, {Path("ca.pem"), Path("rogue.pem"), Path("rogue.key")}), bearer);
  EXPECT_FALSE(rogue.status.ok());
}

}  // namespace
}  // namespace specstream
