#include "student/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/crc32c.h"
#include "common/file.h"
#include "common/logging.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"

namespace specstream::student {
namespace {

namespace fs = std::filesystem;

constexpr char kFormat[] = "specstream-checkpoint/1";
constexpr char kDraftFile[] = "draft.safetensors";
constexpr char kOptimizerFile[] = "optimizer.safetensors";
constexpr char kStateFile[] = "state.json";
constexpr char kManifestFile[] = "manifest.json";
constexpr char kLatestFile[] = "latest";
constexpr char kTmpPrefix[] = ".tmp-";
constexpr char kCorruptPrefix[] = "corrupt-";
constexpr char kChecksums[] = "crc32c";  // manifest: file -> CRC32C of its bytes

std::string RngFileName(int rank) { return absl::StrCat("rng-rank-", rank, ".bin"); }

// "step-00000123" -> 123; nullopt for anything else.
std::optional<int64_t> ParseStepDirName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "step-") || name.size() < 8) return std::nullopt;
  for (char c : name) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  int64_t step = 0;
  if (!absl::SimpleAtoi(name, &step)) return std::nullopt;
  return step;
}

absl::StatusOr<std::string> SerializeTensors(const std::map<std::string, torch::Tensor>& tensors,
                                             absl::string_view what, int64_t step) {
  SafetensorsWriter writer;
  writer.SetMetadata("format", kFormat);
  writer.SetMetadata("step", absl::StrCat(step));
  for (const auto& entry : tensors) {
    const std::string& name = entry.first;
    const torch::Tensor& tensor = entry.second;
    if (!tensor.defined()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " tensor ", name, ": undefined"));
    }
    absl::Status added;
    RETURN_IF_ERROR(CatchTorch(absl::StrCat(what, " tensor ", name),
                               [&] { added = AddTensor(writer, name, tensor); }));
    if (!added.ok()) return Annotate(added, absl::StrCat(what, " tensor ", name));
  }
  return writer.Serialize();
}

absl::StatusOr<std::map<std::string, torch::Tensor>> ParseTensors(std::string bytes,
                                                                  const std::string& path) {
  ASSIGN_OR_RETURN(auto file, SafetensorsFile::FromBytes(std::move(bytes), path));
  std::map<std::string, torch::Tensor> tensors;
  for (const std::string& name : file->names()) {
    ASSIGN_OR_RETURN(TensorView view, file->Get(name));
    ASSIGN_OR_RETURN(tensors[name], TensorFromView(view));
  }
  return tensors;
}

}  // namespace

std::string CheckpointDirName(int64_t step) { return absl::StrFormat("step-%08d", step); }

std::string CheckpointManager::StepDir(int64_t step) const {
  return absl::StrCat(options_.root, "/", CheckpointDirName(step));
}

absl::StatusOr<std::unique_ptr<CheckpointManager>> CheckpointManager::Create(
    CheckpointOptions options) {
  if (options.root.empty()) return absl::InvalidArgumentError("checkpoint root: empty");
  if (options.keep_last < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint keep_last: must be >= 0, got ", options.keep_last));
  }
  while (options.root.size() > 1 && options.root.back() == '/') options.root.pop_back();
  if (options.read_only) {
    return std::unique_ptr<CheckpointManager>(new CheckpointManager(std::move(options)));
  }
  std::error_code ec;
  fs::create_directories(options.root, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create checkpoint root ", options.root, ": ", ec.message()));
  }
  auto manager = std::unique_ptr<CheckpointManager>(new CheckpointManager(std::move(options)));
  // Clean what a crashed Save left: temporaries, and step directories that are
  // not complete (Save never leaves one, but a copy or a full disk can).
  std::vector<std::string> doomed;
  for (const auto& entry : fs::directory_iterator(manager->root(), ec)) {
    std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, kTmpPrefix)) {
      SS_LOG_WARN("checkpoint: removing leftover temporary {}", entry.path().string());
      doomed.push_back(entry.path().string());
    } else if (auto step = ParseStepDirName(name); step.has_value()) {
      absl::Status complete = manager->CheckComplete(*step);
      // Only structural damage condemns a directory; an I/O or permission
      // error might pass, and deleting a good checkpoint cannot be undone.
      if (absl::IsNotFound(complete) || absl::IsDataLoss(complete)) {
        SS_LOG_WARN("checkpoint: removing incomplete {}: {}", entry.path().string(),
                    complete.ToString());
        doomed.push_back(entry.path().string());
      }
    }
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot list checkpoint root ", manager->root(), ": ", ec.message()));
  }
  for (const std::string& path : doomed) RemoveAllQuietly(path);
  return manager;
}

