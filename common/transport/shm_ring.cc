#include "common/transport/shm_ring.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <new>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/env.h"
#include "common/file.h"
#include "common/sigbus_guard.h"
#include "common/status.h"

namespace specstream {

// The header page. Only lock-free atomics, so the layout is the same in every
// process and the operations work across processes (the kernel futex ties
// waiting to the physical page, not the mapping address).
struct ShmRing::Header {
  std::atomic<uint64_t> magic;  // kMagic, stored last (release) by Create
  uint32_t version;
  uint32_t header_bytes;
  uint64_t capacity;
  // Separate cache lines: head is written by the producer, tail by the
  // consumer.
  alignas(64) std::atomic<uint64_t> head;
  alignas(64) std::atomic<uint64_t> tail;
  // Futex word bumped by every Release; a producer waiting for room sleeps
  // on it. producer_waiting tells the consumer whether a wake is needed.
  std::atomic<uint32_t> release_seq;
  std::atomic<uint32_t> producer_waiting;
};

namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "ring positions must be lock-free");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex word must be lock-free");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex word must be 32 bits");

constexpr uint64_t kMinCapacity = 4096;
constexpr uint64_t kMaxCapacity = uint64_t{1} << 40;

absl::Status ValidateName(const std::string& name) {
  if (name.size() < 2 || name.size() > 251 || name[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("shm ring name '", name, "': must be '/' followed by 1-250 characters"));
  }
  for (size_t i = 1; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("shm ring name '", name, "': only [A-Za-z0-9._-] may follow the '/'"));
    }
  }
  return absl::OkStatus();
}

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

absl::Status ValidateCapacity(uint64_t capacity) {
  if (!IsPowerOfTwo(capacity) || capacity < kMinCapacity || capacity > kMaxCapacity) {
    return absl::InvalidArgumentError(
        absl::StrFormat("shm ring capacity %d: must be a power of two in [%d, %d]", capacity,
                        kMinCapacity, kMaxCapacity));
  }
  return absl::OkStatus();
}

// FUTEX_WAIT (process-shared) on `word` while it equals `expected`, at most
// `timeout`. Spurious returns are fine: callers re-check their condition.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  struct timespec ts = absl::ToTimespec(timeout);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

}  // namespace

ShmRing::ShmRing(std::string name, bool owner, void* base, uint64_t mapped_bytes, uint64_t capacity)
    : name_(std::move(name)),
      owner_(owner),
      base_(base),
      mapped_bytes_(mapped_bytes),
      capacity_(capacity) {}

ShmRing::~ShmRing() {
  munmap(base_, mapped_bytes_);
  if (owner_ && linked_) shm_unlink(name_.c_str());
}

