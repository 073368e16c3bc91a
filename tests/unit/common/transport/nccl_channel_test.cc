// The NCCL payload transport between two processes. The GPU cases need a CUDA
// device and skip without one; the argument checks run everywhere. The test
// process is the student (rank 1, receiver); `--nccl-peer MODE` re-executes
// this binary as the teacher (rank 0, sender), taking the communicator id and
// the payload sizes from the environment.
#include "common/transport/nccl_channel.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/transport/nccl_util.h"
#include "cuda_runtime_api.h"
#include "gtest/gtest.h"
#include "tests/testing/nccl_peer.h"

namespace specstream {
namespace {

using testing::FillPattern;
using testing::FirstMismatch;

constexpr uint64_t kPiece = NcclChannel::kPieceBytes;

// Payload i travels from device memory on the sender when odd, and into
// device memory on the receiver when (i / 2) is odd: every pairing of host
// and device ends in the "mixed" runs.
bool SenderOnDevice(size_t i) { return i % 2 == 1; }
bool ReceiverOnDevice(size_t i) { return (i / 2) % 2 == 1; }

// The teacher side, in the child process. Modes:
//   send  - sends every payload of SPECSTREAM_NCCL_SIZES (pattern seed = index)
//   mixed - the same, from device memory for the payloads SenderOnDevice names
//   die   - sends the first payload but exits while staging its second piece
//   stall - joins, then sleeps without sending
int RunPeer(const std::string& mode) {
  const char* id_hex = std::getenv("SPECSTREAM_NCCL_ID");
  const char* sizes_csv = std::getenv("SPECSTREAM_NCCL_SIZES");
  const char* device = std::getenv("SPECSTREAM_NCCL_DEVICE");
  if (id_hex == nullptr || device == nullptr) return 10;
  NcclChannelOptions options;
  options.rank = 0;
  options.device = std::atoi(device);
  options.timeout = absl::Seconds(60);
  auto channel = NcclChannel::Join(testing::HexDecode(id_hex), options);
  if (!channel.ok()) {
    fprintf(stderr, "peer: join failed: %s\n", channel.status().ToString().c_str());
    return 11;
  }
  if (mode == "stall") {
    absl::SleepFor(absl::Seconds(30));
    return 0;
  }
  std::vector<uint64_t> sizes;
  for (absl::string_view s :
       absl::StrSplit(sizes_csv != nullptr ? sizes_csv : "", ',', absl::SkipEmpty())) {
    uint64_t v = 0;
    if (!absl::SimpleAtoi(s, &v)) return 12;
    sizes.push_back(v);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    absl::Status sent;
    if (mode == "mixed" && SenderOnDevice(i) && sizes[i] > 0) {
      std::string host(sizes[i], '\0');
      FillPattern(i, 0, sizes[i], host.data());
      void* device_buffer = nullptr;
      if (cudaMalloc(&device_buffer, sizes[i]) != cudaSuccess ||
          cudaMemcpy(device_buffer, host.data(), sizes[i], cudaMemcpyHostToDevice) != cudaSuccess) {
        return 14;
      }
      sent = (*channel)->SendDevice(device_buffer, sizes[i]);
      cudaFree(device_buffer);
    } else {
      sent = (*channel)->Send(sizes[i], [&](uint64_t offset, uint64_t n, char* dest) {
        if (mode == "die" && offset >= kPiece) _exit(3);  // killed mid-payload
        FillPattern(i, offset, n, dest);
      });
    }
    if (!sent.ok()) {
      fprintf(stderr, "peer: send %zu failed: %s\n", i, sent.ToString().c_str());
      return 13;
    }
  }
  return 0;
}

class NcclChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    devices_ = CudaDeviceCount();
    if (devices_ == 0) GTEST_SKIP() << "no CUDA device: the NCCL transport needs one per side";
  }

  // Starts the teacher peer in `mode`; returns its pid and the id joined.
  pid_t StartPeer(const std::string& mode, const std::vector<uint64_t>& sizes) {
    absl::StatusOr<std::string> id = NewNcclUniqueId();
    EXPECT_TRUE(id.ok()) << id.status();
    id_ = *id;
    auto env = testing::NcclPeerEnv(devices_, "specstream-test-teacher");
    env.emplace_back("SPECSTREAM_NCCL_ID", testing::HexEncode(id_));
    env.emplace_back("SPECSTREAM_NCCL_SIZES", absl::StrJoin(sizes, ","));
    env.emplace_back("SPECSTREAM_NCCL_DEVICE",
                     std::to_string(testing::NcclPeerDevice(devices_, 0)));
    const pid_t pid = testing::SpawnSelf({"--nccl-peer", mode}, env);
    EXPECT_GT(pid, 0);
    return pid;
  }