absl::Status CheckpointManager::Save(int64_t step, const CheckpointContents& contents) {
  if (options_.read_only) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint root ", root(), " was opened read-only"));
  }
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("checkpoint step ", step, " < 0"));
  if (!contents.state.is_object()) {
    return absl::InvalidArgumentError("checkpoint state: must be a JSON object");
  }
  int world = static_cast<int>(contents.rng_by_rank.size());
  for (int rank = 0; rank < world; ++rank) {
    if (contents.rng_by_rank.count(rank) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint rng_by_rank: ranks must be 0..",
                                                     world - 1, ", rank ", rank, " missing"));
    }
  }
  // Everything that can be refused is refused before the first byte hits the
  // disk.
  ASSIGN_OR_RETURN(std::string draft_bytes, SerializeTensors(contents.draft, "draft", step));
  ASSIGN_OR_RETURN(std::string optimizer_bytes,
                   SerializeTensors(contents.optimizer, "optimizer", step));
  std::string state_text = contents.state.dump(2) + "\n";

  std::vector<std::pair<std::string, absl::string_view>> files = {
      {kDraftFile, draft_bytes}, {kOptimizerFile, optimizer_bytes}, {kStateFile, state_text}};
  for (const auto& [rank, bytes] : contents.rng_by_rank)
    files.emplace_back(RngFileName(rank), bytes);

  const std::string name = CheckpointDirName(step);
  const std::string final_dir = StepDir(step);
  Env& env = Env::Or(options_.env);
  nlohmann::json manifest = {{"format", kFormat}, {"step", step}, {"world_size", world}};
  nlohmann::json& sizes = manifest["files"] = nlohmann::json::object();
  nlohmann::json& checksums = manifest[kChecksums] = nlohmann::json::object();
  for (const auto& [file, bytes] : files) {
    sizes[file] = bytes.size();
    checksums[file] = Crc32c(bytes);
  }
  // The manifest goes last: a directory with a valid manifest has every file.
  const std::string manifest_text = manifest.dump(2) + "\n";
  files.emplace_back(kManifestFile, manifest_text);
  DirectoryReplaceOptions replace;
  replace.staging_prefix = absl::StrCat(root(), "/", kTmpPrefix, name, "-");
  replace.aside_prefix = absl::StrCat(root(), "/", kTmpPrefix, "replaced-", name, "-");
  replace.before_swap = [&] {
    return CrashAt("tmp_written") ? absl::AbortedError("checkpoint: simulated crash")
                                  : absl::OkStatus();
  };
  absl::Status status = ReplaceDirectory(env, final_dir, files, replace);
  if (!status.ok()) return Annotate(status, absl::StrCat("saving checkpoint ", final_dir));
  if (CrashAt("renamed")) return absl::AbortedError("checkpoint: simulated crash");

  status = env.WriteFileAtomically(absl::StrCat(root(), "/", kLatestFile), name + "\n");
  if (!status.ok()) return Annotate(status, absl::StrCat("saving checkpoint ", final_dir));
  SS_LOG_INFO("checkpoint: saved step {} to {}", step, final_dir);
  return Prune(step);
}

