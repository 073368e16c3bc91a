#include "common/gguf.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/status.h"
#include "common/unicode.h"

namespace specstream {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF", little-endian
constexpr uint64_t kDefaultAlignment = 32;
constexpr int64_t kBlock = 32;  // elements a block, every quantised type here
// Limits that keep a hostile header from asking for absurd allocations.
constexpr uint64_t kMaxStringBytes = uint64_t{1} << 30;
constexpr uint64_t kMaxArrayElements = uint64_t{1} << 28;
constexpr uint32_t kMaxDims = 4;

// Metadata value types (gguf_type).
enum ValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// Bytes a block of `type` takes, 0 for a type this reader does not size.
uint64_t BlockBytes(uint32_t type) {
  switch (static_cast<GgufTensorType>(type)) {
    case GgufTensorType::kQ4_0:
      return 2 + kBlock / 2;
    case GgufTensorType::kQ4_1:
      return 4 + kBlock / 2;
    case GgufTensorType::kQ8_0:
      return 2 + kBlock;
    default:
      return 0;
  }
}

uint64_t ElementBytes(uint32_t type) {
  switch (static_cast<GgufTensorType>(type)) {
    case GgufTensorType::kF32:
      return 4;
    case GgufTensorType::kF16:
    case GgufTensorType::kBF16:
      return 2;
    default:
      return 0;
  }
}

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  size_t pos() const { return pos_; }

  template <typename T>
  absl::Status Read(T* out, absl::string_view what) {
    if (size_ - pos_ < sizeof(T)) {
      return absl::DataLossError(absl::StrCat("file ends inside ", what, " at byte ", pos_));
    }
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> String(absl::string_view what) {
    uint64_t n = 0;
    RETURN_IF_ERROR(Read(&n, what));
    if (n > kMaxStringBytes || n > size_ - pos_) {
      return absl::DataLossError(
          absl::StrCat(what, ": a string of ", n, " bytes at byte ", pos_, " runs past the file"));
    }
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    if (!unicode::IsValidUtf8(s))
      return absl::InvalidArgumentError(absl::StrCat(what, ": not UTF-8"));
    return s;
  }

  absl::StatusOr<nlohmann::json> Value(uint32_t type, absl::string_view what, bool in_array) {
    switch (type) {
      case kU8:
        return Scalar<uint8_t>(what);
      case kI8:
        return Scalar<int8_t>(what);
      case kU16:
        return Scalar<uint16_t>(what);
      case kI16:
        return Scalar<int16_t>(what);
      case kU32:
        return Scalar<uint32_t>(what);
      case kI32:
        return Scalar<int32_t>(what);
      case kU64:
        return Scalar<uint64_t>(what);
      case kI64:
        return Scalar<int64_t>(what);
      case kF32:
        return Scalar<float>(what);
      case kF64:
        return Scalar<double>(what);
      case kBool: {
        uint8_t b = 0;
        RETURN_IF_ERROR(Read(&b, what));
        if (b > 1) return absl::InvalidArgumentError(absl::StrCat(what, ": bool byte ", int{b}));
        return nlohmann::json(b == 1);
      }
      case kString: {
        ASSIGN_OR_RETURN(std::string s, String(what));
        return nlohmann::json(std::move(s));
      }
      case kArray: {
        if (in_array) {
          return absl::InvalidArgumentError(absl::StrCat(what, ": nested arrays are not read"));
        }
        uint32_t element = 0;
        uint64_t n = 0;
        RETURN_IF_ERROR(Read(&element, what));
        RETURN_IF_ERROR(Read(&n, what));
        if (n > kMaxArrayElements || n > size_ - pos_) {
          return absl::DataLossError(
              absl::StrCat(what, ": an array of ", n, " runs past the file"));
        }
        nlohmann::json array = nlohmann::json::array();
        for (uint64_t i = 0; i < n; ++i) {
          ASSIGN_OR_RETURN(nlohmann::json v, Value(element, what, /*in_array=*/true));
          array.push_back(std::move(v));
        }
        return array;
      }
      default:
        return absl::InvalidArgumentError(absl::StrCat(what, ": unknown value type ", type));
    }
  }

 private:
  template <typename T>
  absl::StatusOr<nlohmann::json> Scalar(absl::string_view what) {
    T v{};
    RETURN_IF_ERROR(Read(&v, what));
    if constexpr (std::is_same_v<T, float>) {
      // The shortest decimal that reads back as this float (1e-05, not
      // 9.99999974738e-06), as the config.json it came from had it.
      char text[32];
      for (int digits = 1; digits <= 9; ++digits) {
        std::snprintf(text, sizeof(text), "%.*g", digits, static_cast<double>(v));
        if (std::strtof(text, nullptr) == v) break;
      }
      return nlohmann::json(std::strtod(text, nullptr));
    } else if constexpr (std::is_floating_point_v<T>) {
      return nlohmann::json(v);
    } else {
      return nlohmann::json(v);
    }
  }

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

}  // namespace

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000 | (mantissa << 13);  // inf / nan
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mantissa <<= 1;
    } while ((mantissa & 0x400) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mantissa & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7fffffff;
  if (abs >= 0x7f800000) return sign | 0x7c00 | (abs > 0x7f800000 ? 0x200 : 0);
  if (abs >= 0x477ff000) return sign | 0x7c00;  // rounds past the largest half
  if (abs < 0x33000001) return sign;            // rounds to zero
  const int exponent = static_cast<int>(abs >> 23);
  uint32_t mantissa = (abs & 0x7fffff) | 0x800000;
  int shift;
  uint32_t base;
  if (exponent < 113) {  // subnormal half
    shift = 126 - exponent;
    base = 0;
  } else {
    shift = 13;
    base = static_cast<uint32_t>(exponent - 112) << 10;
    mantissa &= 0x7fffff;
  }
  uint32_t half = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1), midpoint = 1u << (shift - 1);
  if (rest > midpoint || (rest == midpoint && (half & 1))) ++half;
  return static_cast<uint16_t>(sign | (base + half));
}

