// The teacher against clients that mean it harm (P13): a real TeacherServer
// on 127.0.0.1 over a weightless target, and clients written against the
// proto alone that send no token, a wrong one, floods of them, garbage
// bytes, or plaintext to a TLS port. Each case asserts the clear refusal and
// that the teacher still answers Describe and the health check within 1 s.
#include <algorithm>
#include <atomic>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/grpc/auth.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "services/daemon/registration.h"
#include "services/student/grpc_teacher_connection.h"
#include "services/teacher/teacher_service.h"
#include "specstream/v1/coordinator.pb.h"
#include "specstream/v1/teacher.grpc.pb.h"
#include "teacher/queue_budget.h"
#include "tests/testing/fake_env.h"
#include "tests/testing/fake_target_runtime.h"
#include "tests/testing/grpc_health.h"
#include "tests/testing/testing.h"

namespace specstream {
namespace {

using services::TeacherServer;
using services::TeacherServerOptions;

constexpr char kToken[] = "the-teachers-token-0123";

// What a student sees of one call.
struct CallResult {
  grpc::StatusCode code = grpc::StatusCode::OK;
  std::string message;
  absl::Duration took;
};

class HostileClientTest : public ::testing::Test {
 protected:
  void Start(teacher::TeacherServiceOptions::Authorizer authorize, TlsServerFiles tls = {}) {
    TeacherServerOptions options;
    options.service = service_;
    options.service.authorize = std::move(authorize);
    options.tls = std::move(tls);
    auto server = TeacherServer::Start(runtime_, std::move(options));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::shared_ptr<grpc::Channel> Channel() {
    return grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  }

  CallResult Describe(const std::string& token) {
    v1::TeacherService::Stub stub(Channel());
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    AddBearer(context, token);
    v1::DescribeRequest request;
    v1::DescribeResponse response;
    const absl::Time start = absl::Now();
    const grpc::Status status = stub.Describe(&context, request, &response);
    if (status.ok()) EXPECT_GT(response.hidden_size(), 0);
    return {status.error_code(), status.error_message(), absl::Now() - start};
  }

  // Opens a stream with `token`, sends Open (inline) and waits for the
  // first response or the end: OK once Opened arrives, else the status.
  CallResult OpenStream(const std::string& token) {
    v1::TeacherService::Stub stub(Channel());
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    AddBearer(context, token);
    const absl::Time start = absl::Now();
    auto stream = stub.StreamHiddenStates(&context);
    v1::StreamRequest open;
    open.mutable_open()->set_transport(v1::TRANSPORT_INLINE);
    stream->Write(open);
    v1::StreamResponse response;
    if (stream->Read(&response) && response.has_opened()) {
      stream->WritesDone();
      context.TryCancel();
      stream->Finish().IgnoreError();
      return {grpc::StatusCode::OK, "", absl::Now() - start};
    }
    const grpc::Status status = stream->Finish();
    return {status.error_code(), status.error_message(), absl::Now() - start};
  }

  // The teacher answers Describe (with `token`) and the health check, each
  // within a second.
  void ExpectResponsive(const std::string& token) {
    const CallResult describe = Describe(token);
    EXPECT_EQ(describe.code, grpc::StatusCode::OK) << describe.message;
    EXPECT_LT(describe.took, absl::Seconds(1));
    const absl::Time start = absl::Now();
    EXPECT_EQ(testing::HealthCheck(server_->address(), absl::Seconds(1)), "SERVING");
    EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  }

  testing::FakeTargetRuntime runtime_;
  teacher::TeacherServiceOptions service_;  // what Start serves with (its authorizer aside)
  std::unique_ptr<TeacherServer> server_;
};

// P13 item 1: a standalone teacher with a token refuses streams and
// Describe without it.
TEST_F(HostileClientTest, AStandaloneTokenGuardsStreamsAndDescribe) {
  Start(services::TokenAuthorizer(kToken));
  for (const std::string token : {"", "wrong-token"}) {
    const CallResult describe = Describe(token);
    EXPECT_EQ(describe.code, grpc::StatusCode::UNAUTHENTICATED) << token;
    const CallResult stream = OpenStream(token);
    EXPECT_EQ(stream.code, grpc::StatusCode::UNAUTHENTICATED) << token << ": " << stream.message;
    EXPECT_LT(stream.took, absl::Seconds(1));
  }
  EXPECT_EQ(OpenStream(kToken).code, grpc::StatusCode::OK);
  ExpectResponsive(kToken);
  // P24 item 3: server reflection takes the same token.
  for (const std::string token : {"", "wrong-token"}) {
    auto refused = testing::ReflectionServices(server_->address(), token);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated) << token;
  }
  auto services = testing::ReflectionServices(server_->address(), kToken);
  ASSERT_TRUE(services.ok()) << services.status();
  EXPECT_NE(std::find(services->begin(), services->end(), services::kTeacherServiceName),
            services->end());
}

// P13 item 4: 64 streams with tokens of no running job wait for a
// heartbeat that never names them. They hold no thread: Describe, the
// health check and a real job's stream are answered at once meanwhile, and
// past the per-peer limit of waiting calls the refusals are immediate.
TEST_F(HostileClientTest, ABadTokenFloodStarvesNeitherDescribeNorHealth) {
  // The admissions' 3 s waits end when the test moves this clock.
  testing::FakeEnv clock;
  services::JobTokenSet tokens(&clock);
  v1::HeartbeatResponse reply;
  reply.add_job_token_hashes(TokenHash(kToken));
  tokens.Replace(reply);
  Start([&tokens](const std::string& presented, std::function<void(absl::Status)> done) {
    tokens.Admit(presented, absl::Seconds(3), std::move(done));
  });

  std::vector<CallResult> flood(64);
  std::atomic<int> answered{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 64; ++i) {
    clients.emplace_back([&, i] {
      flood[i] = OpenStream(absl::StrCat("forged-", i));
      ++answered;
    });
  }
  // The flood is in: all but the calls being authorized were refused, and
  // those wait (the clock stands still).
  ASSERT_TRUE(testing::WaitUntil([&] { return answered.load() == 48; }, absl::Seconds(30)))
      << answered.load() << " of the flood answered";
  ExpectResponsive(kToken);
  EXPECT_EQ(OpenStream(kToken).code, grpc::StatusCode::OK)
      << "a running job's token is admitted at once, whatever else the peer has pending";
  EXPECT_EQ(answered.load(), 48) << "the waiting calls wait for the clock";
  clock.Advance(absl::Seconds(3));
  for (auto& client : clients) client.join();
  int unauthenticated = 0;
  int limited = 0;
  for (const CallResult& r : flood) {
    if (r.code == grpc::StatusCode::UNAUTHENTICATED) {
      ++unauthenticated;
      EXPECT_NE(r.message.find("no running job"), std::string::npos) << r.message;
    } else {
      EXPECT_EQ(r.code, grpc::StatusCode::RESOURCE_EXHAUSTED) << r.message;
      EXPECT_LT(r.took, absl::Seconds(1)) << "a limited peer is refused at once";
      ++limited;
    }
  }
  EXPECT_EQ(unauthenticated, 16) << "the per-peer limit of calls being authorized";
  EXPECT_EQ(limited, 48);
  tokens.Close();
}

// P13 item 4 and P24 item 4: refusals are counted per peer; past 32 in the
// window the peer's wrong tokens are refused RESOURCE_EXHAUSTED at once,
// while the right token from the same address (a NAT, a node) is still
// served, streams and Describe alike, and the health check answers.
TEST_F(HostileClientTest, RepeatedRefusalsAreRateLimitedButTheRightTokenIsServed) {
  Start(services::TokenAuthorizer(kToken));
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(Describe("wrong").code, grpc::StatusCode::UNAUTHENTICATED) << i;
  }
  const CallResult limited = Describe("wrong");
  EXPECT_EQ(limited.code, grpc::StatusCode::RESOURCE_EXHAUSTED) << limited.message;
  EXPECT_NE(limited.message.find("refused attempts"), std::string::npos) << limited.message;
  EXPECT_LT(limited.took, absl::Seconds(1));
  EXPECT_EQ(OpenStream("wrong").code, grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(Describe(kToken).code, grpc::StatusCode::OK);
  EXPECT_EQ(OpenStream(kToken).code, grpc::StatusCode::OK);
  EXPECT_EQ(testing::HealthCheck(server_->address(), absl::Seconds(1)), "SERVING");
}

// P13 item 18: eight streams each send 3,000 SampleRequests and never a
// credit. Their waiting requests share one teacher-wide budget (1 MiB
// here): the teacher holds no more than it, the requests over it are
// answered SampleError RESOURCE_EXHAUSTED while the floods' streams go on, a
// student that grants credit first is served meanwhile, Describe and the
// health check answer within 1 s, and the budget is empty once the floods
// half-close.
TEST_F(HostileClientTest, AQueueFloodIsBoundedByOneTeacherWideBudget) {
  constexpr int kStreams = 8;
  constexpr int kRequests = 3000;
  constexpr int kTokens = 64;
  constexpr int64_t kBudget = int64_t{1} << 20;
  constexpr int64_t kPerRequest = kTokens * 4 + teacher::kQueuedRequestOverheadBytes;
  for (const int64_t bad : {int64_t{0}, int64_t{-1}}) {
    TeacherServerOptions refused_options;
    refused_options.service.max_queued_request_bytes = bad;
    auto refused = TeacherServer::Start(runtime_, refused_options);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find("max_queued_request_bytes"), std::string::npos)
        << refused.status();
  }
  service_.max_queued_request_bytes = kBudget;
  Start({});