  absl::StatusOr<std::unique_ptr<NcclChannel>> JoinAsStudent(
      absl::Duration timeout, std::function<bool()> stopped = nullptr) {
    NcclChannelOptions options;
    options.rank = 1;
    options.device = testing::NcclPeerDevice(devices_, 1);
    options.timeout = timeout;
    options.stopped = std::move(stopped);
    return NcclChannel::Join(id_, options);
  }

  int devices_ = 0;
  std::string id_;
};

TEST_F(NcclChannelTest, PayloadsOfEverySizeArriveIntact) {
  // Across piece boundaries: 1 byte, unaligned, exactly one piece, one piece
  // and a bit, several pieces, an empty payload, and a small one after it.
  const std::vector<uint64_t> sizes = {1, 4097, kPiece, kPiece + 3, 3 * kPiece + 5, 0, 17};
  const pid_t peer = StartPeer("send", sizes);
  auto channel = JoinAsStudent(absl::Seconds(60));
  ASSERT_TRUE(channel.ok()) << channel.status();
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::string payload(sizes[i], '\0');
    const absl::Time start = absl::Now();
    ASSERT_TRUE((*channel)->Recv(payload.data(), payload.size()).ok()) << i;
    EXPECT_EQ(FirstMismatch(i, payload.data(), payload.size()), -1) << "payload " << i;
    printf("payload %zu: %llu bytes in %s\n", i, static_cast<unsigned long long>(sizes[i]),
           absl::FormatDuration(absl::Now() - start).c_str());
  }
  EXPECT_EQ(testing::WaitChild(peer, absl::Seconds(60)), 0);
  EXPECT_TRUE((*channel)->health().ok());
}

// Payloads sent from device memory (SendDevice) and received into it
// (RecvDevice) take the same pieces as host ones, so each kind pairs with
// the other: the bytes arrive intact in all four pairings.
TEST_F(NcclChannelTest, DeviceAndHostPayloadsPairEitherWay) {
  const std::vector<uint64_t> sizes = {kPiece + 3, 4097, 3 * kPiece + 5, 1, 17, kPiece, 2 * kPiece};
  const pid_t peer = StartPeer("mixed", sizes);
  auto channel = JoinAsStudent(absl::Seconds(60));
  ASSERT_TRUE(channel.ok()) << channel.status();
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::string payload(sizes[i], '\0');
    if (ReceiverOnDevice(i)) {
      void* device_buffer = nullptr;
      ASSERT_EQ(cudaMalloc(&device_buffer, sizes[i]), cudaSuccess);
      ASSERT_TRUE((*channel)->RecvDevice(device_buffer, sizes[i]).ok()) << i;
      ASSERT_EQ(cudaMemcpy(payload.data(), device_buffer, sizes[i], cudaMemcpyDeviceToHost),
                cudaSuccess);
      cudaFree(device_buffer);
    } else {
      ASSERT_TRUE((*channel)->Recv(payload.data(), payload.size()).ok()) << i;
    }
    EXPECT_EQ(FirstMismatch(i, payload.data(), payload.size()), -1)
        << "payload " << i << (SenderOnDevice(i) ? " from device" : " from host")
        << (ReceiverOnDevice(i) ? " into device" : " into host");
  }
  EXPECT_EQ(testing::WaitChild(peer, absl::Seconds(60)), 0);
  EXPECT_TRUE((*channel)->health().ok());
}

