#include "common/offline_store.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/file.h"
#include "common/status.h"

namespace specstream {
namespace {

using Json = nlohmann::json;

// Shards carry the metadata torch-side loaders expect of a safetensors file.
constexpr absl::string_view kShardFormatMetadata = "pt";

std::string JoinPath(const std::string& dir, absl::string_view name) {
  return absl::StrCat(dir, "/", name);
}

// The key of sample `id`'s tensor `name` inside a shard.
std::string TensorKey(int64_t id, absl::string_view name) { return absl::StrCat(id, ".", name); }

bool ValidTensorName(absl::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

// "shard-" + at least five digits + ".safetensors".
bool IsShardFileName(absl::string_view name) {
  constexpr absl::string_view kPrefix = "shard-";
  constexpr absl::string_view kSuffix = ".safetensors";
  if (!absl::StartsWith(name, kPrefix) || !absl::EndsWith(name, kSuffix)) return false;
  absl::string_view digits =
      name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  if (digits.size() < 5) return false;
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// Temporaries WriteFileAtomically leaves behind when the process dies
// between creating and renaming them.
bool IsStoreTemporary(absl::string_view name) {
  return (absl::StartsWith(name, "shard-") || absl::StartsWith(name, kOfflineStoreIndexFile)) &&
         absl::StrContains(name, ".tmp-");
}

// -1 when `path` is not a regular file.
int64_t RegularFileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return -1;
  return static_cast<int64_t>(st.st_size);
}

absl::Status FieldError(absl::string_view field, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat("field \"", field, "\": ", reason));
}

absl::StatusOr<int64_t> NonNegativeInt(const Json& value, absl::string_view field) {
  if (value.is_number_unsigned()) {
    uint64_t v = value.get<uint64_t>();
    if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return static_cast<int64_t>(v);
    }
  } else if (value.is_number_integer()) {
    int64_t v = value.get<int64_t>();
    if (v >= 0) return v;
  }
  return FieldError(field, absl::StrCat("must be a non-negative integer, got ", value.dump()));
}

// The first place where `a` (the store's) and `b` (the writer's) differ:
// a dotted path below `path`, and both values as JSON ("(absent)" when a key
// is missing on one side).
struct Difference {
  std::string path;
  std::string ours;
  std::string theirs;
};

Difference FirstDifference(const Json& a, const Json& b, const std::string& path) {
  if (a.is_object() && b.is_object()) {
    std::set<std::string> keys;
    for (const auto& item : a.items()) keys.insert(item.key());
    for (const auto& item : b.items()) keys.insert(item.key());
    for (const std::string& key : keys) {
      const std::string sub = absl::StrCat(path, ".", key);
      auto ia = a.find(key);
      auto ib = b.find(key);
      if (ia == a.end()) return {sub, "(absent)", ib->dump()};
      if (ib == b.end()) return {sub, ia->dump(), "(absent)"};
      if (*ia != *ib) return FirstDifference(*ia, *ib, sub);
    }
  }
  return {path, a.dump(), b.dump()};
}

// index.json, parsed and validated.
struct ParsedIndex {
  Json contract;
  std::vector<StoreTensorSpec> specs;
  struct Shard {
    std::string file;
    std::vector<int64_t> samples;
    int64_t tokens = 0;
    int64_t bytes = 0;
  };
  std::vector<Shard> shards;
  bool complete = false;
};

// Validates the index text; errors name the field.
absl::StatusOr<ParsedIndex> ParseIndexFields(const std::string& text) {
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("invalid JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("index must be a JSON object, got ", root.type_name()));
  }
  for (const char* key : {"format", "version", "contract", "shards", "complete"}) {
    if (!root.contains(key)) return FieldError(key, "missing");
  }
  const Json& format = root["format"];
  if (!format.is_string() || format.get<std::string>() != kOfflineStoreFormat) {
    return FieldError("format",
                      absl::StrCat("expected \"", kOfflineStoreFormat, "\", got ", format.dump()));
  }
  const Json& version = root["version"];
  if (!version.is_number_integer() || version.get<int64_t>() != kOfflineStoreVersion) {
    return FieldError("version", absl::StrCat("unsupported version ", version.dump(), " (expected ",
                                              kOfflineStoreVersion, ")"));
  }

  ParsedIndex index;
  index.contract = root["contract"];
  if (!index.contract.is_object()) {
    return FieldError("contract",
                      absl::StrCat("must be an object, got ", index.contract.type_name()));
  }
  ASSIGN_OR_RETURN(index.specs, ParseStoreTensorSpecs(index.contract));

  const Json& complete = root["complete"];
  if (!complete.is_boolean()) {
    return FieldError("complete", absl::StrCat("must be a boolean, got ", complete.dump()));
  }
  index.complete = complete.get<bool>();

  const Json& shards = root["shards"];
  if (!shards.is_array()) {
    return FieldError("shards", absl::StrCat("must be an array, got ", shards.type_name()));
  }
  std::set<int64_t> seen;
  for (size_t i = 0; i < shards.size(); ++i) {
    const Json& entry = shards[i];
    const std::string field = absl::StrCat("shards[", i, "]");
    if (!entry.is_object()) {
      return FieldError(field, absl::StrCat("must be an object, got ", entry.type_name()));
    }
    for (const char* key : {"file", "samples", "tokens", "bytes"}) {
      if (!entry.contains(key)) return FieldError(absl::StrCat(field, ".", key), "missing");
    }
    ParsedIndex::Shard shard;
    // Shards are numbered by position; anything else (a path, "..") is refused.
    const Json& file = entry["file"];
    const std::string expected = OfflineStoreShardFileName(static_cast<int64_t>(i));
    if (!file.is_string() || file.get<std::string>() != expected) {
      return FieldError(absl::StrCat(field, ".file"),
                        absl::StrCat("expected \"", expected, "\", got ", file.dump()));
    }
    shard.file = expected;
    const Json& samples = entry["samples"];
    if (!samples.is_array() || samples.empty()) {
      return FieldError(
          absl::StrCat(field, ".samples"),
          absl::StrCat("must be a non-empty array of sample ids, got ", samples.dump()));
    }
    for (size_t j = 0; j < samples.size(); ++j) {
      const std::string sample_field = absl::StrCat(field, ".samples[", j, "]");
      ASSIGN_OR_RETURN(int64_t id, NonNegativeInt(samples[j], sample_field));
      if (!seen.insert(id).second) {
        return FieldError(sample_field, absl::StrCat("sample ", id, " listed twice"));
      }
      shard.samples.push_back(id);
    }
    ASSIGN_OR_RETURN(shard.tokens, NonNegativeInt(entry["tokens"], absl::StrCat(field, ".tokens")));
    ASSIGN_OR_RETURN(shard.bytes, NonNegativeInt(entry["bytes"], absl::StrCat(field, ".bytes")));
    index.shards.push_back(std::move(shard));
  }
  return index;
}

// ParseIndexFields with every error turned into DataLoss prefixed with
// `path`: a malformed index means a damaged store.
absl::StatusOr<ParsedIndex> ParseIndex(const std::string& path, const std::string& text) {
  absl::StatusOr<ParsedIndex> index = ParseIndexFields(text);
  if (!index.ok()) return absl::DataLossError(absl::StrCat(path, ": ", index.status().message()));
  return index;
}

// Every listed shard must be a regular file of the recorded size.
absl::Status CheckShardFiles(const std::string& dir,
                             const std::vector<ParsedIndex::Shard>& shards) {
  for (const ParsedIndex::Shard& shard : shards) {
    const std::string path = JoinPath(dir, shard.file);
    int64_t size = RegularFileSize(path);
    if (size < 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": shard listed in ", kOfflineStoreIndexFile, " is missing"));
    }
    if (size != shard.bytes) {
      return absl::DataLossError(absl::StrCat(path, ": shard has ", size, " bytes, ",
                                              kOfflineStoreIndexFile, " records ", shard.bytes));
    }
  }
  return absl::OkStatus();
}

