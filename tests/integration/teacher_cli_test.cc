// specstream-teacher as a user runs it: init-random, forward, dump and serve,
// with tensor parallelism across worker processes (--devices cpu,cpu).
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/offline_store.h"
#include "common/transport/contract.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "specstream/v1/teacher.grpc.pb.h"
#include "tests/testing/testing.h"

extern char** environ;

namespace specstream {
namespace {

class TeacherCliTest : public ::testing::Test {
 protected:
  int Run(const std::string& args) {
    return testing::RunCommand(std::string(SPECSTREAM_TEACHER_PATH) + " " + args,
                               dir_.Join("stdout"), dir_.Join("stderr"));
  }
  std::string Stdout() { return testing::ReadFile(dir_.Join("stdout")); }
  std::string Stderr() { return testing::ReadFile(dir_.Join("stderr")); }

  // "name dtype [shape] sum=S abs_sum=A" lines -> name -> (sum, abs_sum).
  std::map<std::string, std::pair<double, double>> Checksums() {
    std::map<std::string, std::pair<double, double>> out;
    std::istringstream lines(Stdout());
    std::string line;
    while (std::getline(lines, line)) {
      size_t sum = line.find(" sum="), abs = line.find(" abs_sum=");
      if (sum == std::string::npos || abs == std::string::npos) continue;
      out[line.substr(0, line.find(' '))] = {std::stod(line.substr(sum + 5)),
                                             std::stod(line.substr(abs + 9))};
    }
    return out;
  }
  std::string Line(const std::string& prefix) {
    std::istringstream lines(Stdout());
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind(prefix, 0) == 0) return line;
    }
    return "";
  }

  void InitModel(const std::string& extra = "") {
    ASSERT_EQ(Run("init-random --arch qwen2 --layers 8 --hidden 64 --heads 4 --kv-heads 2 "
                  "--intermediate 128 --vocab 512 --shards 2 --seed 3 --dtype float32 --out " +
                  dir_.Join("model") + " " + extra),
              0)
        << Stderr();
  }

  testing::TempDir dir_;
};

TEST_F(TeacherCliTest, ForwardWithTwoProcessTensorParallelismMatchesOneRank) {
  InitModel();
  const std::string ids = "--ids 1,5,9,200,17,33,2,511,8,8,8";
  ASSERT_EQ(Run("forward --model " + dir_.Join("model") + " --dtype float32 " + ids), 0)
      << Stderr();
  auto single = Checksums();
  std::string single_targets = Line("target_ids 1") + Line("target_ids ");
  ASSERT_EQ(
      Run("forward --model " + dir_.Join("model") + " --dtype float32 --devices cpu,cpu " + ids), 0)
      << Stderr();
  auto tp = Checksums();
  std::string tp_targets = Line("target_ids 1") + Line("target_ids ");
  ASSERT_EQ(single.size(), 3u) << Stdout();
  for (const char* name : {"aux_hidden", "last_hidden"}) {
    EXPECT_NEAR(tp[name].second, single[name].second, 1e-5 * single[name].second) << name;
    EXPECT_NEAR(tp[name].first, single[name].first, 1e-5 * single[name].second) << name;
  }
  EXPECT_EQ(tp_targets, single_targets);
  EXPECT_NE(Line("capture_layer_ids"), "");
}