absl::Status CheckpointManager::Prune(int64_t just_saved) const {
  if (options_.keep_last == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps());
  std::vector<int64_t> older;
  for (int64_t step : steps) {
    if (step < just_saved) older.push_back(step);
  }
  // Newest first; the one just saved counts towards keep_last.
  std::sort(older.rbegin(), older.rend());
  for (auto i = static_cast<size_t>(options_.keep_last - 1); i < older.size(); ++i) {
    // Rename first so a crash mid-removal leaves a .tmp-* (cleaned by Create),
    // never a step directory with some of its files.
    const std::string dir = StepDir(older[i]);
    Env& env = Env::Or(options_.env);
    auto doomed = env.MakeTempDirectory(absl::StrCat(root(), "/", kTmpPrefix, "pruned-"));
    if (!doomed.ok() || !env.Rename(dir, *doomed).ok()) {
      SS_LOG_WARN("checkpoint: cannot prune {}", dir);
      if (doomed.ok()) RemoveAllQuietly(*doomed);
      continue;
    }
    SS_LOG_INFO("checkpoint: pruned {}", dir);
    RemoveAllQuietly(*doomed);
  }
  return absl::OkStatus();
}

absl::Status CheckpointManager::CheckComplete(int64_t step) const {
  const std::string dir = StepDir(step);
  auto in_dir = [&](const absl::Status& s) {
    return Annotate(s, absl::StrCat("checkpoint ", dir));
  };
  auto text = ReadFileToString(absl::StrCat(dir, "/", kManifestFile));
  if (!text.ok()) return in_dir(text.status());
  nlohmann::json manifest = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!manifest.is_object() || manifest.value("format", "") != kFormat ||
      !manifest.contains("step") || !manifest["step"].is_number_integer() ||
      !manifest.contains("files") || !manifest["files"].is_object()) {
    return in_dir(absl::DataLossError(absl::StrCat(kManifestFile, ": not a checkpoint manifest")));
  }
  if (manifest["step"].get<int64_t>() != step) {
    return in_dir(absl::DataLossError(
        absl::StrCat(kManifestFile, ": names step ", manifest["step"].get<int64_t>())));
  }
  const nlohmann::json& files = manifest["files"];
  for (const char* required : {kDraftFile, kOptimizerFile, kStateFile}) {
    if (!files.contains(required)) {
      return in_dir(absl::DataLossError(absl::StrCat(kManifestFile, ": does not list ", required)));
    }
  }
  for (const auto& [file, size] : files.items()) {
    if (file.find('/') != std::string::npos || !size.is_number_unsigned()) {
      return in_dir(absl::DataLossError(absl::StrCat(kManifestFile, ": bad entry ", file)));
    }
    std::string path = absl::StrCat(dir, "/", file);
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return in_dir(ErrnoStatus("missing", path));
    if (static_cast<uint64_t>(st.st_size) != size.get<uint64_t>()) {
      return in_dir(absl::DataLossError(
          absl::StrCat(file, ": ", st.st_size, " bytes, expected ", size.get<uint64_t>())));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> CheckpointManager::ListSteps() const {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::exists(root(), ec)) return steps;  // A reader before the first save.
  for (const auto& entry : fs::directory_iterator(root(), ec)) {
    auto step = ParseStepDirName(entry.path().filename().string());
    if (step.has_value() && CheckComplete(*step).ok()) steps.push_back(*step);
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot list checkpoint root ", root(), ": ", ec.message()));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::StatusOr<std::optional<int64_t>> CheckpointManager::LatestStep() const {
  const std::string latest_path = absl::StrCat(root(), "/", kLatestFile);
  auto latest = ReadFileToString(latest_path);
  if (latest.ok()) {
    auto step = ParseStepDirName(absl::StripAsciiWhitespace(*latest));
    if (step.has_value()) {
      absl::Status complete = CheckComplete(*step);
      if (complete.ok()) return std::optional<int64_t>(*step);
      SS_LOG_WARN(
          "checkpoint: {} points at an unusable checkpoint ({}); using the newest "
          "complete one",
          latest_path, complete.ToString());
    } else {
      SS_LOG_WARN("checkpoint: {} does not name a step directory; ignoring it", latest_path);
    }
  } else if (!absl::IsNotFound(latest.status())) {
    return latest.status();
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps());
  if (steps.empty()) return std::optional<int64_t>();
  return std::optional<int64_t>(steps.back());
}

absl::StatusOr<CheckpointContents> CheckpointManager::Load(int64_t step) const {
  const std::string dir = StepDir(step);
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", dir, ": no such checkpoint"));
  }
  RETURN_IF_ERROR(CheckComplete(step));
  auto in_dir = [&](const absl::Status& s) {
    return Annotate(s, absl::StrCat("checkpoint ", dir));
  };
  // Manifest already checked by CheckComplete: the checksums and the rank
  // count come from it.
  ASSIGN_OR_RETURN(std::string manifest_text,
                   ReadFileToString(absl::StrCat(dir, "/", kManifestFile)));
  const nlohmann::json manifest = nlohmann::json::parse(manifest_text, nullptr, false);
  const nlohmann::json checksums = manifest.value(kChecksums, nlohmann::json::object());
  // A file's bytes, checked against the manifest's CRC32C when it has one.
  auto read = [&](const std::string& file) -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(absl::StrCat(dir, "/", file)));
    auto expected = checksums.find(file);
    if (expected != checksums.end()) {
      const uint32_t actual = Crc32c(bytes);
      if (!expected->is_number_unsigned() || expected->get<uint64_t>() != actual) {
        return absl::DataLossError(absl::StrFormat(
            "%s: CRC32C %08x, the manifest says %s (the file changed after it was written)", file,
            actual, expected->dump()));
      }
    }
    return bytes;
  };
  CheckpointContents contents;
  for (auto [file, tensors] : {std::make_pair(kDraftFile, &contents.draft),
                               std::make_pair(kOptimizerFile, &contents.optimizer)}) {
    absl::StatusOr<std::string> bytes = read(file);
    if (!bytes.ok()) return in_dir(bytes.status());
    auto parsed = ParseTensors(*std::move(bytes), absl::StrCat(dir, "/", file));
    if (!parsed.ok()) return in_dir(parsed.status());
    *tensors = std::move(*parsed);
  }
  auto state_text = read(kStateFile);
  if (!state_text.ok()) return in_dir(state_text.status());
  contents.state = nlohmann::json::parse(*state_text, nullptr, /*allow_exceptions=*/false);
  if (!contents.state.is_object()) {
    return in_dir(absl::DataLossError(absl::StrCat(kStateFile, ": not a JSON object")));
  }
  const int world = manifest.value("world_size", 0);
  for (int rank = 0; rank < world; ++rank) {
    auto bytes = read(RngFileName(rank));
    if (!bytes.ok()) return in_dir(Annotate(bytes.status(), RngFileName(rank)));
    contents.rng_by_rank[rank] = std::move(*bytes);
  }
  return contents;
}