// Deletes shard files not in `listed` and store temporaries: what a writer
// killed between writing a shard and rewriting the index leaves behind.
absl::Status RemoveUnlistedFiles(const std::string& dir, const std::set<std::string>& listed) {
  std::error_code ec;
  std::vector<std::string> doomed;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if ((IsShardFileName(name) && listed.count(name) == 0) || IsStoreTemporary(name)) {
      doomed.push_back(name);
    }
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  for (const std::string& name : doomed) {
    const std::string path = JoinPath(dir, name);
    if (std::remove(path.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("cannot delete unlisted store file ", path));
    }
  }
  return absl::OkStatus();
}

// Checks `tensor` against `spec` and returns its token count (first
// dimension). `where` names the sample (and shard) for errors.
absl::StatusOr<int64_t> CheckTensor(const TensorView& tensor, const StoreTensorSpec& spec,
                                    absl::string_view where) {
  auto error = [&](absl::string_view reason) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ", tensor \"", spec.name, "\": ", reason));
  };
  if (tensor.dtype != spec.dtype) {
    return error(absl::StrCat("dtype ", DTypeName(tensor.dtype), ", the contract says ",
                              DTypeName(spec.dtype)));
  }
  bool shape_ok = tensor.shape.size() == spec.inner_shape.size() + 1;
  for (size_t d = 0; shape_ok && d < spec.inner_shape.size(); ++d) {
    shape_ok = tensor.shape[d + 1] == spec.inner_shape[d];
  }
  if (!shape_ok) {
    std::vector<std::string> dims = {"T"};
    for (int64_t d : spec.inner_shape) dims.push_back(absl::StrCat(d));
    return error(absl::StrCat("shape ", ShapeString(tensor.shape), ", the contract says [",
                              absl::StrJoin(dims, ", "), "]"));
  }
  absl::StatusOr<uint64_t> elements = NumElements(tensor.shape);
  if (!elements.ok()) return error(elements.status().message());
  if (tensor.nbytes != *elements * DTypeSize(tensor.dtype)) {
    return error(absl::StrCat(tensor.nbytes, " bytes for shape ", ShapeString(tensor.shape), " of ",
                              DTypeName(tensor.dtype)));
  }
  if (tensor.nbytes > 0 && tensor.data == nullptr) return error("null data");
  return tensor.shape[0];
}

}  // namespace

