// A single-producer / single-consumer byte ring in POSIX shared memory: the
// `shm` payload transport between a teacher and a student on the same host
// (DESIGN §5). The student creates the ring and names it in
// StreamRequest.Open; the teacher attaches, writes each chunk of a payload
// into one contiguous record and sends only its position
// (StreamResponse.PayloadChunk.shm); the student copies the record out and
// releases it.
//
// Segment layout ("/dev/shm/<name>"): one 4096-byte header page, then
// `capacity` data bytes. The header holds a magic ("SSRING\0\1"), a layout
// version, the capacity, and two monotonically increasing 64-bit byte
// positions: `head` (end of the committed records, written by the producer)
// and `tail` (end of the released bytes, written by the consumer). Position
// p lives at data byte p % capacity; head - tail <= capacity always.
//
// Records never wrap: when a record would straddle the end of the data area,
// the producer skips to the next multiple of capacity (the skipped bytes are
// padding, released implicitly with the record after them). So a record of
// n bytes at position p is always the bytes [p % capacity, p % capacity + n).
//
// Ordering: the consumer releases records in the order they were committed
// (Release(end) moves the tail forward to `end`, which frees every byte
// before it). Positions reach the consumer out of band (over gRPC), after
// Commit() returned.
//
// Thread-safety: one producer and one consumer, each in any process or
// thread, may use a ring concurrently. Producer methods (Reserve, Fill,
// Commit) must not be called concurrently with each other, nor consumer
// methods (Read, CopyOut, Release) with each other. Waiting uses a
// process-shared futex, so a blocked producer wakes as soon as the consumer
// releases bytes.
//
// Truncation: any local process allowed to open the name can shrink the
// segment under both mappings, and touching a page past its new end raises
// SIGBUS. Every access this class makes to the mapping (header positions,
// Fill, CopyOut) runs under common/sigbus_guard.h: a fault there returns
// DataLoss ("... was truncated ...") instead of killing the process, and the
// ring is lost for good: every later call on this object returns DataLoss.
// Only bytes a caller touches through a Reservation's or Read's span itself
// are unguarded.
#ifndef SPECSTREAM_COMMON_TRANSPORT_SHM_RING_H_
#define SPECSTREAM_COMMON_TRANSPORT_SHM_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/host.h"  // LocalHostname, LocalBootId (same-host checks)

namespace specstream {

struct ShmRingOptions {
  // POSIX shared-memory name: "/" followed by 1-250 characters of
  // [A-Za-z0-9._-] (no further "/").
  std::string name;
  // Data bytes: a power of two, at least 4096 (and at most 2^40).
  uint64_t capacity = uint64_t{256} << 20;
  // Reserve the memory up front (posix_fallocate: ResourceExhausted when
  // /dev/shm is too small, instead of SIGBUS on first touch) and map it
  // populated, so no page fault happens while streaming.
  bool populate = true;
};

class ShmRing final {
 public:
  // Layout constants (see the file comment).
  static constexpr uint64_t kMagic = 0x0100474E49525353;  // "SSRING\0\1" little-endian
  static constexpr uint32_t kVersion = 1;
  static constexpr uint64_t kHeaderBytes = 4096;

  // Creates the segment (the caller becomes its owner: the destructor
  // unlinks it). InvalidArgument for a bad name or capacity; AlreadyExists
  // when a segment of that name exists; ResourceExhausted when /dev/shm has
  // no room; DataLoss when someone shrinks it before its header is written;
  // Internal for other system errors.
  static absl::StatusOr<std::unique_ptr<ShmRing>> Create(const ShmRingOptions& options);

  // Attaches to a segment another process (or object) created; the capacity
  // comes from its header. NotFound when no segment has that name; DataLoss
  // when it is too small for its header, has the wrong magic or version, or a
  // capacity that disagrees with its size or the ring invariants, or when it
  // shrinks while its header is read.
  static absl::StatusOr<std::unique_ptr<ShmRing>> Attach(const std::string& name,
                                                         bool populate = true);

  // Unmaps; the owner also unlinks the name (attached processes keep their
  // mapping valid until they unmap).
  ~ShmRing();
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;

  // A record being written: `position` is what the consumer gets to Read and
  // Release; `data` the writable bytes (writing them directly is unguarded:
  // Fill is the copy that survives a truncated segment).
  struct Reservation {
    uint64_t position = 0;
    absl::Span<char> data;
  };

  // Producer: space for one record of `n` bytes (1 <= n <= capacity),
  // blocking until the consumer has released enough or `timeout` passes
  // (DeadlineExceeded, nothing reserved). InvalidArgument for a bad n;
  // FailedPrecondition while a reservation is open (Commit it first).
  absl::StatusOr<Reservation> Reserve(uint64_t n, absl::Duration timeout);