// The teacher exits right after its last Send returns, while the last
// bytes may still be in NCCL's hands: closing the channel finalizes the
// communicator, so they arrive.
TEST_F(NcclChannelTest, SenderThatExitsAfterItsLastSendStillDeliversIt) {
  const std::vector<uint64_t> sizes = {3 * kPiece + 5, 3 * kPiece + 5, 3 * kPiece + 5};
  const pid_t peer = StartPeer("send", sizes);
  auto channel = JoinAsStudent(absl::Seconds(60));
  ASSERT_TRUE(channel.ok()) << channel.status();
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i + 1 == sizes.size()) absl::SleepFor(absl::Milliseconds(500));  // the sender waits
    std::string payload(sizes[i], '\0');
    ASSERT_TRUE((*channel)->Recv(payload.data(), payload.size()).ok()) << i;
    EXPECT_EQ(FirstMismatch(i, payload.data(), payload.size()), -1) << "payload " << i;
  }
  EXPECT_EQ(testing::WaitChild(peer, absl::Seconds(60)), 0);
}

TEST_F(NcclChannelTest, PeerThatNeverJoinsTimesOut) {
  absl::StatusOr<std::string> id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok());
  id_ = *id;
  const absl::Time start = absl::Now();
  auto channel = JoinAsStudent(absl::Seconds(3));
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(channel.ok());
  EXPECT_EQ(channel.status().code(), absl::StatusCode::kDeadlineExceeded) << channel.status();
  EXPECT_LT(took, absl::Seconds(20)) << "join should give up at its timeout";
  printf("no peer: %s after %s\n", channel.status().ToString().c_str(),
         absl::FormatDuration(took).c_str());
}

TEST_F(NcclChannelTest, PeerKilledMidPayloadFailsTheReceiveInsteadOfHanging) {
  const uint64_t size = 3 * kPiece;
  const pid_t peer = StartPeer("die", {size});
  auto channel = JoinAsStudent(absl::Seconds(30));
  ASSERT_TRUE(channel.ok()) << channel.status();
  std::string payload(size, '\0');
  const absl::Time start = absl::Now();
  const absl::Status received = (*channel)->Recv(payload.data(), size);
  const absl::Duration took = absl::Now() - start;
  EXPECT_FALSE(received.ok());
  EXPECT_LT(took, absl::Seconds(45));
  printf("peer died: %s after %s\n", received.ToString().c_str(),
         absl::FormatDuration(took).c_str());
  EXPECT_EQ(testing::WaitChild(peer, absl::Seconds(30)), 3);
  // Broken for good: the next call returns the first error at once.
  EXPECT_EQ((*channel)->Recv(payload.data(), size), (*channel)->health());
  EXPECT_FALSE((*channel)->health().ok());
}

TEST_F(NcclChannelTest, EndOfStreamCancelsAWaitingReceive) {
  const pid_t peer = StartPeer("stall", {});
  const absl::Time start = absl::Now();
  std::atomic<bool> stop{false};
  auto channel = JoinAsStudent(absl::Seconds(60), [&] { return stop.load(); });
  ASSERT_TRUE(channel.ok()) << channel.status();
  std::thread stopper([&] {
    absl::SleepFor(absl::Seconds(1));
    stop = true;
  });
  std::string payload(kPiece, '\0');
  const absl::Status received = (*channel)->Recv(payload.data(), payload.size());
  stopper.join();
  EXPECT_EQ(received.code(), absl::StatusCode::kCancelled) << received;
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  testing::WaitChild(peer, absl::ZeroDuration());  // kills the stalled peer
}

// Runs with or without a GPU: arguments are checked before any device work.
TEST(NcclChannelArgsTest, RefusesMalformedIdsRanksAndDevices) {
  NcclChannelOptions options;
  auto short_id = NcclChannel::Join("too short", options);
  EXPECT_EQ(short_id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_id.status().message().find("nccl_unique_id: 9 bytes"), std::string::npos)
      << short_id.status();
  const std::string id(NCCL_UNIQUE_ID_BYTES, '\0');
  options.rank = 2;
  EXPECT_EQ(NcclChannel::Join(id, options).status().code(), absl::StatusCode::kInvalidArgument);
  options.rank = 1;
  options.device = CudaDeviceCount();  // one past the last
  auto no_device = NcclChannel::Join(id, options);
  EXPECT_EQ(no_device.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(no_device.status().message().find("device(s) visible"), std::string::npos)
      << no_device.status();
}

}  // namespace
}  // namespace specstream

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "--nccl-peer") return specstream::RunPeer(argv[2]);
  // This process is the student: its NCCL environment must be in place
  // before the first NCCL call.
  specstream::testing::ApplyEnv(
      specstream::testing::NcclPeerEnv(specstream::CudaDeviceCount(), "specstream-test-student"));
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