TEST_F(TeacherCliTest, DumpWithTensorParallelismWritesTheStore) {
  InitModel();
  std::string data;
  for (int i = 0; i < 7; ++i) {
    data += "{\"input_ids\":[" + std::to_string(i + 1) + ",2,3,4,5],\"loss_mask\":[0,0,1,1,1]}\n";
  }
  testing::WriteFile(dir_.Join("data.jsonl"), data);
  ASSERT_EQ(Run("dump --model " + dir_.Join("model") + " --devices cpu,cpu --data " +
                dir_.Join("data.jsonl") + " --out " + dir_.Join("store") +
                " --keep-target-ids --shard-samples 3 --batch-tokens 16"),
            0)
      << Stderr();
  auto reader = StoreReader::Open(dir_.Join("store"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->complete());
  EXPECT_EQ((*reader)->num_samples(), 7);
  EXPECT_EQ((*reader)->num_shards(), 3);
  EXPECT_EQ((*reader)->num_tokens(), 35);
  EXPECT_NE(Stderr().find("dump: wrote 7 samples"), std::string::npos) << Stderr();
}

TEST_F(TeacherCliTest, ImpossibleLayoutsAndBadInputFailFastWithReasons) {
  InitModel();
  // 4 heads over 3 ranks: refused by every rank, reported by the leader.
  EXPECT_EQ(Run("forward --model " + dir_.Join("model") + " --devices cpu,cpu,cpu --ids 1,2"), 2);
  EXPECT_NE(Stderr().find("num_attention_heads 4 is not divisible"), std::string::npos) << Stderr();
  EXPECT_EQ(Run("forward --model " + dir_.Join("model") + " --ids 1,512"), 2);
  EXPECT_NE(Stderr().find("outside the vocab"), std::string::npos) << Stderr();
  EXPECT_EQ(Run("forward --model " + dir_.Join("model") + " --devices gpu0 --ids 1"), 2);
  EXPECT_NE(Stderr().find("unknown device \"gpu0\""), std::string::npos) << Stderr();
  EXPECT_EQ(Run("forward --model " + dir_.Join("model") + " --devices cpu,cuda:0 --ids 1"), 2);
  EXPECT_NE(Stderr().find("the TP ranks of a teacher are all cpu or all CUDA devices"),
            std::string::npos)
      << Stderr();
  // CUDA devices serve where LibTorch has CUDA and the GPUs (TP over NCCL);
  // elsewhere they are refused by name.
  for (const std::string devices : {"cuda:0", "cuda:0,cuda:1"}) {
    if (const int rc =
            Run("forward --model " + dir_.Join("model") + " --devices " + devices + " --ids 1");
        rc != 0) {
      EXPECT_EQ(rc, 2) << devices;
      EXPECT_NE(Stderr().find("\"cuda:0\" needs CUDA"), std::string::npos)
          << devices << ": " << Stderr();
    }
  }
  EXPECT_EQ(Run("init-random --arch gpt2 --layers 2 --hidden 8 --heads 2 --kv-heads 2 "
                "--intermediate 8 --vocab 8 --out " +
                dir_.Join("x")),
            2);
  EXPECT_NE(Stderr().find("--arch"), std::string::npos) << Stderr();
  // serve's NCCL device: a word it does not know, and (on a machine without
  // that many CUDA devices, or a build without NCCL) a device it cannot use.
  const std::string serve = "serve --model " + dir_.Join("model") + " --port 0 ";
  EXPECT_EQ(Run(serve + "--nccl-device gpu"), 2);
  EXPECT_NE(Stderr().find("--nccl-device: \"gpu\" is not auto, none or a device index"),
            std::string::npos)
      << Stderr();
  EXPECT_EQ(Run(serve + "--nccl-device 64"), 2);
  EXPECT_NE(Stderr().find("nccl_device: "), std::string::npos) << Stderr();
  EXPECT_EQ(Run(serve + "--nccl-timeout 0"), 2);
  EXPECT_NE(Stderr().find("--nccl-timeout must be > 0"), std::string::npos) << Stderr();
  // P13 item 20: capture ids no EAGLE-3 draft can use are refused before the
  // model loads (the 8-layer model: ids must be 3, ascending, below 7) ...
  for (const std::string ids : {"1,2", "1,4,7", "4,2,1"}) {
    EXPECT_EQ(Run("dump --model " + dir_.Join("model") + " --data " + dir_.Join("none.jsonl") +
                  " --out " + dir_.Join("store") + " --capture-layers " + ids),
              2)
        << ids;
    EXPECT_NE(Stderr().find("--capture-layers: "), std::string::npos) << ids << ": " << Stderr();
    EXPECT_NE(Stderr().find("--capture-for any"), std::string::npos) << Stderr();
  }
  // P13 item 1: no token, no stream for whoever reaches a non-loopback port;
  // said before the model loads.
  EXPECT_EQ(Run(serve + "--host 0.0.0.0"), 2);
  EXPECT_NE(Stderr().find("--token-file: required to serve on 0.0.0.0"), std::string::npos)
      << Stderr();
  EXPECT_EQ(Run(serve + "--coordinator 127.0.0.1:1"), 2);
  EXPECT_NE(Stderr().find("--token-file: required with --coordinator"), std::string::npos)
      << Stderr();
  EXPECT_EQ(Run(serve + "--capture-layers 1,7,2"), 2);
  EXPECT_NE(Stderr().find("--capture-layers: "), std::string::npos) << Stderr();
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("store")));
  // ... unless they are meant for something else.
  ASSERT_EQ(Run("forward --model " + dir_.Join("model") +
                " --ids 1,2 --capture-layers 1,7 "
                "--capture-for any"),
            0)
      << Stderr();
  EXPECT_NE(Stdout().find("capture_layer_ids [1, 7]"), std::string::npos) << Stdout();
}

