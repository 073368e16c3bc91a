#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace specstream {
namespace {

using Json = nlohmann::json;

constexpr absl::string_view kMetadataKey = "__metadata__";
// Nothing in a valid header nests deeper than top object -> entry -> array.
constexpr int kMaxJsonDepth = 16;

// Thrown from inside the nlohmann parser callback to stop parsing early; it
// never escapes ParseStrictJson.
struct StrictJsonError {
  std::string message;
};

// nlohmann keeps one of several equal keys silently; the callback below
// tracks the keys of every open object so duplicates are refused instead
// (a duplicated tensor name would otherwise hide a tensor's bytes).
absl::StatusOr<Json> ParseStrictJson(absl::string_view text) {
  std::vector<std::set<std::string>> open_objects;
  auto callback = [&open_objects](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth > kMaxJsonDepth) {
      throw StrictJsonError{absl::StrCat("JSON nests deeper than ", kMaxJsonDepth, " levels")};
    }
    switch (event) {
      case Json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (!open_objects.empty() && !open_objects.back().insert(key).second) {
          throw StrictJsonError{absl::StrCat("duplicate key \"", key, "\"")};
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), callback);
  } catch (const StrictJsonError& e) {
    return absl::InvalidArgumentError(e.message);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("invalid JSON: ", e.what()));
  }
}

uint64_t ReadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string Le64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// Expected byte count of a tensor, or an error on overflow / negative dims.
absl::StatusOr<uint64_t> ByteCount(DType dtype, const std::vector<int64_t>& shape) {
  ASSIGN_OR_RETURN(uint64_t elements, NumElements(shape));
  const uint64_t size = DTypeSize(dtype);
  if (elements > UINT64_MAX / size)
    return absl::InvalidArgumentError("byte count overflows 64 bits");
  return elements * size;
}

// Reads a JSON value that must be a non-negative integer fitting int64.
absl::StatusOr<uint64_t> ReadUnsigned(const Json& value, absl::string_view what) {
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX)) {
      return absl::InvalidArgumentError(absl::StrCat(what, " ", v, " is too large"));
    }
    return v;
  }
  if (value.is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is negative (", value.get<int64_t>(), ")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be a non-negative integer, got ", value.dump()));
}

// Dtype rank in the reference writer's layout (largest alignment first).
int LayoutRank(DType dtype) {
  switch (dtype) {
    case DType::kI64:
      return 0;
    case DType::kF32:
      return 1;
    case DType::kI32:
      return 2;
    case DType::kBF16:
      return 3;
    case DType::kF16:
      return 4;
    case DType::kU8:
      return 5;
    case DType::kBool:
      return 6;
  }
  return 7;
}

// JSON string literal for `s` (quotes and escapes); InvalidArgument when `s`
// is not valid UTF-8.
absl::StatusOr<std::string> JsonString(const std::string& s, absl::string_view what) {
  try {
    return Json(s).dump();
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid UTF-8"));
  }
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

// ----------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::ErrnoToStatus(err, absl::StrCat("cannot stat ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->source_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ >= 8) {  // Shorter files are refused by Parse(); mmap(0) fails.
    void* mapping = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapping == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::ErrnoToStatus(err, absl::StrCat("cannot mmap ", path));
    }
    file->mapping_ = mapping;
    file->mapping_size_ = file->size_;
    file->base_ = static_cast<const uint8_t*>(mapping);
  } else {
    file->base_ = reinterpret_cast<const uint8_t*>(file->owned_.data());
  }
  ::close(fd);  // The mapping keeps the file alive.
  RETURN_IF_ERROR(Annotate(file->Parse(), path));
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(std::string bytes,
                                                                            std::string source) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->source_ = std::move(source);
  file->owned_ = std::move(bytes);
  file->base_ = reinterpret_cast<const uint8_t*>(file->owned_.data());
  file->size_ = file->owned_.size();
  RETURN_IF_ERROR(Annotate(file->Parse(), file->source_));
  return file;
}

