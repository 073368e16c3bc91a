// safetensors reader and writer, following the format strictly:
//   [u64 little-endian N][N bytes of JSON header][data]
// The header maps tensor name -> {"dtype","shape","data_offsets":[b,e]} plus
// an optional "__metadata__" string->string map. Offsets are relative to the
// start of data, tensors are contiguous, non-overlapping and cover the data
// exactly; the header is padded with spaces to a multiple of 8 bytes.
//
// Thread-safety: a SafetensorsFile is immutable after Open; views stay valid
// while the file object lives. A mapped file must not be truncated while it is
// open (reads past the new end raise SIGBUS); writers here always replace files
// by rename, which leaves existing mappings intact.
//
// Errors. The reader refuses anything the reference implementation
// (huggingface/safetensors) would refuse, and a little more (duplicate keys,
// unknown fields in a tensor entry, overlaps, gaps). Every error names the
// source (path or "<bytes>") and, where one is involved, the tensor:
//   * InvalidArgument: the header is not valid JSON / not an object, a field is
//     missing or ill-typed, an unknown dtype, a negative dimension, a
//     duplicate name, a non-string metadata value.
//   * DataLoss: the file is too short, the header length is over the limit or
//     past the end of the file, offsets out of the data region, overlapping
//     tensors, gaps or unused bytes, byte counts that do not match the shape.
//   * NotFound: Get() of a name the file does not hold.
#ifndef SPECSTREAM_COMMON_SAFETENSORS_H_
#define SPECSTREAM_COMMON_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"

namespace specstream {

// Largest header the reader accepts (the reference implementation's limit).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// A tensor inside a SafetensorsFile. No copy: `data` points into the file's
// mapping (or owned buffer) and is valid while that file object lives.
// `data` is never null, also for zero-size tensors.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
};

// A validated, read-only safetensors file. Open() maps the file (PROT_READ,
// MAP_PRIVATE); FromBytes() owns an in-memory copy. The whole header is
// validated up front, so Get() only fails for unknown names.
class SafetensorsFile final {
 public:
  // Maps `path` read-only and validates it. Errors are prefixed with `path`.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Validates and takes ownership of `bytes` (fuzzing, in-memory use). Errors
  // are prefixed with `source` (default "<bytes>").
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(std::string bytes,
                                                                    std::string source = "<bytes>");

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Tensor names in data-offset order (ties by name).
  const std::vector<std::string>& names() const { return names_; }
  bool Contains(absl::string_view name) const;
  // NotFound naming the tensor and the file when absent.
  absl::StatusOr<TensorView> Get(absl::string_view name) const;
  // "__metadata__" (empty when absent or null).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The path passed to Open, or FromBytes' `source`.
  const std::string& source() const { return source_; }

  // The whole file as read (header included); every view lies inside it.
  const uint8_t* bytes() const { return base_; }
  size_t size() const { return size_; }
  // Offset of the data region from bytes() (8 + header length).
  size_t data_start() const { return data_start_; }

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin;  // Relative to data_start_.
    uint64_t end;
  };

  SafetensorsFile() = default;
  // Parses and validates the header of [base_, base_ + size_).
  absl::Status Parse();

  std::string source_;
  std::string owned_;        // FromBytes: the bytes.
  void* mapping_ = nullptr;  // Open: the mmap'd file.
  size_t mapping_size_ = 0;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  size_t data_start_ = 0;
  std::vector<std::string> names_;
  absl::flat_hash_map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Builds a safetensors file in memory. Tensors are copied in Add(). Layout
// matches huggingface/safetensors' serialize(): tensors ordered by dtype
// alignment, largest first (I64, F32, I32, BF16, F16, U8, BOOL), then by name,
// so every tensor's offset is a multiple of its element size and the output
// does not depend on the order of Add() calls; "__metadata__" comes first in
// the header; the JSON is compact and padded with spaces to a multiple of 8.
// Not thread-safe.
class SafetensorsWriter final {
 public:
  SafetensorsWriter() = default;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Copies `nbytes` from `data`. InvalidArgument on a duplicate or reserved
  // name ("__metadata__"), a name that is not valid UTF-8, a negative
  // dimension, or `nbytes` != elements × dtype size.
  absl::Status Add(std::string name, DType dtype, std::vector<int64_t> shape, const void* data,
                   size_t nbytes);
  // Sets (or replaces) a "__metadata__" entry.
  void SetMetadata(std::string key, std::string value);

  // The file's bytes. InvalidArgument if a metadata key or value is not valid
  // UTF-8.
  absl::StatusOr<std::string> Serialize() const;
  // Writes through WriteFileAtomically (common/file.h): a temporary beside
  // `path`, fsync, rename. `path` is never left partial; on failure the
  // temporary is removed and `path` is untouched.
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Pending {
    DType dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::map<std::string, Pending> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The tensors of a Hugging Face checkpoint directory: either a single
// "model.safetensors" or "model.safetensors.index.json"
// ({"metadata": {...}, "weight_map": {tensor: shard file}}) with its shards.
// Each shard is mapped once. Open() verifies that every tensor of the weight
// map exists in its shard (the error names tensor and shard) and refuses shard
// paths that are absolute or contain "..". Immutable after Open; thread-safe.
class CheckpointTensors final {
 public:
  static absl::StatusOr<std::unique_ptr<CheckpointTensors>> Open(const std::string& dir);

  // All tensor names (of the weight map, or of the single file), sorted.
  const std::vector<std::string>& names() const { return names_; }
  bool Contains(absl::string_view name) const;
  // NotFound naming the tensor and the directory when absent.
  absl::StatusOr<TensorView> Get(absl::string_view name) const;
  // The shard files in the order opened (one for a single-file checkpoint).
  const std::vector<std::string>& shard_paths() const { return shard_paths_; }

 private:
  CheckpointTensors() = default;

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::vector<std::string> shard_paths_;
  absl::flat_hash_map<std::string, size_t> shard_of_;  // name -> shards_ index
  std::vector<std::string> names_;
};

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_SAFETENSORS_H_