  auto sample = [](uint64_t request_id) {
    v1::StreamRequest r;
    r.mutable_sample()->set_request_id(request_id);
    r.mutable_sample()->set_sample_id(static_cast<int64_t>(request_id));
    for (int t = 0; t < kTokens; ++t) r.mutable_sample()->add_token_ids((t * 7 + 3) % 60);
    return r;
  };
  struct Flood {
    std::atomic<int> exhausted{0};
    std::atomic<int> other_errors{0};
    std::string last_message;  // the reader's, read after it is joined
    bool wrote_all = false;
    grpc::Status status;
  };
  std::vector<Flood> floods(kStreams);
  absl::Notification half_close;
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      Flood& flood = floods[i];
      v1::TeacherService::Stub stub(Channel());
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
      auto stream = stub.StreamHiddenStates(&context);
      std::thread reader([&] {
        v1::StreamResponse response;
        while (stream->Read(&response)) {
          if (!response.has_error()) continue;
          if (response.error().code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
            ++flood.exhausted;
            flood.last_message = response.error().message();
          } else {
            ++flood.other_errors;
          }
        }
      });
      v1::StreamRequest open;
      open.mutable_open()->set_transport(v1::TRANSPORT_INLINE);
      bool ok = stream->Write(open);
      for (uint64_t id = 1; ok && id <= kRequests; ++id) ok = stream->Write(sample(id));
      flood.wrote_all = ok;
      half_close.WaitForNotification();
      stream->WritesDone();
      reader.join();
      flood.status = stream->Finish();
    });
  }

  // The clients end however the test does (an ASSERT returns early).
  struct JoinClients {
    absl::Notification& half_close;
    std::vector<std::thread>& clients;
    ~JoinClients() {
      if (!half_close.HasBeenNotified()) half_close.Notify();
      for (auto& client : clients) {
        if (client.joinable()) client.join();
      }
    }
  } join_clients{half_close, clients};

  // Every request is either waiting (charged) or refused.
  auto exhausted = [&] {
    int64_t n = 0;
    for (const Flood& f : floods) n += f.exhausted.load();
    return n;
  };
  int64_t max_seen = 0;
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        const int64_t queued = server_->core().stats().queued_request_bytes;
        max_seen = std::max(max_seen, queued);
        return exhausted() + queued / kPerRequest == int64_t{kStreams} * kRequests;
      },
      absl::Seconds(60)))
      << exhausted() << " refused, " << server_->core().stats().queued_request_bytes << " bytes";
  const teacher::TeacherCore::Stats held = server_->core().stats();
  EXPECT_EQ(held.queued_request_bytes, kBudget) << "1 MiB is a whole number of 512-byte requests";
  EXPECT_LE(held.queued_request_bytes_peak, kBudget);
  EXPECT_LE(max_seen, kBudget);
  EXPECT_EQ(exhausted(), int64_t{kStreams} * kRequests - kBudget / kPerRequest);
  std::cout << "flood: " << kStreams << " x " << kRequests << " requests of " << kTokens
            << " tokens; teacher holds " << held.queued_request_bytes << " bytes (peak "
            << held.queued_request_bytes_peak << ", budget " << kBudget << "), " << exhausted()
            << " refused; unbounded it would hold " << int64_t{kStreams} * kRequests * kPerRequest
            << " bytes\n";
  ExpectResponsive("");

  // An honest student (credit first) gets its samples with the budget full.
  {
    v1::TeacherService::Stub stub(Channel());
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    auto stream = stub.StreamHiddenStates(&context);
    v1::StreamRequest open;
    open.mutable_open()->set_transport(v1::TRANSPORT_INLINE);
    v1::StreamRequest credit;
    credit.mutable_credit()->set_n(2);
    ASSERT_TRUE(stream->Write(open) && stream->Write(credit) && stream->Write(sample(1)) &&
                stream->Write(sample(2)));
    int headers = 0;
    int errors = 0;
    v1::StreamResponse response;
    while (headers < 2 && errors == 0 && stream->Read(&response)) {
      headers += response.has_header();
      errors += response.has_error();
    }
    EXPECT_EQ(headers, 2);
    EXPECT_EQ(errors, 0) << response.error().message();
    context.TryCancel();
    stream->Finish().IgnoreError();
  }

  half_close.Notify();
  for (auto& client : clients) client.join();
  for (int i = 0; i < kStreams; ++i) {
    const Flood& f = floods[i];
    EXPECT_TRUE(f.wrote_all) << i;
    EXPECT_TRUE(f.status.ok()) << i << ": " << f.status.error_message();
    EXPECT_GT(f.exhausted.load(), 0) << i;
    EXPECT_EQ(f.other_errors.load(), 0) << i;
    EXPECT_NE(f.last_message.find("--max-queued-mib"), std::string::npos) << f.last_message;
  }
  EXPECT_TRUE(testing::WaitUntil([&] { return server_->core().stats().queued_request_bytes == 0; },
                                 absl::Seconds(10)))
      << server_->core().stats().queued_request_bytes;
  ExpectResponsive("");
}

