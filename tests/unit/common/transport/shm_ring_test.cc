#include "common/transport/shm_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specstream {
namespace {

using ::testing::HasSubstr;

// A name no other test (or concurrent run of this binary) uses.
std::string UniqueName() {
  static std::atomic<int> counter{0};
  return "/specstream-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

std::unique_ptr<ShmRing> MustCreate(const std::string& name, uint64_t capacity) {
  ShmRingOptions options;
  options.name = name;
  options.capacity = capacity;
  auto ring = ShmRing::Create(options);
  EXPECT_TRUE(ring.ok()) << ring.status();
  return ring.ok() ? std::move(*ring) : nullptr;
}

void Fill(std::mt19937_64& rng, absl::Span<char> data) {
  for (char& c : data) c = static_cast<char>(rng());
}

// Where a record lies, as the teacher would send it over gRPC.
struct Locator {
  uint64_t position;
  uint64_t size;
  uint32_t crc;
};

// P13 item 13: rings used to stay in /dev/shm until their owner's
// destructor ran (never, for a killed rank). Unlinked once attached, both
// mappings keep working and nothing is left behind.
TEST(ShmRingTest, UnlinkedOnceAttachedTheRingStillWorksAndLeavesNoName) {
  const std::string name = UniqueName();
  auto consumer = MustCreate(name, 16384);
  ASSERT_NE(consumer, nullptr);
  auto producer = ShmRing::Attach(name);
  ASSERT_TRUE(producer.ok()) << producer.status();
  EXPECT_TRUE(consumer->linked());
  EXPECT_TRUE(std::filesystem::exists("/dev/shm" + name));
  ASSERT_TRUE(consumer->Unlink().ok());
  EXPECT_FALSE(consumer->linked());
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + name));
  EXPECT_TRUE(consumer->Unlink().ok());     // again: nothing to do
  EXPECT_TRUE((*producer)->Unlink().ok());  // not the owner: nothing to do
  EXPECT_EQ(ShmRing::Attach(name).status().code(), absl::StatusCode::kNotFound);
  auto r = (*producer)->Reserve(5, absl::Seconds(1));
  ASSERT_TRUE(r.ok()) << r.status();
  std::memcpy(r->data.data(), "after", 5);
  ASSERT_TRUE((*producer)->Commit().ok());
  auto read = consumer->Read(r->position, 5);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(std::string(read->data(), read->size()), "after");
}

TEST(ShmRingTest, CreateAttachWriteRead) {
  const std::string name = UniqueName();
  auto consumer = MustCreate(name, 16384);
  ASSERT_NE(consumer, nullptr);
  EXPECT_TRUE(consumer->owner());
  auto producer = ShmRing::Attach(name);
  ASSERT_TRUE(producer.ok()) << producer.status();
  EXPECT_FALSE((*producer)->owner());
  EXPECT_EQ((*producer)->capacity(), 16384u);

  auto r = (*producer)->Reserve(5, absl::Seconds(1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->position, 0u);
  std::memcpy(r->data.data(), "hello", 5);
  // Not visible before Commit.
  EXPECT_EQ(consumer->Read(0, 5).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*producer)->Commit().ok());
  EXPECT_EQ(consumer->committed().value_or(0), 5u);
  auto span = consumer->Read(0, 5);
  ASSERT_TRUE(span.ok()) << span.status();
  EXPECT_EQ(std::string(span->data(), span->size()), "hello");
  ASSERT_TRUE(consumer->Release(5).ok());
  EXPECT_EQ((*producer)->released().value_or(0), 5u);
}