std::string GgufTensorTypeName(uint32_t type) {
  switch (static_cast<GgufTensorType>(type)) {
    case GgufTensorType::kF32:
      return "F32";
    case GgufTensorType::kF16:
      return "F16";
    case GgufTensorType::kQ4_0:
      return "Q4_0";
    case GgufTensorType::kQ4_1:
      return "Q4_1";
    case GgufTensorType::kQ8_0:
      return "Q8_0";
    case GgufTensorType::kBF16:
      return "BF16";
  }
  return absl::StrCat("type ", type);
}

std::vector<int64_t> GgufTensorInfo::TorchShape() const {
  return std::vector<int64_t>(dims.rbegin(), dims.rend());
}

int64_t GgufTensorInfo::NumElements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

GgufFile::~GgufFile() = default;

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  return FromBytes(std::move(bytes), path);
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBytes(std::string bytes,
                                                              std::string source) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->source_ = std::move(source);
  file->bytes_ = std::move(bytes);
  RETURN_IF_ERROR(Annotate(file->Parse(), file->source_));
  return file;
}

absl::Status GgufFile::Parse() {
  const size_t size = bytes_.size();
  Reader r(reinterpret_cast<const uint8_t*>(bytes_.data()), size);
  uint32_t magic = 0;
  RETURN_IF_ERROR(r.Read(&magic, "the header"));
  if (magic != kMagic) return absl::InvalidArgumentError("not a GGUF file (no \"GGUF\" magic)");
  RETURN_IF_ERROR(r.Read(&version_, "the header"));
  if (version_ != 2 && version_ != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF version ", version_, " (supported: 2 and 3)"));
  }
  uint64_t tensor_count = 0, kv_count = 0;
  RETURN_IF_ERROR(r.Read(&tensor_count, "the header"));
  RETURN_IF_ERROR(r.Read(&kv_count, "the header"));
  for (uint64_t i = 0; i < kv_count; ++i) {
    ASSIGN_OR_RETURN(std::string key, r.String(absl::StrCat("metadata key ", i)));
    uint32_t type = 0;
    RETURN_IF_ERROR(r.Read(&type, key));
    ASSIGN_OR_RETURN(nlohmann::json value, r.Value(type, key, /*in_array=*/false));
    if (metadata_.contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat("metadata key ", key, " appears twice"));
    }
    metadata_[key] = std::move(value);
  }
  uint64_t alignment = kDefaultAlignment;
  if (metadata_.contains("general.alignment")) {
    const nlohmann::json& a = metadata_["general.alignment"];
    if (!a.is_number_unsigned() || a.get<uint64_t>() == 0 ||
        (a.get<uint64_t>() & (a.get<uint64_t>() - 1)) != 0) {
      return absl::InvalidArgumentError("general.alignment: must be a power of two");
    }
    alignment = a.get<uint64_t>();
  }
  std::set<std::string> names;
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo t;
    ASSIGN_OR_RETURN(t.name, r.String(absl::StrCat("tensor name ", i)));
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " appears twice"));
    }
    uint32_t n_dims = 0;
    RETURN_IF_ERROR(r.Read(&n_dims, t.name));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": ", n_dims, " dims"));
    }
    uint64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      RETURN_IF_ERROR(r.Read(&dim, t.name));
      if (dim == 0 || dim > (uint64_t{1} << 40) || elements > (uint64_t{1} << 40) / dim) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", t.name, ": dimension ", d, " is ", dim));
      }
      elements *= dim;
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    RETURN_IF_ERROR(r.Read(&t.type, t.name));
    RETURN_IF_ERROR(r.Read(&t.offset, t.name));
    if (const uint64_t e = ElementBytes(t.type); e > 0) {
      t.nbytes = elements * e;
    } else if (const uint64_t b = BlockBytes(t.type); b > 0) {
      if (t.dims[0] % kBlock != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", t.name, ": rows of ", t.dims[0], " are not whole ",
                         GgufTensorTypeName(t.type), " blocks of ", kBlock));
      }
      t.nbytes = elements / kBlock * b;
    }
    if (t.offset % alignment != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, ": offset ", t.offset, " is not aligned to ", alignment));
    }
    tensors_.push_back(std::move(t));
  }
  data_start_ = (r.pos() + alignment - 1) / alignment * alignment;
  for (const GgufTensorInfo& t : tensors_) {
    if (data_start_ > size || t.offset > size - data_start_ ||
        t.nbytes > size - data_start_ - t.offset) {
      return absl::DataLossError(absl::StrCat("tensor ", t.name, ": its ", t.nbytes,
                                              " bytes at offset ", t.offset, " run past the file"));
    }
  }
  return absl::OkStatus();
}