std::string OfflineStoreShardFileName(int64_t shard) {
  return absl::StrFormat("shard-%05d.safetensors", shard);
}

nlohmann::json StoreTensorsContract(const std::vector<StoreTensorSpec>& specs) {
  Json tensors = Json::object();
  for (const StoreTensorSpec& spec : specs) {
    Json shape = Json::array({"T"});
    for (int64_t d : spec.inner_shape) shape.push_back(d);
    tensors[spec.name] = {{"dtype", std::string(DTypeName(spec.dtype))}, {"shape", shape}};
  }
  return tensors;
}

absl::StatusOr<std::vector<StoreTensorSpec>> ParseStoreTensorSpecs(const nlohmann::json& contract) {
  if (!contract.is_object()) {
    return FieldError("contract", absl::StrCat("must be an object, got ", contract.type_name()));
  }
  auto it = contract.find("tensors");
  if (it == contract.end()) return FieldError("contract.tensors", "missing");
  if (!it->is_object() || it->empty()) {
    return FieldError("contract.tensors",
                      absl::StrCat("must be a non-empty object of tensor name -> "
                                   "{\"dtype\", \"shape\"}, got ",
                                   it->dump()));
  }
  std::vector<StoreTensorSpec> specs;
  for (const auto& item : it->items()) {  // Sorted by name (std::map-backed).
    const std::string field = absl::StrCat("contract.tensors.", item.key());
    if (!ValidTensorName(item.key())) {
      return FieldError(field, "tensor names must be non-empty and use only [A-Za-z0-9_]");
    }
    const Json& entry = item.value();
    if (!entry.is_object()) {
      return FieldError(field, absl::StrCat("must be an object, got ", entry.dump()));
    }
    for (const auto& key : entry.items()) {
      if (key.key() != "dtype" && key.key() != "shape") {
        return FieldError(absl::StrCat(field, ".", key.key()), "unknown key");
      }
    }
    StoreTensorSpec spec;
    spec.name = item.key();
    auto dtype = entry.find("dtype");
    if (dtype == entry.end()) return FieldError(absl::StrCat(field, ".dtype"), "missing");
    if (!dtype->is_string()) {
      return FieldError(absl::StrCat(field, ".dtype"),
                        absl::StrCat("must be a string, got ", dtype->dump()));
    }
    absl::StatusOr<DType> parsed = ParseDType(dtype->get<std::string>());
    if (!parsed.ok()) return FieldError(absl::StrCat(field, ".dtype"), parsed.status().message());
    spec.dtype = *parsed;
    auto shape = entry.find("shape");
    if (shape == entry.end()) return FieldError(absl::StrCat(field, ".shape"), "missing");
    if (!shape->is_array() || shape->empty() || (*shape)[0] != "T") {
      return FieldError(absl::StrCat(field, ".shape"),
                        absl::StrCat("must be an array starting with \"T\", got ", shape->dump()));
    }
    for (size_t d = 1; d < shape->size(); ++d) {
      const Json& dim = (*shape)[d];
      if (!dim.is_number_integer() || dim.get<int64_t>() <= 0) {
        return FieldError(absl::StrCat(field, ".shape[", d, "]"),
                          absl::StrCat("must be a positive integer, got ", dim.dump()));
      }
      spec.inner_shape.push_back(dim.get<int64_t>());
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

// ----------------------------------------------------------------------------
// StoreWriter

absl::StatusOr<std::unique_ptr<StoreWriter>> StoreWriter::Open(const std::string& dir,
                                                               nlohmann::json contract,
                                                               StoreWriterOptions options) {
  if (options.max_shard_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_shard_bytes must be positive, got ", options.max_shard_bytes));
  }
  if (options.max_shard_samples < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_shard_samples must be non-negative (0: no limit), got ", options.max_shard_samples));
  }
  ASSIGN_OR_RETURN(std::vector<StoreTensorSpec> specs, ParseStoreTensorSpecs(contract));

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));

  std::unique_ptr<StoreWriter> writer(new StoreWriter());
  writer->dir_ = dir;
  writer->contract_ = std::move(contract);
  writer->options_ = options;
  writer->specs_ = std::move(specs);

  const std::string index_path = JoinPath(dir, kOfflineStoreIndexFile);
  std::set<std::string> listed;
  if (RegularFileSize(index_path) >= 0) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path));
    ASSIGN_OR_RETURN(ParsedIndex index, ParseIndex(index_path, text));
    if (index.contract != writer->contract_) {
      Difference diff = FirstDifference(index.contract, writer->contract_, "contract");
      return absl::FailedPreconditionError(
          absl::StrCat(index_path, ": the store was written with a different contract: key \"",
                       diff.path, "\" is ", diff.ours, " in the store but ", diff.theirs, " now"));
    }
    RETURN_IF_ERROR(CheckShardFiles(dir, index.shards));
    for (ParsedIndex::Shard& shard : index.shards) {
      listed.insert(shard.file);
      for (int64_t id : shard.samples) writer->stored_.emplace(id, writer->shards_.size());
      writer->shards_.push_back(
          Shard{std::move(shard.file), std::move(shard.samples), shard.tokens, shard.bytes});
    }
    RETURN_IF_ERROR(RemoveUnlistedFiles(dir, listed));
  } else {
    RETURN_IF_ERROR(RemoveUnlistedFiles(dir, listed));
    // Recording the contract at once makes every later state of the directory
    // an index plus listed shards plus strays.
    RETURN_IF_ERROR(writer->WriteIndex(/*complete=*/false));
  }
  return writer;
}