TEST(ShmRingTest, ProducerAndConsumerThreadsMoveRandomRecords) {
  const std::string name = UniqueName();
  auto consumer = MustCreate(name, 65536);
  ASSERT_NE(consumer, nullptr);
  auto attached = ShmRing::Attach(name);
  ASSERT_TRUE(attached.ok());
  std::unique_ptr<ShmRing> producer = std::move(*attached);

  constexpr int kRecords = 1000;
  absl::Mutex mu;
  std::deque<Locator> queue;  // the "gRPC stream", guarded by mu
  absl::Status producer_status;
  std::thread producer_thread([&] {
    std::mt19937_64 rng(11);
    for (int i = 0; i < kRecords; ++i) {
      const uint64_t n = 1 + rng() % 30000;  // many records straddle the end
      auto r = producer->Reserve(n, absl::Seconds(10));
      if (!r.ok()) {
        producer_status = r.status();
        return;
      }
      Fill(rng, r->data);
      const uint32_t crc = Crc32c(r->data.data(), r->data.size());
      if (absl::Status s = producer->Commit(); !s.ok()) {
        producer_status = s;
        return;
      }
      absl::MutexLock lock(&mu);
      queue.push_back({r->position, n, crc});
    }
  });

  uint64_t bytes = 0, last_end = 0;
  int received = 0, padded = 0;
  std::string out;
  for (; received < kRecords; ++received) {
    Locator loc;
    {
      absl::MutexLock lock(&mu);
      auto ready = [&] { return !queue.empty(); };
      if (!mu.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(20))) break;
      loc = queue.front();
      queue.pop_front();
    }
    if (loc.position != last_end) ++padded;
    auto span = consumer->Read(loc.position, loc.size);
    ASSERT_TRUE(span.ok()) << span.status();
    out.assign(span->data(), span->size());  // copy out, as a receiver does
    ASSERT_TRUE(consumer->Release(loc.position + loc.size).ok());
    ASSERT_EQ(Crc32c(out), loc.crc) << "record " << received;
    bytes += loc.size;
    last_end = loc.position + loc.size;
  }
  producer_thread.join();
  ASSERT_TRUE(producer_status.ok()) << producer_status;
  EXPECT_EQ(received, kRecords);
  EXPECT_GT(bytes, 10u * 65536);  // wrapped many times
  EXPECT_GT(padded, 0);           // and padded at the end instead of splitting
}

TEST(ShmRingTest, RecordsNeverWrapTheyPadToTheStart) {
  auto ring = MustCreate(UniqueName(), 4096);
  ASSERT_NE(ring, nullptr);
  auto a = ring->Reserve(3000, absl::Seconds(1));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(ring->Commit().ok());
  ASSERT_TRUE(ring->Release(3000).ok());
  auto b = ring->Reserve(2000, absl::Seconds(1));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->position, 4096u);  // skipped 1096 bytes of padding
  ASSERT_TRUE(ring->Commit().ok());
  auto span = ring->Read(4096, 2000);
  ASSERT_TRUE(span.ok());
  EXPECT_EQ(span->data(), b->data.data());
  // A committed range that straddles the end (padding included) is refused.
  auto straddle = ring->Read(4000, 200);
  EXPECT_EQ(straddle.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(straddle.status().message()), HasSubstr("wrap"));
  ASSERT_TRUE(ring->Release(6096).ok());
  auto c = ring->Reserve(2000, absl::Seconds(1));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->position, 6096u);  // index 2000: fits before the end, no padding
}

TEST(ShmRingTest, FullRingBlocksThenTimesOutOrWakesOnRelease) {
  auto ring = MustCreate(UniqueName(), 4096);
  ASSERT_NE(ring, nullptr);
  ASSERT_TRUE(ring->Reserve(3000, absl::Seconds(1)).ok());
  ASSERT_TRUE(ring->Commit().ok());

  auto start = std::chrono::steady_clock::now();
  auto r = ring->Reserve(2000, absl::Milliseconds(100));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("no room for 2000 bytes"));
  EXPECT_GE(waited, 0.099);

  // A blocked producer wakes when the consumer releases.
  std::atomic<bool> released{false};
  std::thread consumer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    released = true;
    ASSERT_TRUE(ring->Release(3000).ok());
  });
  start = std::chrono::steady_clock::now();
  r = ring->Reserve(2000, absl::Seconds(20));
  const double blocked =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  consumer.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(released);
  EXPECT_EQ(r->position, 4096u);
  EXPECT_LT(blocked, 10.0);  // woken, not timed out
}