// A MoE target through the CLI: `--tp 2 --ep 2` (experts split over two
// worker processes, all-to-all dispatch) prints the captures `--tp 1` does;
// the layouts that cannot work are refused from config.json with a reason.
TEST_F(TeacherCliTest, MoeExpertParallelForwardMatchesOneRankAndBadLayoutsAreRefused) {
  ASSERT_EQ(Run("init-random --arch mixtral --experts 4 --top-k 2 --layers 8 --hidden 64 "
                "--heads 4 --kv-heads 2 --intermediate 64 --vocab 512 --seed 5 --dtype float32 "
                "--out " +
                dir_.Join("moe")),
            0)
      << Stderr();
  const std::string forward = "forward --runtime sglang --model " + dir_.Join("moe") +
                              " --ids 1,5,9,200,17,33,2,511,8,8,8,70,71,72 ";
  ASSERT_EQ(Run(forward), 0) << Stderr();
  auto single = Checksums();
  const std::string single_targets = Line("target_ids ");
  ASSERT_EQ(Run(forward + "--tp 2 --ep 2"), 0) << Stderr();
  auto ep = Checksums();
  ASSERT_EQ(single.size(), 3u) << Stdout();
  for (const char* name : {"aux_hidden", "last_hidden"}) {
    EXPECT_NEAR(ep[name].second, single[name].second, 1e-5 * single[name].second) << name;
    EXPECT_NEAR(ep[name].first, single[name].first, 1e-5 * single[name].second) << name;
  }
  EXPECT_EQ(Line("target_ids "), single_targets);

  EXPECT_EQ(Run(forward + "--tp 2 --ep 4"), 2);
  EXPECT_NE(Stderr().find("--ep 4 does not divide the tensor-parallel size 2"), std::string::npos)
      << Stderr();
  EXPECT_EQ(Stderr().find("tp: started"), std::string::npos) << "refused after spawning workers";
  EXPECT_EQ(Run(forward + "--tp 3 --devices cpu,cpu"), 2);
  EXPECT_NE(Stderr().find("--tp 3 does not match the 2 --devices"), std::string::npos) << Stderr();
  EXPECT_EQ(Run("forward --model " + dir_.Join("moe") + " --tp 2 --ids 1,2"), 2);
  EXPECT_NE(Stderr().find("--runtime sglang"), std::string::npos) << Stderr();
  InitModel();  // dense qwen2
  EXPECT_EQ(
      Run("forward --runtime sglang --model " + dir_.Join("model") + " --tp 2 --ep 2 --ids 1"), 2);
  EXPECT_NE(Stderr().find("has no experts"), std::string::npos) << Stderr();
}