const GgufTensorInfo* GgufFile::Find(absl::string_view name) const {
  for (const GgufTensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<std::vector<float>> GgufFile::Dequantize(const GgufTensorInfo& t) const {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(bytes_.data()) + data_start_ + t.offset;
  if (t.nbytes == 0 && t.NumElements() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": tensor ", t.name, " is ", GgufTensorTypeName(t.type),
                     " (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)"));
  }
  const int64_t n = t.NumElements();
  std::vector<float> out(static_cast<size_t>(n));
  switch (static_cast<GgufTensorType>(t.type)) {
    case GgufTensorType::kF32:
      std::memcpy(out.data(), p, static_cast<size_t>(n) * 4);
      return out;
    case GgufTensorType::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = HalfToFloat(Load16(p + 2 * i));
      return out;
    case GgufTensorType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t bits = static_cast<uint32_t>(Load16(p + 2 * i)) << 16;
        std::memcpy(&out[i], &bits, 4);
      }
      return out;
    case GgufTensorType::kQ8_0:
      for (int64_t blk = 0; blk < n / kBlock; ++blk, p += 2 + kBlock) {
        const float d = HalfToFloat(Load16(p));
        for (int64_t j = 0; j < kBlock; ++j) {
          out[blk * kBlock + j] = d * static_cast<float>(static_cast<int8_t>(p[2 + j]));
        }
      }
      return out;
    case GgufTensorType::kQ4_0:
      for (int64_t blk = 0; blk < n / kBlock; ++blk, p += 2 + kBlock / 2) {
        const float d = HalfToFloat(Load16(p));
        float* x = &out[blk * kBlock];
        for (int64_t j = 0; j < kBlock / 2; ++j) {
          x[j] = d * static_cast<float>((p[2 + j] & 0x0f) - 8);
          x[j + kBlock / 2] = d * static_cast<float>((p[2 + j] >> 4) - 8);
        }
      }
      return out;
    case GgufTensorType::kQ4_1:
      for (int64_t blk = 0; blk < n / kBlock; ++blk, p += 4 + kBlock / 2) {
        const float d = HalfToFloat(Load16(p)), m = HalfToFloat(Load16(p + 2));
        float* x = &out[blk * kBlock];
        for (int64_t j = 0; j < kBlock / 2; ++j) {
          // One rounding per operation, as the reference: no fused multiply-add.
          volatile float lo = d * static_cast<float>(p[4 + j] & 0x0f);
          volatile float hi = d * static_cast<float>(p[4 + j] >> 4);
          x[j] = lo + m;
          x[j + kBlock / 2] = hi + m;
        }
      }
      return out;
  }
  return absl::InternalError(absl::StrCat("tensor ", t.name, ": sized but not dequantised"));
}