  // Producer: runs copy(record) on the open reservation's bytes, catching a
  // truncated segment: DataLoss naming the ring (the ring is then lost; a
  // fault in memory outside the ring, such as a truncated source, is
  // DataLoss too but leaves the ring usable). `copy` may be abandoned at any
  // instruction that faults, so it must only copy bytes: no locks, no
  // allocation, no objects with destructors (see common/sigbus_guard.h).
  // FailedPrecondition when no reservation is open.
  absl::Status Fill(absl::FunctionRef<void(absl::Span<char> record)> copy);

  // Producer: publishes the open reservation (release semantics: a consumer
  // that sees the new head sees the record's bytes). FailedPrecondition when
  // no reservation is open.
  absl::Status Commit();

  // Consumer: the committed record [position, position + n). InvalidArgument
  // (naming the positions) when it is not entirely committed and unreleased,
  // or when it would wrap the data area (no record does).
  // The span points into the mapping: copying out of it is unguarded (see
  // CopyOut).
  absl::StatusOr<absl::Span<const char>> Read(uint64_t position, uint64_t n) const;

  // Consumer: copies the committed record [position, position + dest.size())
  // into `dest`, as Read checks it, catching a truncated segment (DataLoss;
  // the ring is then lost).
  absl::Status CopyOut(uint64_t position, absl::Span<char> dest) const;

  // Consumer: frees every byte before `end` (normally a record's position +
  // size, records released in commit order). InvalidArgument when `end` is
  // before the current tail or after the committed head.
  absl::Status Release(uint64_t end);

  // Owner: removes the name from /dev/shm now. Every mapping (this one and
  // the attached peer's) stays valid, and the memory goes when the last one
  // is unmapped, so a process killed later leaks nothing. The destructor
  // then unlinks nothing. Call once the peer has attached; a no-op for a
  // ring attached to or already unlinked.
  absl::Status Unlink();
  // Whether the name is still in /dev/shm as far as this owner knows.
  bool linked() const { return owner_ && linked_; }

  const std::string& name() const { return name_; }
  uint64_t capacity() const { return capacity_; }
  bool owner() const { return owner_; }
  // Current positions (acquire loads; stale as soon as they return), or
  // DataLoss once the segment was truncated.
  absl::StatusOr<uint64_t> committed() const;
  absl::StatusOr<uint64_t> released() const;

 private:
  struct Header;
  ShmRing(std::string name, bool owner, void* base, uint64_t mapped_bytes, uint64_t capacity);
  static absl::StatusOr<std::unique_ptr<ShmRing>> Map(const std::string& name, int fd, bool owner,
                                                      uint64_t mapped_bytes, uint64_t capacity,
                                                      bool populate);

  Header* header() const { return static_cast<Header*>(base_); }
  char* data() const { return static_cast<char*>(base_) + kHeaderBytes; }

  // Runs `access`, which touches the mapping and nothing that needs
  // unwinding, under the SIGBUS guard: DataLoss when the ring is (or, by a
  // fault in it, becomes) lost.
  absl::Status Guarded(absl::FunctionRef<void()> access) const;
  // DataLoss once a fault in the mapping showed the segment truncated.
  absl::Status CheckNotLost() const;
  // Where record [position, position + n) lies (consumer side), checked as
  // Read documents.
  absl::StatusOr<const char*> Locate(uint64_t position, uint64_t n) const;

  std::string name_;
  bool owner_;
  bool linked_ = true;  // owner: the name not yet unlinked
  void* base_;
  uint64_t mapped_bytes_;
  uint64_t capacity_;
  // Producer-local: the open reservation's end position and bytes.
  bool reserved_ = false;
  uint64_t reserved_end_ = 0;
  absl::Span<char> reserved_data_;
  // Set by the first fault inside the mapping (by the producer or the
  // consumer thread); never cleared.
  mutable std::atomic<bool> lost_{false};
};

// The name prefix of every ring process `pid` creates ("/specstream-<pid>-"):
// a student names its rings with it, so that what a dead process left behind
// can be found.
std::string ShmRingPrefix(int64_t pid);

// Unlinks every ring in /dev/shm whose name starts with ShmRingPrefix(pid)
// (what a rank killed before unlinking its rings left); returns how many.
// Mappings a live teacher still holds stay valid. Best effort: a name that
// vanishes meanwhile is not an error.
int RemoveShmRingsOf(int64_t pid);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_TRANSPORT_SHM_RING_H_