TEST(ShmRingTest, MisuseIsRefused) {
  auto ring = MustCreate(UniqueName(), 4096);
  ASSERT_NE(ring, nullptr);
  EXPECT_EQ(ring->Reserve(0, absl::Seconds(1)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ring->Reserve(4097, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ring->Commit().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(ring->Reserve(100, absl::Seconds(1)).ok());
  EXPECT_EQ(ring->Reserve(100, absl::Seconds(1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(ring->Commit().ok());
  EXPECT_EQ(ring->Read(50, 51).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ring->Release(101).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(ring->Release(60).ok());
  EXPECT_EQ(ring->Release(50).code(), absl::StatusCode::kInvalidArgument);            // backwards
  EXPECT_EQ(ring->Read(50, 10).status().code(), absl::StatusCode::kInvalidArgument);  // released
  EXPECT_TRUE(ring->Read(60, 40).ok());
}

TEST(ShmRingTest, BadOptionsAndNames) {
  ShmRingOptions options;
  options.name = UniqueName();
  options.capacity = 5000;  // not a power of two
  EXPECT_EQ(ShmRing::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.capacity = 2048;  // too small
  EXPECT_EQ(ShmRing::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.capacity = 4096;
  for (const char* bad : {"", "/", "no-slash", "/a/b", "/sp ace"}) {
    options.name = bad;
    EXPECT_EQ(ShmRing::Create(options).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ShmRing::Attach("bad").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShmRingTest, AttachToMissingNameIsNotFoundAndOwnerUnlinks) {
  const std::string name = UniqueName();
  auto missing = ShmRing::Attach(name);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr(name));

  auto ring = MustCreate(name, 4096);
  ASSERT_NE(ring, nullptr);
  ShmRingOptions again;
  again.name = name;
  again.capacity = 4096;
  EXPECT_EQ(ShmRing::Create(again).status().code(), absl::StatusCode::kAlreadyExists);
  auto attached = ShmRing::Attach(name);
  ASSERT_TRUE(attached.ok());
  attached->reset();  // a non-owner leaves the name in place
  EXPECT_TRUE(ShmRing::Attach(name).ok());
  ring.reset();
  EXPECT_EQ(ShmRing::Attach(name).status().code(), absl::StatusCode::kNotFound);
}

// Creates a raw shared-memory object `name` of `size` bytes holding `prefix`.
void MakeRawSegment(const std::string& name, size_t size, const std::string& prefix) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
  ASSERT_EQ(pwrite(fd, prefix.data(), prefix.size(), 0), static_cast<ssize_t>(prefix.size()));
  close(fd);
}

TEST(ShmRingTest, CorruptSegmentsAreDataLoss) {
  const std::string tiny = UniqueName();
  MakeRawSegment(tiny, 100, "");
  auto r = ShmRing::Attach(tiny);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("too small"));
  shm_unlink(tiny.c_str());

  const std::string zeros = UniqueName();
  MakeRawSegment(zeros, ShmRing::kHeaderBytes + 4096, "");
  r = ShmRing::Attach(zeros);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("bad magic"));
  shm_unlink(zeros.c_str());

  // A real ring whose version and then capacity are overwritten.
  const std::string name = UniqueName();
  auto ring = MustCreate(name, 8192);
  ASSERT_NE(ring, nullptr);
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  const uint32_t bad_version = 99;
  ASSERT_EQ(pwrite(fd, &bad_version, 4, 8), 4);
  r = ShmRing::Attach(name);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("layout version 99"));
  const uint32_t good_version = ShmRing::kVersion;
  ASSERT_EQ(pwrite(fd, &good_version, 4, 8), 4);
  const uint64_t bad_capacity = 4096;
  ASSERT_EQ(pwrite(fd, &bad_capacity, 8, 16), 8);
  r = ShmRing::Attach(name);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("capacity 4096"));
  close(fd);
}

// Shrinks the shared-memory object `name` to `size` bytes, as a stray local
// process could while a teacher and a student map it.
void TruncateSegment(const std::string& name, off_t size) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0) << name;
  ASSERT_EQ(ftruncate(fd, size), 0);
  close(fd);
}

// P13 item 6: a local process that truncated a student's ring after the
// teacher attached killed the teacher with SIGBUS on its next access. Every
// access now ends with DataLoss naming the ring, the process lives on, and a
// second ring in the same process is untouched.
TEST(ShmRingTest, TruncatedToNothingEveryAccessIsDataLossAndOtherRingsWork) {
  const std::string name = UniqueName();
  auto consumer = MustCreate(name, 16384);
  ASSERT_NE(consumer, nullptr);
  auto producer = ShmRing::Attach(name);
  ASSERT_TRUE(producer.ok()) << producer.status();
  const std::string other_name = UniqueName();
  auto other_consumer = MustCreate(other_name, 16384);
  ASSERT_NE(other_consumer, nullptr);
  auto other_producer = ShmRing::Attach(other_name);
  ASSERT_TRUE(other_producer.ok()) << other_producer.status();

  auto before = (*producer)->Reserve(5, absl::Seconds(1));
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_TRUE((*producer)->Commit().ok());

  TruncateSegment(name, 0);
  auto expect_lost = [&name](const absl::Status& status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(name));
    EXPECT_THAT(std::string(status.message()), HasSubstr("truncated"));
  };
  // The teacher's side: header loads and stores.
  expect_lost((*producer)->Reserve(5, absl::Seconds(1)).status());
  expect_lost((*producer)->Commit());
  expect_lost((*producer)->committed().status());
  // The student's side, through its own mapping.
  expect_lost(consumer->Read(0, 5).status());
  char out[5];
  expect_lost(consumer->CopyOut(0, absl::Span<char>(out, 5)));
  expect_lost(consumer->Release(5));
  expect_lost(consumer->released().status());
  // Attaching anew sees the segment too small.
  EXPECT_EQ(ShmRing::Attach(name).status().code(), absl::StatusCode::kDataLoss);

  auto r = (*other_producer)->Reserve(5, absl::Seconds(1));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE((*other_producer)
                  ->Fill([](absl::Span<char> dest) { std::memcpy(dest.data(), "alive", 5); })
                  .ok());
  ASSERT_TRUE((*other_producer)->Commit().ok());
  ASSERT_TRUE(other_consumer->CopyOut(r->position, absl::Span<char>(out, 5)).ok());
  EXPECT_EQ(std::string(out, 5), "alive");
  EXPECT_TRUE(other_consumer->Release(5).ok());
}

// Truncated to its header page: the positions still read, but the record
// bytes are gone. The copy into the reservation is DataLoss, and from then on
// the ring is lost (Commit does not publish a record that was never written).
TEST(ShmRingTest, TruncatedUnderAReservationTheCopyIsDataLossAndTheRingIsLost) {
  const std::string name = UniqueName();
  auto consumer = MustCreate(name, 16384);
  ASSERT_NE(consumer, nullptr);
  auto producer = ShmRing::Attach(name);
  ASSERT_TRUE(producer.ok()) << producer.status();
  auto r = (*producer)->Reserve(8000, absl::Seconds(1));
  ASSERT_TRUE(r.ok()) << r.status();

  TruncateSegment(name, static_cast<off_t>(ShmRing::kHeaderBytes));
  bool copied = false;
  const absl::Status fill = (*producer)->Fill([&copied](absl::Span<char> dest) {
    std::memset(dest.data(), 'x', dest.size());
    copied = true;
  });
  EXPECT_FALSE(copied);  // abandoned at the first byte
  EXPECT_EQ(fill.code(), absl::StatusCode::kDataLoss) << fill;
  EXPECT_THAT(std::string(fill.message()), HasSubstr(name));
  EXPECT_THAT(std::string(fill.message()), HasSubstr("truncated"));
  EXPECT_THAT(std::string(fill.message()), HasSubstr("SIGBUS at byte 4096 of 20480"));
  const absl::Status commit = (*producer)->Commit();
  EXPECT_EQ(commit.code(), absl::StatusCode::kDataLoss) << commit;
  EXPECT_THAT(std::string(commit.message()), HasSubstr("the ring is lost"));
  EXPECT_EQ(consumer->committed().value_or(1), 0u);  // the header page is intact
}

// A copy whose source (not the ring) faults is DataLoss too, and the ring
// stays usable: the fault is not blamed on it.
TEST(ShmRingTest, AFaultOutsideTheRingIsDataLossButTheRingLives) {
  const std::string name = UniqueName();
  auto consumer = MustCreate(name, 16384);
  ASSERT_NE(consumer, nullptr);
  auto producer = ShmRing::Attach(name);
  ASSERT_TRUE(producer.ok()) << producer.status();

  // A one-page source mapping whose object is then emptied.
  const std::string source_name = UniqueName();
  const int fd = shm_open(source_name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  shm_unlink(source_name.c_str());
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  void* source = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(source, MAP_FAILED);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  close(fd);

  ASSERT_TRUE((*producer)->Reserve(100, absl::Seconds(1)).ok());
  const absl::Status fill = (*producer)->Fill(
      [source](absl::Span<char> dest) { std::memcpy(dest.data(), source, dest.size()); });
  EXPECT_EQ(fill.code(), absl::StatusCode::kDataLoss) << fill;
  EXPECT_THAT(std::string(fill.message()), HasSubstr("outside the ring"));
  munmap(source, 4096);
  ASSERT_TRUE(
      (*producer)->Fill([](absl::Span<char> dest) { std::memset(dest.data(), 'y', 100); }).ok());
  ASSERT_TRUE((*producer)->Commit().ok());
  std::string out(100, '\0');
  ASSERT_TRUE(consumer->CopyOut(0, absl::Span<char>(out.data(), out.size())).ok());
  EXPECT_EQ(out, std::string(100, 'y'));
}

// The consumer side: a committed record whose data page is gone.
TEST(ShmRingTest, TruncatedUnderACommittedRecordCopyOutIsDataLoss) {
  const std::string name = UniqueName();
  auto consumer = MustCreate(name, 16384);
  ASSERT_NE(consumer, nullptr);
  auto producer = ShmRing::Attach(name);
  ASSERT_TRUE(producer.ok()) << producer.status();
  ASSERT_TRUE((*producer)->Reserve(3, absl::Seconds(1)).ok());
  ASSERT_TRUE(
      (*producer)->Fill([](absl::Span<char> dest) { std::memcpy(dest.data(), "abc", 3); }).ok());
  ASSERT_TRUE((*producer)->Commit().ok());
  TruncateSegment(name, static_cast<off_t>(ShmRing::kHeaderBytes));
  char out[3];
  const absl::Status copy = consumer->CopyOut(0, absl::Span<char>(out, 3));
  EXPECT_EQ(copy.code(), absl::StatusCode::kDataLoss) << copy;
  EXPECT_THAT(std::string(copy.message()), HasSubstr("truncated"));
  EXPECT_EQ(consumer->Release(3).code(), absl::StatusCode::kDataLoss);
}

// The producer in a forked child process, locators over a pipe, as between a
// teacher and a student process.
TEST(ShmRingTest, CrossProcess) {
  const std::string name = UniqueName();
  auto consumer = MustCreate(name, 32768);
  ASSERT_NE(consumer, nullptr);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  constexpr int kRecords = 300;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    int code = 0;
    auto producer = ShmRing::Attach(name);
    if (!producer.ok()) _exit(2);
    std::mt19937_64 rng(21);
    for (int i = 0; i < kRecords && code == 0; ++i) {
      auto r = (*producer)->Reserve(1 + rng() % 12000, absl::Seconds(20));
      if (!r.ok()) {
        code = 3;
        break;
      }
      Fill(rng, r->data);
      Locator loc{r->position, r->data.size(), Crc32c(r->data.data(), r->data.size())};
      if (!(*producer)->Commit().ok()) code = 4;
      if (write(fds[1], &loc, sizeof(loc)) != sizeof(loc)) code = 5;
    }
    close(fds[1]);
    producer->reset();
    _exit(code);
  }
  close(fds[1]);
  int received = 0;
  Locator loc;
  while (read(fds[0], &loc, sizeof(loc)) == sizeof(loc)) {
    auto span = consumer->Read(loc.position, loc.size);
    ASSERT_TRUE(span.ok()) << span.status();
    EXPECT_EQ(Crc32c(span->data(), span->size()), loc.crc) << received;
    ASSERT_TRUE(consumer->Release(loc.position + loc.size).ok());
    ++received;
  }
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(received, kRecords);
}

}  // namespace
}  // namespace specstream