namespace {

void Put(std::string* out, const void* p, size_t n) { out->append(static_cast<const char*>(p), n); }
template <typename T>
void Put(std::string* out, T v) {
  Put(out, &v, sizeof(T));
}
void PutString(std::string* out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out->append(s);
}

// The value type a JSON value is written as; kArray's elements share one.
absl::StatusOr<uint32_t> TypeOf(const nlohmann::json& v, absl::string_view key) {
  if (v.is_boolean()) return kBool;
  if (v.is_number_unsigned() && v.get<uint64_t>() > std::numeric_limits<int64_t>::max()) {
    return kU64;
  }
  if (v.is_number_integer()) return kI64;
  if (v.is_number_float()) return kF32;
  if (v.is_string()) return kString;
  if (v.is_array()) return kArray;
  return absl::InvalidArgumentError(absl::StrCat("metadata ", key, ": cannot be written"));
}

void PutValue(std::string* out, const nlohmann::json& v, uint32_t type) {
  switch (type) {
    case kBool:
      Put<uint8_t>(out, v.get<bool>() ? 1 : 0);
      break;
    case kU64:
      Put<uint64_t>(out, v.get<uint64_t>());
      break;
    case kI64:
      Put<int64_t>(out, v.get<int64_t>());
      break;
    case kF32:
      Put<float>(out, v.get<float>());
      break;
    default:
      PutString(out, v.get<std::string>());
      break;
  }
}

}  // namespace

absl::StatusOr<std::string> SerializeGguf(const nlohmann::json& metadata,
                                          const std::vector<GgufWriteTensor>& tensors) {
  std::string out;
  Put<uint32_t>(&out, kMagic);
  Put<uint32_t>(&out, 3);
  Put<uint64_t>(&out, tensors.size());
  Put<uint64_t>(&out, metadata.size());
  for (const auto& [key, v] : metadata.items()) {
    PutString(&out, key);
    ASSIGN_OR_RETURN(uint32_t type, TypeOf(v, key));
    Put<uint32_t>(&out, type);
    if (type != kArray) {
      PutValue(&out, v, type);
      continue;
    }
    uint32_t element = kI64;
    if (!v.empty()) {
      ASSIGN_OR_RETURN(element, TypeOf(v[0], key));
    }
    Put<uint32_t>(&out, element);
    Put<uint64_t>(&out, v.size());
    for (const nlohmann::json& e : v) PutValue(&out, e, element);
  }
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const GgufWriteTensor& t : tensors) {
    PutString(&out, t.name);
    Put<uint32_t>(&out, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) Put<uint64_t>(&out, static_cast<uint64_t>(d));
    Put<uint32_t>(&out, t.type);
    Put<uint64_t>(&out, offset);
    offsets.push_back(offset);
    offset =
        (offset + t.data.size() + kDefaultAlignment - 1) / kDefaultAlignment * kDefaultAlignment;
  }
  out.resize((out.size() + kDefaultAlignment - 1) / kDefaultAlignment * kDefaultAlignment, '\0');
  const size_t data_start = out.size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    out.resize(data_start + offsets[i], '\0');
    out.append(tensors[i].data);
  }
  return out;
}

}  // namespace specstream
