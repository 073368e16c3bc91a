// GGUF, llama.cpp's model file (versions 2 and 3, little-endian): its
// metadata, its tensor directory, and exact dequantisation of the tensor
// types a converted or quantised Llama checkpoint uses.
//
// Layout: "GGUF", u32 version, u64 tensor count, u64 metadata count; the
// metadata (key: u64-length string, u32 value type, value); the tensor
// infos (name, u32 n_dims, u64 dims[n_dims] fastest first, u32 type, u64
// offset); padding to `general.alignment` (default 32); the data, each
// tensor at its offset from the data's start.
//
// Dequantisation is bit-exact with llama.cpp's reference (ggml's
// dequantize_row_*) and gguf-py: every value is one fp32 expression of the
// block's fp16 scale (and minimum) and the quant,
//   Q8_0  x = d·q          (q int8, 32 a block)
//   Q4_0  x = d·(q − 8)     (q 4-bit, 32 a block: low nibbles first)
//   Q4_1  x = d·q + m       (q 4-bit, 32 a block: low nibbles first)
// and F16 / BF16 widen exactly. Other types are refused, naming the tensor
// and its type.
//
// Thread-safety: a GgufFile is immutable after Open; const methods may be
// called concurrently.
#ifndef SPECSTREAM_COMMON_GGUF_H_
#define SPECSTREAM_COMMON_GGUF_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace specstream {

// ggml tensor types (ggml.h's enum ggml_type values).
enum class GgufTensorType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ8_0 = 8,
  kBF16 = 30,
};
// "F32", "Q4_1", ... ("type 12" for one this reader does not dequantise).
std::string GgufTensorTypeName(uint32_t type);

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the fastest (a row's length)
  uint32_t type = 0;
  uint64_t offset = 0;  // from the data's start
  uint64_t nbytes = 0;  // 0 for types this reader cannot size

  // The PyTorch shape: dims reversed ([rows, row length] for a matrix).
  std::vector<int64_t> TorchShape() const;
  int64_t NumElements() const;
};

class GgufFile final {
 public:
  // Reads `path` and validates the header, the metadata and the tensor
  // directory (names unique, every sized tensor inside the file).
  // Errors name the path and the key or tensor at fault.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // The same over bytes held in memory (tests, fuzzing).
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBytes(std::string bytes,
                                                             std::string source = "<bytes>");
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  // Every metadata value as JSON: integers, floats, bools, strings (bytes
  // that are not UTF-8 are refused), arrays of those.
  const nlohmann::json& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const GgufTensorInfo* Find(absl::string_view name) const;
  const std::string& source() const { return source_; }

  // The tensor's values as fp32, in ggml order (row after row).
  // InvalidArgument for a type this reader does not dequantise.
  absl::StatusOr<std::vector<float>> Dequantize(const GgufTensorInfo& tensor) const;

 private:
  GgufFile() = default;
  absl::Status Parse();

  std::string source_;
  std::string bytes_;  // the whole file
  uint32_t version_ = 0;
  uint64_t data_start_ = 0;
  nlohmann::json metadata_ = nlohmann::json::object();
  std::vector<GgufTensorInfo> tensors_;
};

// Writes a GGUF file's bytes (version 3, alignment 32) from metadata and
// tensors whose data is already encoded in their type: what tests need to
// build fixtures, and the inverse of the reader for the types above.
// Metadata: JSON integers are written as INT64 (UINT64 when over INT64),
// floats as FLOAT32, strings, bools and arrays of one of those kinds.
struct GgufWriteTensor {
  std::string name;
  std::vector<int64_t> dims;  // ggml order
  uint32_t type = 0;
  std::string data;
};
absl::StatusOr<std::string> SerializeGguf(const nlohmann::json& metadata,
                                          const std::vector<GgufWriteTensor>& tensors);

// fp32 <-> fp16 (IEEE half), exact where representable, round to nearest
// even otherwise; the helpers tests use to build quantised blocks.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_GGUF_H_