bool StoreWriter::Contains(int64_t id) const {
  return stored_.contains(id) || pending_index_.contains(id);
}

absl::Status StoreWriter::Add(int64_t id, const std::vector<TensorView>& tensors) {
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("store writer for ", dir_,
                                                      " is unusable after an earlier error (",
                                                      broken_.message(), "); reopen it to resume"));
  }
  if (finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat("store writer for ", dir_, ": Add(", id, ") after Finish()"));
  }
  const std::string where = absl::StrCat("sample ", id);
  if (id < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": ids must be non-negative"));
  if (stored_.contains(id)) {
    return absl::AlreadyExistsError(
        absl::StrCat(where, " is already stored (in ", shards_[stored_.at(id)].file, ")"));
  }
  if (pending_index_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat(where, " was already added"));
  }

  // Match the given tensors to the contract's, all checks before any copy.
  std::vector<const TensorView*> by_spec(specs_.size(), nullptr);
  for (const TensorView& tensor : tensors) {
    auto spec = std::find_if(specs_.begin(), specs_.end(),
                             [&tensor](const StoreTensorSpec& s) { return s.name == tensor.name; });
    if (spec == specs_.end()) {
      std::vector<std::string> names;
      for (const StoreTensorSpec& s : specs_) names.push_back(s.name);
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown tensor \"", tensor.name,
                                                     "\" (the contract has ",
                                                     absl::StrJoin(names, ", "), ")"));
    }
    const TensorView*& slot = by_spec[spec - specs_.begin()];
    if (slot != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tensor \"", tensor.name, "\" given twice"));
    }
    slot = &tensor;
  }
  int64_t tokens = -1;
  const StoreTensorSpec* tokens_from = nullptr;
  int64_t sample_bytes = 0;
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (by_spec[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": missing tensor \"", specs_[i].name, "\""));
    }
    ASSIGN_OR_RETURN(int64_t t, CheckTensor(*by_spec[i], specs_[i], where));
    if (tokens_from != nullptr && t != tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ", tensor \"", specs_[i].name, "\": ", t,
          " tokens (first dimension) but tensor \"", tokens_from->name, "\" has ", tokens));
    }
    tokens = t;
    tokens_from = &specs_[i];
    sample_bytes += static_cast<int64_t>(by_spec[i]->nbytes);
  }
  if (tokens == 0) return absl::InvalidArgumentError(absl::StrCat(where, ": no tokens (T = 0)"));

  if (pending_ == nullptr) {
    pending_ = std::make_unique<SafetensorsWriter>();
    pending_->SetMetadata("format", std::string(kShardFormatMetadata));
  }
  for (size_t i = 0; i < specs_.size(); ++i) {
    const TensorView& t = *by_spec[i];
    absl::Status status =
        pending_->Add(TensorKey(id, specs_[i].name), t.dtype, t.shape, t.data, t.nbytes);
    if (!status.ok()) {  // Unreachable after the checks above; the shard is now inconsistent.
      broken_ = Annotate(status, where);
      return broken_;
    }
  }
  pending_index_.emplace(id, pending_samples_.size());
  pending_samples_.push_back(id);
  pending_tokens_ += tokens;
  pending_bytes_ += sample_bytes;

  // The cut rule: checked after each sample, on counts the sample sequence
  // alone determines, so a resumed run cuts where an uninterrupted one does.
  const bool full_by_bytes = pending_bytes_ >= options_.max_shard_bytes;
  const bool full_by_count =
      options_.max_shard_samples > 0 &&
      static_cast<int64_t>(pending_samples_.size()) >= options_.max_shard_samples;
  if (full_by_bytes || full_by_count) return FlushShard();
  return absl::OkStatus();
}