// `serve` with two TP ranks: port 0 written to --port-file, Describe, one
// sample streamed inline, then SIGTERM with the stream still open: the
// stream ends UNAVAILABLE (drained) and the process exits 0 well within the
// shutdown deadline, its worker reaped.
TEST_F(TeacherCliTest, ServeStreamsSamplesAndExitsCleanlyOnSigterm) {
  InitModel();
  const std::string port_file = dir_.Join("port");
  const std::string command =
      absl::StrCat("exec ", SPECSTREAM_TEACHER_PATH, " serve --model ", dir_.Join("model"),
                   " --devices cpu,cpu --dtype float32 --port 0 --port-file ", port_file,
                   " --payload-dtype float32 --keep-target-ids --max-tokens 256",
                   " --shutdown-timeout 30 >", dir_.Join("stdout"), " 2>", dir_.Join("stderr"));
  const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  auto exited = [&](std::chrono::seconds timeout, int* wstatus) {
    return testing::WaitUntil([&] { return waitpid(pid, wstatus, WNOHANG) == pid; },
                              absl::FromChrono(timeout));
  };
  struct Reaper {  // a failed assertion never leaves the server running
    pid_t pid;
    bool reaped = false;
    ~Reaper() {
      if (!reaped) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  } reaper{pid};

  int wstatus = 0;
  bool died = false;
  testing::WaitUntil(
      [&] {
        died = waitpid(pid, &wstatus, WNOHANG) == pid;
        return died || testing::FileExists(port_file);
      },
      absl::Seconds(120));
  reaper.reaped = died;
  if (!testing::FileExists(port_file)) {
    ASSERT_FALSE(died) << "serve exited (" << wstatus << "): " << Stderr();
    FAIL() << "no port file: " << Stderr();
  }
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripSuffix(testing::ReadFile(port_file), "\n"), &port));
  ASSERT_GT(port, 0);
  EXPECT_NE(Stdout().find(absl::StrCat("listening on 127.0.0.1:", port)), std::string::npos)
      << Stdout();
  // The binary re-executed itself with passive idle OpenMP workers
  // (common/openmp_wait.h), the test's environment having chosen no policy.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    EXPECT_NE(
        testing::ReadFile(absl::StrCat("/proc/", pid, "/environ")).find("OMP_WAIT_POLICY=PASSIVE"),
        std::string::npos);
  }

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = v1::TeacherService::NewStub(channel);
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::DescribeResponse d;
    grpc::Status status = stub->Describe(&context, v1::DescribeRequest(), &d);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(d.model_type(), "qwen2");
    EXPECT_EQ(d.hidden_size(), 64);
    EXPECT_EQ(d.vocab_size(), 512);
    EXPECT_EQ(d.dtype(), v1::DTYPE_F32);
    EXPECT_EQ(d.max_tokens(), 256);
  }

  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = stub->StreamHiddenStates(context.get());
  v1::StreamRequest request;
  request.mutable_open()->set_transport(v1::TRANSPORT_INLINE);
  ASSERT_TRUE(stream->Write(request));
  request.mutable_credit()->set_n(1);
  ASSERT_TRUE(stream->Write(request));
  v1::StreamRequest::SampleRequest* sample = request.mutable_sample();
  sample->set_request_id(1);
  sample->set_sample_id(42);
  for (int id : {1, 5, 9, 200, 17, 33, 2, 511}) sample->add_token_ids(id);
  ASSERT_TRUE(stream->Write(request));
  v1::StreamResponse response;
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_TRUE(response.has_opened()) << response.DebugString();
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_TRUE(response.has_header()) << response.DebugString();
  const v1::TensorContract contract = response.header().contract();
  EXPECT_EQ(response.header().sample_id(), 42);
  ASSERT_EQ(contract.tensors_size(), 5);  // with target_ids
  EXPECT_EQ(contract.tensors(2).name(), "aux_hidden");
  EXPECT_EQ(contract.tensors(2).shape(1), 3 * 64);
  std::string payload;
  while (payload.size() < contract.payload_bytes()) {
    ASSERT_TRUE(stream->Read(&response));
    ASSERT_TRUE(response.has_chunk()) << response.DebugString();
    payload += response.chunk().data();
  }
  EXPECT_TRUE(VerifyPayload(contract, payload).ok());

  const auto signalled = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  EXPECT_FALSE(stream->Read(&response));
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  // The server's shutdown completes once its connections close; an idle
  // synchronous client would notice the GOAWAY only at its next backup poll.
  stream.reset();
  context.reset();  // holds the channel too
  stub.reset();
  channel.reset();
  reaper.reaped = exited(std::chrono::seconds(40), &wstatus);
  ASSERT_TRUE(reaper.reaped) << "serve did not exit after SIGTERM: " << Stderr();
  EXPECT_LT(std::chrono::steady_clock::now() - signalled, std::chrono::seconds(30));
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus << " " << Stderr();
  EXPECT_NE(Stderr().find("shut down (1 stream(s), 1 sample(s) sent"), std::string::npos)
      << Stderr();
}

}  // namespace
}  // namespace specstream