absl::Status SafetensorsFile::Parse() {
  if (size_ < 8) {
    return absl::DataLossError(
        absl::StrCat("file is ", size_, " bytes, shorter than the 8-byte header length"));
  }
  const uint64_t header_len = ReadLe64(base_);
  if (header_len > kSafetensorsMaxHeaderBytes) {
    return absl::DataLossError(absl::StrCat("header length ", header_len, " exceeds the limit of ",
                                            kSafetensorsMaxHeaderBytes, " bytes"));
  }
  if (header_len > size_ - 8) {
    return absl::DataLossError(absl::StrCat("header length ", header_len,
                                            " runs past the end of the file (", size_, " bytes)"));
  }
  data_start_ = 8 + static_cast<size_t>(header_len);
  const uint64_t data_size = size_ - data_start_;

  absl::StatusOr<Json> parsed =
      ParseStrictJson(absl::string_view(reinterpret_cast<const char*>(base_ + 8), header_len));
  if (!parsed.ok()) return Annotate(parsed.status(), "header");
  const Json& header = *parsed;
  if (!header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("header is a JSON ", header.type_name(), ", not an object"));
  }

  std::vector<std::tuple<uint64_t, uint64_t, std::string>> layout;  // begin, end, name
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (value.is_null()) continue;
      if (!value.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat("__metadata__ must be an object of strings, got ", value.type_name()));
      }
      for (const auto& [key, item] : value.items()) {
        if (!item.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "__metadata__ value of \"", key, "\" must be a string, got ", item.type_name()));
        }
        metadata_.emplace(key, item.get<std::string>());
      }
      continue;
    }
    const std::string where = absl::StrCat("tensor \"", name, "\"");
    if (!value.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": entry must be an object, got ", value.type_name()));
    }
    for (const auto& [field, unused] : value.items()) {
      if (field != "dtype" && field != "shape" && field != "data_offsets") {
        return absl::InvalidArgumentError(absl::StrCat(where, ": unknown field \"", field, "\""));
      }
    }
    Entry entry;
    // dtype
    auto dtype_it = value.find("dtype");
    if (dtype_it == value.end())
      return absl::InvalidArgumentError(absl::StrCat(where, ": missing dtype"));
    if (!dtype_it->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": dtype must be a string, got ", dtype_it->dump()));
    }
    absl::StatusOr<DType> dtype = ParseDType(dtype_it->get_ref<const std::string&>());
    if (!dtype.ok()) return Annotate(dtype.status(), where);
    entry.dtype = *dtype;
    // shape
    auto shape_it = value.find("shape");
    if (shape_it == value.end())
      return absl::InvalidArgumentError(absl::StrCat(where, ": missing shape"));
    if (!shape_it->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": shape must be an array, got ", shape_it->dump()));
    }
    for (const Json& dim : *shape_it) {
      absl::StatusOr<uint64_t> d = ReadUnsigned(dim, "shape dimension");
      if (!d.ok()) return Annotate(d.status(), where);
      entry.shape.push_back(static_cast<int64_t>(*d));
    }
    // data_offsets
    auto offsets_it = value.find("data_offsets");
    if (offsets_it == value.end()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": missing data_offsets"));
    }
    if (!offsets_it->is_array() || offsets_it->size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": data_offsets must be an array [begin, end], got ", offsets_it->dump()));
    }
    absl::StatusOr<uint64_t> begin = ReadUnsigned((*offsets_it)[0], "data_offsets begin");
    if (!begin.ok()) return Annotate(begin.status(), where);
    absl::StatusOr<uint64_t> end = ReadUnsigned((*offsets_it)[1], "data_offsets end");
    if (!end.ok()) return Annotate(end.status(), where);
    entry.begin = *begin;
    entry.end = *end;
    if (entry.begin > entry.end) {
      return absl::DataLossError(absl::StrCat(where, ": data_offsets [", entry.begin, ", ",
                                              entry.end, "] begin after end"));
    }
    if (entry.end > data_size) {
      return absl::DataLossError(absl::StrCat(where, ": data_offsets [", entry.begin, ", ",
                                              entry.end, "] out of the data region (", data_size,
                                              " bytes)"));
    }
    absl::StatusOr<uint64_t> expected = ByteCount(entry.dtype, entry.shape);
    if (!expected.ok()) return Annotate(expected.status(), where);
    if (entry.end - entry.begin != *expected) {
      return absl::DataLossError(absl::StrCat(
          where, ": byte count mismatch: data_offsets [", entry.begin, ", ", entry.end, "] hold ",
          entry.end - entry.begin, " bytes but shape ", ShapeString(entry.shape), " of ",
          DTypeName(entry.dtype), " needs ", *expected));
    }
    layout.emplace_back(entry.begin, entry.end, name);
    entries_.emplace(name, std::move(entry));  // Keys are unique (ParseStrictJson).
  }

  // Tensors must tile the data region: sorted by offset, each begins where
  // the previous ended, and the last ends at the end of the file.
  std::sort(layout.begin(), layout.end());
  uint64_t cursor = 0;
  const std::string* previous = nullptr;
  for (const auto& [begin, end, name] : layout) {
    if (begin < cursor) {
      return absl::DataLossError(absl::StrCat("tensor \"", name, "\": data_offsets [", begin, ", ",
                                              end, "] overlap tensor \"", *previous,
                                              "\" (which ends at ", cursor, ")"));
    }
    if (begin > cursor) {
      return absl::DataLossError(absl::StrCat(
          "tensor \"", name, "\": gap of ", begin - cursor, " unused bytes before it (",
          previous == nullptr ? std::string("data starts at 0")
                              : absl::StrCat("tensor \"", *previous, "\" ends at ", cursor),
          ")"));
    }
    cursor = end;
    previous = &name;
    names_.push_back(name);
  }
  if (cursor != data_size) {
    return absl::DataLossError(
        absl::StrCat(data_size - cursor, " unused bytes at the end of the data region",
                     previous == nullptr ? std::string(" (no tensors)")
                                         : absl::StrCat(" after tensor \"", *previous, "\"")));
  }
  return absl::OkStatus();
}