absl::Status ShmRing::Unlink() {
  if (!owner_ || !linked_) return absl::OkStatus();
  linked_ = false;
  if (shm_unlink(name_.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus("cannot unlink shm ring", name_);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ShmRing>> ShmRing::Map(const std::string& name, int fd, bool owner,
                                                      uint64_t mapped_bytes, uint64_t capacity,
                                                      bool populate) {
  void* base = mmap(nullptr, mapped_bytes, PROT_READ | PROT_WRITE,
                    MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
  if (base == MAP_FAILED) return ErrnoStatus("cannot map shm ring", name);
  return std::unique_ptr<ShmRing>(new ShmRing(name, owner, base, mapped_bytes, capacity));
}

absl::StatusOr<std::unique_ptr<ShmRing>> ShmRing::Create(const ShmRingOptions& options) {
  static_assert(sizeof(Header) <= kHeaderBytes, "the header must fit its page");
  if (absl::Status s = ValidateName(options.name); !s.ok()) return s;
  if (absl::Status s = ValidateCapacity(options.capacity); !s.ok()) return s;
  const int fd = shm_open(options.name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    if (errno == EEXIST) {
      return absl::AlreadyExistsError(
          absl::StrCat("shm ring ", options.name, ": a segment of that name exists"));
    }
    return ErrnoStatus("cannot create shm ring", options.name);
  }
  const uint64_t bytes = kHeaderBytes + options.capacity;
  // From here on a failure must not leave the name behind.
  auto fail = [&](absl::Status status) {
    close(fd);
    shm_unlink(options.name.c_str());
    return status;
  };
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    return fail(ErrnoStatus("cannot size shm ring", options.name));
  }
  if (options.populate) {
    // tmpfs allocates lazily; reserving now turns "no room" into an error
    // here rather than SIGBUS on the first write.
    if (int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
      const std::string message = absl::StrFormat("cannot allocate %d bytes for shm ring %s: %s",
                                                  bytes, options.name, std::strerror(err));
      return fail(err == ENOSPC ? absl::ResourceExhaustedError(message)
                                : absl::InternalError(message));
    }
  }
  auto ring = Map(options.name, fd, /*owner=*/true, bytes, options.capacity, options.populate);
  if (!ring.ok()) return fail(ring.status());
  close(fd);
  // A fresh segment is zero-filled; construct the header in place and
  // publish it with the magic last, so an attacher never sees half a header.
  // (The name is public from shm_open on: someone may already have shrunk it.)
  ShmRing& r = **ring;
  RETURN_IF_ERROR(r.Guarded([&r, capacity = options.capacity] {
    auto* h = new (r.base_) Header();
    h->version = kVersion;
    h->header_bytes = static_cast<uint32_t>(kHeaderBytes);
    h->capacity = capacity;
    h->head.store(0, std::memory_order_relaxed);
    h->tail.store(0, std::memory_order_relaxed);
    h->release_seq.store(0, std::memory_order_relaxed);
    h->producer_waiting.store(0, std::memory_order_relaxed);
    h->magic.store(kMagic, std::memory_order_release);
  }));
  return ring;
}

absl::StatusOr<std::unique_ptr<ShmRing>> ShmRing::Attach(const std::string& name, bool populate) {
  if (absl::Status s = ValidateName(name); !s.ok()) return s;
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("shm ring ", name, ": no such segment"));
    }
    return ErrnoStatus("cannot open shm ring", name);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    absl::Status status = ErrnoStatus("cannot stat shm ring", name);
    close(fd);
    return status;
  }
  const auto bytes = static_cast<uint64_t>(st.st_size);
  if (bytes < kHeaderBytes + kMinCapacity) {
    close(fd);
    return absl::DataLossError(absl::StrFormat(
        "shm ring %s: segment is %d bytes, too small for a ring (header %d + at least %d)", name,
        bytes, kHeaderBytes, kMinCapacity));
  }
  auto ring = Map(name, fd, /*owner=*/false, bytes, bytes - kHeaderBytes, populate);
  close(fd);
  if (!ring.ok()) return ring.status();
  // The segment may shrink between the fstat and these loads.
  const Header* h = (*ring)->header();
  uint64_t magic = 0, capacity = 0, head = 0, tail = 0;
  uint32_t version = 0, header_bytes = 0;
  RETURN_IF_ERROR((*ring)->Guarded([&] {
    magic = h->magic.load(std::memory_order_acquire);
    version = h->version;
    header_bytes = h->header_bytes;
    capacity = h->capacity;
    head = h->head.load(std::memory_order_acquire);
    tail = h->tail.load(std::memory_order_acquire);
  }));
  if (magic != kMagic) {
    return absl::DataLossError(absl::StrFormat(
        "shm ring %s: bad magic 0x%016x (expected 0x%016x): not a ring or not initialized", name,
        magic, kMagic));
  }
  if (version != kVersion || header_bytes != kHeaderBytes) {
    return absl::DataLossError(
        absl::StrFormat("shm ring %s: layout version %d / header %d bytes, expected %d / %d", name,
                        version, header_bytes, kVersion, kHeaderBytes));
  }
  if (capacity != bytes - kHeaderBytes || !ValidateCapacity(capacity).ok()) {
    return absl::DataLossError(
        absl::StrFormat("shm ring %s: header capacity %d does not match the segment size %d", name,
                        capacity, bytes));
  }
  if (tail > head || head - tail > capacity) {
    return absl::DataLossError(
        absl::StrFormat("shm ring %s: corrupt positions head %d tail %d (capacity %d)", name, head,
                        tail, capacity));
  }
  return ring;
}