absl::Status StoreWriter::FlushShard() {
  Shard shard;
  shard.file = OfflineStoreShardFileName(static_cast<int64_t>(shards_.size()));
  const std::string path = JoinPath(dir_, shard.file);
  absl::StatusOr<std::string> bytes = pending_->Serialize();
  absl::Status status = bytes.status();
  if (status.ok()) status = WriteFileAtomically(path, *bytes);
  if (!status.ok()) {
    broken_ = Annotate(status, absl::StrCat("writing shard ", path));
    return broken_;
  }
  shard.samples = std::move(pending_samples_);
  shard.tokens = pending_tokens_;
  shard.bytes = static_cast<int64_t>(bytes->size());
  for (int64_t id : shard.samples) stored_.emplace(id, shards_.size());
  shards_.push_back(std::move(shard));
  pending_.reset();
  pending_samples_.clear();
  pending_index_.clear();
  pending_tokens_ = 0;
  pending_bytes_ = 0;
  status = WriteIndex(/*complete=*/false);
  if (!status.ok()) broken_ = status;
  return status;
}

absl::Status StoreWriter::WriteIndex(bool complete) {
  Json shards = Json::array();
  for (const Shard& shard : shards_) {
    shards.push_back({{"file", shard.file},
                      {"samples", shard.samples},
                      {"tokens", shard.tokens},
                      {"bytes", shard.bytes}});
  }
  Json index = {{"format", std::string(kOfflineStoreFormat)},
                {"version", kOfflineStoreVersion},
                {"contract", contract_},
                {"shards", std::move(shards)},
                {"complete", complete}};
  const std::string path = JoinPath(dir_, kOfflineStoreIndexFile);
  return Annotate(WriteFileAtomically(path, index.dump(2) + "\n"), absl::StrCat("writing ", path));
}

absl::Status StoreWriter::Finish() {
  if (finished_) return absl::OkStatus();
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("store writer for ", dir_,
                                                      " is unusable after an earlier error (",
                                                      broken_.message(), "); reopen it to resume"));
  }
  if (!pending_samples_.empty()) RETURN_IF_ERROR(FlushShard());
  absl::Status status = WriteIndex(/*complete=*/true);
  if (!status.ok()) {
    broken_ = status;
    return status;
  }
  finished_ = true;
  return absl::OkStatus();
}