bool SafetensorsFile::Contains(absl::string_view name) const { return entries_.contains(name); }

absl::StatusOr<TensorView> SafetensorsFile::Get(absl::string_view name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("tensor \"", name, "\" not found in ", source_));
  }
  const Entry& entry = it->second;
  TensorView view;
  view.name = std::string(name);
  view.dtype = entry.dtype;
  view.shape = entry.shape;
  view.data = base_ + data_start_ + entry.begin;
  view.nbytes = static_cast<size_t>(entry.end - entry.begin);
  return view;
}

// ----------------------------------------------------------------------------
// SafetensorsWriter

absl::Status SafetensorsWriter::Add(std::string name, DType dtype, std::vector<int64_t> shape,
                                    const void* data, size_t nbytes) {
  const std::string where = absl::StrCat("tensor \"", name, "\"");
  if (name == kMetadataKey) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": name is reserved"));
  }
  RETURN_IF_ERROR(JsonString(name, absl::StrCat(where, ": name")).status());
  if (tensors_.count(name) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": duplicate name"));
  }
  absl::StatusOr<uint64_t> expected = ByteCount(dtype, shape);
  if (!expected.ok()) return Annotate(expected.status(), where);
  if (nbytes != *expected) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": byte count mismatch: got ", nbytes,
                                                   " bytes but shape ", ShapeString(shape), " of ",
                                                   DTypeName(dtype), " needs ", *expected));
  }
  if (nbytes > 0 && data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": null data"));
  }
  Pending pending{
      dtype, std::move(shape),
      nbytes == 0 ? std::string() : std::string(static_cast<const char*>(data), nbytes)};
  tensors_.emplace(std::move(name), std::move(pending));
  return absl::OkStatus();
}

void SafetensorsWriter::SetMetadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

absl::StatusOr<std::string> SafetensorsWriter::Serialize() const {
  std::vector<const std::pair<const std::string, Pending>*> order;
  order.reserve(tensors_.size());
  for (const auto& item : tensors_) order.push_back(&item);
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return LayoutRank(a->second.dtype) < LayoutRank(b->second.dtype);  // Names already sorted.
  });

  // Built by hand rather than with nlohmann so the key order matches the
  // reference writer byte for byte (dtype, shape, data_offsets).
  std::string header = "{";
  bool first = true;
  if (!metadata_.empty()) {
    header += "\"__metadata__\":{";
    bool first_item = true;
    for (const auto& [key, value] : metadata_) {
      ASSIGN_OR_RETURN(std::string k, JsonString(key, absl::StrCat("metadata key \"", key, "\"")));
      ASSIGN_OR_RETURN(std::string v,
                       JsonString(value, absl::StrCat("metadata value of \"", key, "\"")));
      absl::StrAppend(&header, first_item ? "" : ",", k, ":", v);
      first_item = false;
    }
    header += "}";
    first = false;
  }
  uint64_t offset = 0;
  for (const auto* item : order) {
    const Pending& t = item->second;
    ASSIGN_OR_RETURN(std::string name, JsonString(item->first, "tensor name"));
    absl::StrAppend(&header, first ? "" : ",", name, R"(:{"dtype":")", DTypeName(t.dtype),
                    R"(","shape":[)", absl::StrJoin(t.shape, ","), R"(],"data_offsets":[)", offset,
                    ",", offset + t.bytes.size(), "]}");
    offset += t.bytes.size();
    first = false;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + header.size() + offset);
  out += Le64(header.size());
  out += header;
  for (const auto* item : order) out += item->second.bytes;
  return out;
}