absl::Status ShmRing::CheckNotLost() const {
  if (!lost_.load(std::memory_order_acquire)) return absl::OkStatus();
  return absl::DataLossError(absl::StrFormat(
      "shm ring %s: the segment was truncated under this mapping by another process (an earlier "
      "access faulted); the ring is lost",
      name_));
}

absl::Status ShmRing::Guarded(absl::FunctionRef<void()> access) const {
  RETURN_IF_ERROR(CheckNotLost());
  const std::optional<SigbusFault> fault = RunCatchingSigbus(access);
  if (!fault.has_value()) return absl::OkStatus();
  const auto base = reinterpret_cast<uintptr_t>(base_);
  if (fault->address < base || fault->address - base >= mapped_bytes_) {
    // Not this ring's pages: a source or destination mapping of the caller's.
    return absl::DataLossError(absl::StrFormat(
        "shm ring %s: SIGBUS at address 0x%x, outside the ring's mapping, while copying a record "
        "(a truncated mapped file?)",
        name_, fault->address));
  }
  lost_.store(true, std::memory_order_release);
  return absl::DataLossError(absl::StrFormat(
      "shm ring %s: the segment was truncated under this mapping by another process (SIGBUS at "
      "byte %d of %d); the ring is lost",
      name_, fault->address - base, mapped_bytes_));
}

absl::StatusOr<uint64_t> ShmRing::committed() const {
  uint64_t head = 0;
  RETURN_IF_ERROR(Guarded([&] { head = header()->head.load(std::memory_order_acquire); }));
  return head;
}

absl::StatusOr<uint64_t> ShmRing::released() const {
  uint64_t tail = 0;
  RETURN_IF_ERROR(Guarded([&] { tail = header()->tail.load(std::memory_order_acquire); }));
  return tail;
}

absl::StatusOr<ShmRing::Reservation> ShmRing::Reserve(uint64_t n, absl::Duration timeout) {
  RETURN_IF_ERROR(CheckNotLost());
  if (reserved_) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm ring ", name_, ": Reserve while a reservation is open"));
  }
  if (n == 0 || n > capacity_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shm ring %s: record of %d bytes, must be in [1, %d]", name_, n, capacity_));
  }
  Header* h = header();
  // Only this producer writes head, so its own last store is current.
  uint64_t head = 0, tail = 0;
  RETURN_IF_ERROR(Guarded([&] {
    head = h->head.load(std::memory_order_relaxed);
    tail = h->tail.load(std::memory_order_acquire);
  }));
  const uint64_t index = head & (capacity_ - 1);
  const uint64_t start = index + n > capacity_ ? head + (capacity_ - index) : head;
  const uint64_t end = start + n;
  auto fits = [&] { return end - tail <= capacity_; };

  if (!fits()) {
    const absl::Time deadline = Env::Default().Now() + timeout;
    // Each access to the header is guarded; the futex syscall needs no
    // guard (on a truncated page it fails with EFAULT, and the next
    // guarded load reports the loss).
    auto stop_waiting = [&] {
      return Guarded([h] { h->producer_waiting.store(0, std::memory_order_relaxed); });
    };
    while (true) {
      // Dekker-style handshake with Release (all seq_cst): either we see the
      // consumer's new tail, or it sees producer_waiting and wakes us; the
      // sequence number read before the check makes a wake that lands
      // between the check and the sleep return at once.
      uint32_t seq = 0;
      RETURN_IF_ERROR(Guarded([&] {
        h->producer_waiting.store(1, std::memory_order_seq_cst);
        seq = h->release_seq.load(std::memory_order_seq_cst);
        tail = h->tail.load(std::memory_order_seq_cst);
      }));
      if (fits()) break;
      const absl::Duration left = deadline - Env::Default().Now();
      if (left <= absl::ZeroDuration()) {
        RETURN_IF_ERROR(stop_waiting());
        return absl::DeadlineExceededError(absl::StrFormat(
            "shm ring %s: no room for %d bytes within %s (head %d, tail %d, capacity %d)", name_, n,
            absl::FormatDuration(timeout), head, tail, capacity_));
      }
      FutexWait(&h->release_seq, seq, left);
    }
    RETURN_IF_ERROR(stop_waiting());
  }
  reserved_ = true;
  reserved_end_ = end;
  reserved_data_ = absl::Span<char>(data() + (start & (capacity_ - 1)), n);
  return Reservation{start, reserved_data_};
}