// ----------------------------------------------------------------------------
// StoreReader

absl::StatusOr<std::unique_ptr<StoreReader>> StoreReader::Open(const std::string& dir) {
  const std::string index_path = JoinPath(dir, kOfflineStoreIndexFile);
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path));
  ASSIGN_OR_RETURN(ParsedIndex index, ParseIndex(index_path, text));
  RETURN_IF_ERROR(CheckShardFiles(dir, index.shards));

  std::unique_ptr<StoreReader> reader(new StoreReader());
  reader->dir_ = dir;
  reader->contract_ = std::move(index.contract);
  reader->specs_ = std::move(index.specs);
  reader->complete_ = index.complete;
  for (ParsedIndex::Shard& shard : index.shards) {
    for (int64_t id : shard.samples) {
      reader->shard_of_.emplace(id, reader->shards_.size());
      reader->sample_ids_.push_back(id);
    }
    reader->num_tokens_ += shard.tokens;
    reader->shards_.push_back(
        Shard{std::move(shard.file), std::move(shard.samples), shard.tokens, shard.bytes});
  }
  {
    absl::MutexLock lock(&reader->mu_);
    reader->opened_.resize(reader->shards_.size());
  }
  return reader;
}

absl::StatusOr<const SafetensorsFile*> StoreReader::OpenShard(size_t index) const {
  absl::MutexLock lock(&mu_);
  OpenedShard& opened = opened_[index];
  if (!opened.tried) {
    opened.tried = true;
    const Shard& shard = shards_[index];
    const std::string path = JoinPath(dir_, shard.file);
    // Maps the shard and checks it against the index: exactly the listed
    // samples' tensors, each as the contract says, with the recorded tokens.
    auto open_and_verify = [&]() -> absl::StatusOr<std::unique_ptr<SafetensorsFile>> {
      ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
      auto damaged = [&path](absl::string_view message) {
        return absl::DataLossError(absl::StrCat(path, ": ", message));
      };
      const size_t expected = shard.samples.size() * specs_.size();
      if (file->names().size() != expected) {
        return damaged(absl::StrCat("holds ", file->names().size(), " tensors, ",
                                    kOfflineStoreIndexFile, " lists ", shard.samples.size(),
                                    " samples of ", specs_.size(), " tensors"));
      }
      int64_t tokens = 0;
      for (int64_t id : shard.samples) {
        int64_t sample_tokens = -1;
        for (const StoreTensorSpec& spec : specs_) {
          absl::StatusOr<TensorView> view = file->Get(TensorKey(id, spec.name));
          if (!view.ok()) return damaged(view.status().message());
          absl::StatusOr<int64_t> t = CheckTensor(*view, spec, absl::StrCat("sample ", id));
          if (!t.ok()) return damaged(t.status().message());
          if (sample_tokens >= 0 && *t != sample_tokens) {
            return damaged(absl::StrCat("sample ", id, ", tensor \"", spec.name, "\": ", *t,
                                        " tokens, other tensors have ", sample_tokens));
          }
          sample_tokens = *t;
        }
        tokens += sample_tokens;
      }
      if (tokens != shard.tokens) {
        return damaged(absl::StrCat("holds ", tokens, " tokens, ", kOfflineStoreIndexFile,
                                    " records ", shard.tokens));
      }
      return file;
    };
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = open_and_verify();
    if (file.ok()) {
      opened.file = *std::move(file);
    } else {
      opened.status = file.status();
    }
  }
  if (!opened.status.ok()) return opened.status;
  return opened.file.get();
}

absl::StatusOr<std::vector<TensorView>> StoreReader::Get(int64_t id) const {
  auto it = shard_of_.find(id);
  if (it == shard_of_.end()) {
    return absl::NotFoundError(absl::StrCat("sample ", id, " is not in the store ", dir_));
  }
  // The file outlives the lock: shards are never unmapped while the reader lives.
  ASSIGN_OR_RETURN(const SafetensorsFile* file, OpenShard(it->second));
  std::vector<TensorView> views;
  views.reserve(specs_.size());
  for (const StoreTensorSpec& spec : specs_) {
    ASSIGN_OR_RETURN(TensorView view, file->Get(TensorKey(id, spec.name)));
    view.name = spec.name;
    views.push_back(std::move(view));
  }
  return views;
}

}  // namespace specstream