absl::Status SafetensorsWriter::WriteFile(const std::string& path) const {
  ASSIGN_OR_RETURN(std::string bytes, Serialize());
  return Annotate(WriteFileAtomically(path, bytes), absl::StrCat("writing ", path));
}

// ----------------------------------------------------------------------------
// CheckpointTensors

absl::StatusOr<std::unique_ptr<CheckpointTensors>> CheckpointTensors::Open(const std::string& dir) {
  std::unique_ptr<CheckpointTensors> ckpt(new CheckpointTensors());
  ckpt->dir_ = dir;
  const std::string index_path = dir + "/model.safetensors.index.json";
  const std::string single_path = dir + "/model.safetensors";

  if (!IsRegularFile(index_path)) {
    if (!IsRegularFile(single_path)) {
      return absl::NotFoundError(
          absl::StrCat(dir, ": neither model.safetensors nor model.safetensors.index.json found"));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(single_path));
    ckpt->names_ = file->names();
    std::sort(ckpt->names_.begin(), ckpt->names_.end());
    for (const std::string& name : ckpt->names_) ckpt->shard_of_.emplace(name, 0);
    ckpt->shards_.push_back(std::move(file));
    ckpt->shard_paths_.push_back(single_path);
    return ckpt;
  }

  ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path));
  absl::StatusOr<Json> parsed = ParseStrictJson(text);
  if (!parsed.ok()) return Annotate(parsed.status(), index_path);
  const Json& index = *parsed;
  auto invalid = [&index_path](absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": ", message));
  };
  if (!index.is_object()) return invalid("not a JSON object");
  auto map_it = index.find("weight_map");
  if (map_it == index.end()) return invalid("missing weight_map");
  if (!map_it->is_object()) return invalid("weight_map must be an object of tensor -> shard file");
  if (map_it->empty()) return invalid("weight_map is empty");

  std::map<std::string, std::vector<std::string>> by_shard;  // shard -> tensors
  for (const auto& [name, shard] : map_it->items()) {
    if (!shard.is_string()) {
      return invalid(absl::StrCat("weight_map entry of tensor \"", name,
                                  "\" must be a file name, got ", shard.dump()));
    }
    const auto& file = shard.get_ref<const std::string&>();
    bool escapes = file.empty() || file[0] == '/';
    for (absl::string_view part : absl::StrSplit(file, '/')) escapes |= part == "..";
    if (escapes) {
      return invalid(absl::StrCat("shard path \"", file, "\" of tensor \"", name,
                                  "\" escapes the checkpoint directory"));
    }
    by_shard[file].push_back(name);
    ckpt->names_.push_back(name);
  }
  for (const auto& [file, tensors] : by_shard) {
    const std::string path = absl::StrCat(dir, "/", file);
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> shard, SafetensorsFile::Open(path));
    for (const std::string& name : tensors) {
      if (!shard->Contains(name)) {
        return absl::DataLossError(absl::StrCat(index_path, ": tensor \"", name,
                                                "\" listed in weight_map is missing from shard \"",
                                                file, "\""));
      }
      ckpt->shard_of_.emplace(name, ckpt->shards_.size());
    }
    ckpt->shards_.push_back(std::move(shard));
    ckpt->shard_paths_.push_back(path);
  }
  std::sort(ckpt->names_.begin(), ckpt->names_.end());
  return ckpt;
}

bool CheckpointTensors::Contains(absl::string_view name) const { return shard_of_.contains(name); }

absl::StatusOr<TensorView> CheckpointTensors::Get(absl::string_view name) const {
  auto it = shard_of_.find(name);
  if (it == shard_of_.end()) {
    return absl::NotFoundError(
        absl::StrCat("tensor \"", name, "\" not found in checkpoint ", dir_));
  }
  return shards_[it->second]->Get(name);
}

}  // namespace specstream
