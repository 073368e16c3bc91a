#include "student/ledger.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace specstream::student {

absl::StatusOr<std::unique_ptr<Ledger>> Ledger::Open(const std::string& path, int rank) {
  absl::StatusOr<std::unique_ptr<JsonlWriter>> out = JsonlWriter::Open(path);
  if (!out.ok()) return Annotate(out.status(), "ledger");
  return std::unique_ptr<Ledger>(new Ledger(*std::move(out), rank));
}

absl::Status Ledger::Record(int64_t step, const std::vector<int64_t>& sample_ids) {
  return Annotate(out_->Append({{"step", step}, {"rank", rank_}, {"sample_ids", sample_ids}}),
                  "ledger");
}

std::string LedgerPath(const std::string& dir, int rank) {
  return absl::StrCat(dir, "/ledger-rank", rank, ".jsonl");
}

absl::StatusOr<std::vector<LedgerEntry>> ReadLedger(const std::string& path) {
  std::vector<LedgerEntry> entries;
  RETURN_IF_ERROR(ForEachJsonLine(path, [&](int64_t, const nlohmann::json& line) {
    if (!line.is_object() || !line.contains("step") || !line["step"].is_number_integer() ||
        !line.contains("rank") || !line["rank"].is_number_integer()) {
      return absl::InvalidArgumentError("a ledger line needs integer \"step\" and \"rank\"");
    }
    LedgerEntry entry;
    entry.step = line["step"].get<int64_t>();
    entry.rank = line["rank"].get<int>();
    RETURN_IF_ERROR(ReadIntArray(line, "sample_ids", 0, std::numeric_limits<int64_t>::max(),
                                 &entry.sample_ids));
    entries.push_back(std::move(entry));
    return absl::OkStatus();
  }));
  return entries;
}

}  // namespace specstream::student