// P24 item 2: 200 clients open streams, grant credit, ask for samples and
// never read, from the address of a student already streaming. The teacher
// admits 47 of them (48 streams per address here, the student's
// included) and refuses the rest RESOURCE_EXHAUSTED naming the limit, so it
// holds at most 48 streams' samples and payload threads. The target is
// slow (10 ms a forward, one sample each); the streams take turns at it, so
// the student's next sample waits behind at most one sample of each flood
// stream, not their 376 (3.8 s first-come-first-served), and comes within
// 2 s.
TEST_F(HostileClientTest, NonReadingStreamsAreCappedAndDoNotStarveAnAdmittedStudent) {
  constexpr int kFlood = 200;
  constexpr int kPerPeer = 48;
  constexpr int kCredit = 8;
  constexpr int kTokens = 64;
  service_.max_streams_per_peer = kPerPeer;
  service_.max_batch_tokens = kTokens;  // one sample per forward
  Start({});
  auto sample = [](uint64_t request_id, int32_t first) {
    v1::StreamRequest r;
    r.mutable_sample()->set_request_id(request_id);
    r.mutable_sample()->set_sample_id(static_cast<int64_t>(request_id));
    r.mutable_sample()->add_token_ids(first);
    for (int t = 1; t < kTokens; ++t) r.mutable_sample()->add_token_ids((t * 7 + 3) % 50);
    return r;
  };
  v1::StreamRequest open;
  open.mutable_open()->set_transport(v1::TRANSPORT_INLINE);

  // The student, streaming before the flood.
  v1::TeacherService::Stub stub(Channel());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  auto student = stub.StreamHiddenStates(&context);
  v1::StreamResponse response;
  ASSERT_TRUE(student->Write(open) && student->Read(&response) && response.has_opened());

  runtime_.Hold();  // the flood's samples all queue before any is computed
  runtime_.set_forward_delay(absl::Milliseconds(10));
  struct Flood {
    bool opened = false;
    grpc::Status status;
  };
  std::vector<Flood> floods(kFlood);
  absl::Notification stop;
  std::vector<std::thread> clients;
  for (int i = 0; i < kFlood; ++i) {
    clients.emplace_back([&, i] {
      v1::TeacherService::Stub flood_stub(Channel());
      grpc::ClientContext flood_context;
      flood_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
      auto stream = flood_stub.StreamHiddenStates(&flood_context);
      v1::StreamResponse first;
      if (stream->Write(open) && stream->Read(&first) && first.has_opened()) {
        floods[i].opened = true;
        v1::StreamRequest credit;
        credit.mutable_credit()->set_n(kCredit);
        bool ok = stream->Write(credit);
        for (uint64_t id = 1; ok && id <= kCredit; ++id) ok = stream->Write(sample(id, 60));
        stop.WaitForNotification();  // never reads another message
        flood_context.TryCancel();
      }
      floods[i].status = stream->Finish();
    });
  }
  struct StopClients {
    absl::Notification& stop;
    std::vector<std::thread>& clients;
    testing::FakeTargetRuntime& runtime;
    ~StopClients() {
      runtime.Release();
      if (!stop.HasBeenNotified()) stop.Notify();
      for (auto& client : clients) {
        if (client.joinable()) client.join();
      }
    }
  } stop_clients{stop, clients, runtime_};

  // 47 flood streams admitted, each with its 8 samples queued (one of them
  // held in the forward), and 153 refused.
  constexpr int kAdmitted = kPerPeer - 1;
  ASSERT_TRUE(testing::WaitUntil(
      [&] {
        const teacher::TeacherCore::Stats stats = server_->core().stats();
        return stats.streams_refused_over_limit == kFlood - kAdmitted &&
               stats.queued_jobs == int64_t{kAdmitted} * kCredit - 1;
      },
      absl::Seconds(60)))
      << server_->core().stats().streams_refused_over_limit << " refused, "
      << server_->core().stats().queued_jobs << " queued";
  const teacher::TeacherCore::Stats held = server_->core().stats();
  EXPECT_EQ(held.open_streams, kPerPeer);

  v1::StreamRequest credit;
  credit.mutable_credit()->set_n(1);
  ASSERT_TRUE(student->Write(credit) && student->Write(sample(1, 61)));
  ASSERT_TRUE(testing::WaitUntil(
      [&] { return server_->core().stats().queued_jobs == int64_t{kAdmitted} * kCredit; },
      absl::Seconds(10)));
  const absl::Time asked = absl::Now();
  runtime_.Release();
  bool header = false;
  while (!header && student->Read(&response)) header = response.has_header();
  const absl::Duration took = absl::Now() - asked;
  ASSERT_TRUE(header);
  EXPECT_LT(took, absl::Seconds(2)) << "the student's sample waited behind the flood";
  const std::vector<int32_t> order = runtime_.first_ids();
  const auto at = std::find(order.begin(), order.end(), 61) - order.begin();
  EXPECT_LE(at, kAdmitted + 1) << "computed after " << at << " flood samples";
  std::cout << "flood: " << kFlood << " non-reading streams from one address; " << kAdmitted
            << " admitted beside the student (" << held.open_streams << " streams open, "
            << held.streams_refused_over_limit << " refused), " << int64_t{kAdmitted} * kCredit
            << " flood samples queued; the student's sample "
            << "was computed after " << at << " of them and arrived in "
            << absl::FormatDuration(took) << "\n";
  ExpectResponsive("");

  context.TryCancel();
  student->Finish().IgnoreError();
  stop.Notify();
  for (auto& client : clients) client.join();
  int opened = 0;
  for (const Flood& f : floods) {
    if (f.opened) {
      ++opened;
      continue;
    }
    EXPECT_EQ(f.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << f.status.error_message();
    EXPECT_NE(f.status.error_message().find("--max-streams-per-peer"), std::string::npos)
        << f.status.error_message();
  }
  EXPECT_EQ(opened, kAdmitted);
  EXPECT_TRUE(testing::WaitUntil([&] { return server_->core().stats().open_streams == 0; },
                                 absl::Seconds(10)));
}

// P24 item 2: past max_streams open streams, one more is refused
// RESOURCE_EXHAUSTED naming the limit; once one closes, a new one opens.
TEST_F(HostileClientTest, StreamsPastTheTeachersLimitAreRefused) {
  service_.max_streams = 3;
  Start({});
  v1::StreamRequest open;
  open.mutable_open()->set_transport(v1::TRANSPORT_INLINE);
  struct Open {
    std::unique_ptr<v1::TeacherService::Stub> stub;
    std::unique_ptr<grpc::ClientContext> context = std::make_unique<grpc::ClientContext>();
    std::unique_ptr<grpc::ClientReaderWriter<v1::StreamRequest, v1::StreamResponse>> stream;
  };
  std::vector<Open> streams;
  for (int i = 0; i < 3; ++i) {
    Open o;
    o.stub = std::make_unique<v1::TeacherService::Stub>(Channel());
    o.stream = o.stub->StreamHiddenStates(o.context.get());
    v1::StreamResponse response;
    ASSERT_TRUE(o.stream->Write(open) && o.stream->Read(&response) && response.has_opened()) << i;
    streams.push_back(std::move(o));
  }
  const CallResult refused = OpenStream("");
  EXPECT_EQ(refused.code, grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.message;
  EXPECT_NE(refused.message.find("--max-streams"), std::string::npos) << refused.message;
  EXPECT_EQ(server_->core().stats().open_streams, 3);
  streams.front().stream->WritesDone();
  EXPECT_TRUE(streams.front().stream->Finish().ok());
  EXPECT_TRUE(testing::WaitUntil([&] { return server_->core().stats().open_streams == 2; },
                                 absl::Seconds(10)));
  EXPECT_EQ(OpenStream("").code, grpc::StatusCode::OK);
  for (size_t i = 1; i < streams.size(); ++i) {
    streams[i].context->TryCancel();
    streams[i].stream->Finish().IgnoreError();
  }
}

// A StreamRequest that does not parse ends that stream INVALID_ARGUMENT;
// the teacher carries on.
TEST_F(HostileClientTest, GarbageBytesEndOnlyTheirStream) {
  Start(services::TokenAuthorizer(kToken));
  grpc::GenericStub stub(Channel());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  AddBearer(context, kToken);
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&context, "/specstream.v1.TeacherService/StreamHiddenStates", &cq);
  void* tag = nullptr;
  bool ok = false;
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  const std::string garbage = "\xff\xff\xff\xff\x0f not a protobuf";
  grpc::Slice slice(garbage.data(), garbage.size());
  grpc::ByteBuffer buffer(&slice, 1);
  call->Write(buffer, reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(3));
  while (cq.Next(&tag, &ok) && tag != reinterpret_cast<void*>(3)) {
  }
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  ExpectResponsive(kToken);
}

// P13 item 2: TeacherService over TLS, and mutual TLS, on both ends.
TEST_F(HostileClientTest, TlsAndMutualTlsOnBothEnds) {
  if (!testing::HaveOpenssl()) GTEST_SKIP() << "openssl CLI not found";
  testing::TempDir dir;
  ASSERT_EQ(testing::MakeTestCertificates(dir.path()), "");
  TlsServerFiles tls{dir.Join("server.pem"), dir.Join("server.key"), dir.Join("ca.pem")};
  Start(services::TokenAuthorizer(kToken), tls);

  auto connect = [&](TlsClientFiles files) {
    services::GrpcTeacherConnectorOptions options;
    options.token = kToken;
    options.tls = std::move(files);
    auto connector = services::GrpcTeacherConnector::Create(std::move(options));
    EXPECT_TRUE(connector.ok()) << connector.status();
    return (*connector)->Describe(server_->address(), absl::Seconds(3));
  };
  // A plaintext student, and one that cannot prove who it is, get nothing.
  EXPECT_FALSE(connect({}).ok());
  EXPECT_FALSE(connect({dir.Join("ca.pem"), "", ""}).ok());
  auto described = connect({dir.Join("ca.pem"), dir.Join("client.pem"), dir.Join("client.key")});
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_GT(described->hidden_size(), 0);
  // The student's TLS flags are checked when it starts, naming the flag.
  services::GrpcTeacherConnectorOptions bad;
  bad.tls.ca = dir.Join("missing.pem");
  auto refused = services::GrpcTeacherConnector::Create(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("tls.ca"), std::string::npos) << refused.status();
}

}  // namespace
}  // namespace specstream
