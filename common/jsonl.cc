#include "common/jsonl.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace specstream {

absl::Status ForEachJsonLine(
    const std::string& path,
    const std::function<absl::Status(int64_t, const nlohmann::json&)>& fn) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string line;
  int64_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    nlohmann::json value = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_number, ": line is not valid JSON"));
    }
    absl::Status status = fn(line_number, value);
    if (!status.ok()) return Annotate(status, absl::StrCat(path, ":", line_number));
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return absl::OkStatus();
}

absl::Status ReadIntArray(const nlohmann::json& value, const char* field, int64_t min, int64_t max,
                          std::vector<int64_t>* out) {
  auto it = value.find(field);
  if (it == value.end()) return absl::InvalidArgumentError(absl::StrCat("missing \"", field, "\""));
  if (!it->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", field, "\" must be an array of integers"));
  }
  out->clear();
  out->reserve(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& element = (*it)[i];
    if (!element.is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat("\"", field, "\"[", i, "] is not an integer"));
    }
    int64_t v = element.get<int64_t>();
    if (element.is_number_unsigned() &&
        element.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      v = INT64_MAX;
    }
    if (v < min || v > max) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", field, "\"[", i, "] = ", v, " is outside [", min, ", ", max, "]"));
    }
    out->push_back(v);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<JsonlWriter>> JsonlWriter::Open(const std::string& path) {
  std::unique_ptr<JsonlWriter> writer(new JsonlWriter(path));
  writer->out_.open(path, std::ios::app | std::ios::binary);
  if (!writer->out_) return absl::PermissionDeniedError(absl::StrCat("cannot append to ", path));
  return writer;
}

absl::Status JsonlWriter::Append(const nlohmann::json& value) {
  out_ << value.dump() << "\n";
  out_.flush();
  if (!out_) return absl::DataLossError(absl::StrCat(path_, ": write failed"));
  return absl::OkStatus();
}

}  // namespace specstream