absl::StatusOr<std::optional<CheckpointManager::Loaded>> CheckpointManager::LoadNewest() {
  std::vector<int64_t> candidates;
  ASSIGN_OR_RETURN(std::optional<int64_t> latest, LatestStep());
  if (latest) candidates.push_back(*latest);
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps());
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (!latest || *it != *latest) candidates.push_back(*it);
  }
  for (int64_t step : candidates) {
    absl::StatusOr<CheckpointContents> contents = Load(step);
    if (contents.ok()) return std::optional<Loaded>(Loaded{step, *std::move(contents)});
    if (!absl::IsDataLoss(contents.status())) return contents.status();
    if (options_.read_only) {
      SS_LOG_WARN("checkpoint: skipping step {}: {}", step, contents.status().ToString());
      continue;
    }
    // Set aside, not deleted: the bytes may still be worth a look.
    std::string aside = absl::StrCat(root(), "/", kCorruptPrefix, CheckpointDirName(step));
    for (int k = 1; fs::exists(aside); ++k) {
      aside = absl::StrCat(root(), "/", kCorruptPrefix, CheckpointDirName(step), "-", k);
    }
    absl::Status moved = Env::Or(options_.env).Rename(StepDir(step), aside);
    SS_LOG_WARN("checkpoint: step {} is unusable ({}); {}; trying the next newest", step,
                contents.status().ToString(),
                moved.ok() ? absl::StrCat("set aside as ", aside)
                           : absl::StrCat("could not set it aside: ", moved.ToString()));
  }
  return std::optional<Loaded>();
}

absl::StatusOr<CheckpointContents> CheckpointManager::LoadLatest() {
  ASSIGN_OR_RETURN(std::optional<Loaded> loaded, LoadNewest());
  if (!loaded.has_value()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint under ", root()));
  }
  return std::move(loaded->contents);
}

}  // namespace specstream::student