absl::Status ShmRing::Fill(absl::FunctionRef<void(absl::Span<char> record)> copy) {
  RETURN_IF_ERROR(CheckNotLost());
  if (!reserved_) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm ring ", name_, ": Fill without a reservation"));
  }
  return Guarded([&] { copy(reserved_data_); });
}

absl::Status ShmRing::Commit() {
  RETURN_IF_ERROR(CheckNotLost());
  if (!reserved_) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm ring ", name_, ": Commit without a reservation"));
  }
  // Release: the record's bytes (and the skipped padding) become visible
  // with the new head.
  RETURN_IF_ERROR(Guarded([&] { header()->head.store(reserved_end_, std::memory_order_release); }));
  reserved_ = false;
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<const char>> ShmRing::Read(uint64_t position, uint64_t n) const {
  ASSIGN_OR_RETURN(const char* record, Locate(position, n));
  return absl::Span<const char>(record, n);
}

absl::Status ShmRing::CopyOut(uint64_t position, absl::Span<char> dest) const {
  ASSIGN_OR_RETURN(const char* record, Locate(position, dest.size()));
  return Guarded([&] { std::memcpy(dest.data(), record, dest.size()); });
}

absl::StatusOr<const char*> ShmRing::Locate(uint64_t position, uint64_t n) const {
  const Header* h = header();
  uint64_t tail = 0, head = 0;
  RETURN_IF_ERROR(Guarded([&] {
    tail = h->tail.load(std::memory_order_relaxed);  // consumer-owned
    head = h->head.load(std::memory_order_acquire);  // pairs with Commit
  }));
  if (position < tail || position > head || n > head - position) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shm ring %s: record [%d, %d) is not committed and unreleased (tail %d, head %d)", name_,
        position, position + n, tail, head));
  }
  const uint64_t index = position & (capacity_ - 1);
  if (index + n > capacity_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("shm ring %s: record [%d, %d) would wrap the data area (capacity %d)",
                        name_, position, position + n, capacity_));
  }
  return data() + index;
}

absl::Status ShmRing::Release(uint64_t end) {
  Header* h = header();
  uint64_t tail = 0, head = 0;
  RETURN_IF_ERROR(Guarded([&] {
    tail = h->tail.load(std::memory_order_relaxed);
    head = h->head.load(std::memory_order_acquire);
  }));
  if (end < tail || end > head) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shm ring %s: Release(%d) outside [tail %d, head %d]", name_, end, tail, head));
  }
  // Release semantics (implied by seq_cst): our reads of the released bytes
  // happen before the producer overwrites them.
  bool wake = false;
  RETURN_IF_ERROR(Guarded([&] {
    h->tail.store(end, std::memory_order_seq_cst);
    h->release_seq.fetch_add(1, std::memory_order_seq_cst);
    wake = h->producer_waiting.load(std::memory_order_seq_cst) != 0;
  }));
  if (wake) FutexWakeAll(&h->release_seq);
  return absl::OkStatus();
}

std::string ShmRingPrefix(int64_t pid) { return absl::StrCat("/specstream-", pid, "-"); }

int RemoveShmRingsOf(int64_t pid) {
  // POSIX shm names live in /dev/shm on Linux, without the leading '/'.
  const std::string prefix = ShmRingPrefix(pid).substr(1);
  int removed = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", error)) {
    const std::string name = entry.path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    if (shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace specstream
