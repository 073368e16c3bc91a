// A rank's ledger of trained samples (online training, data.ledger_dir):
// one JSON line per optimizer step, {"step": s, "rank": r, "sample_ids":
// [...]}, appended and flushed when the step has completed. Over a run the
// ledgers of all ranks list every trained sample exactly once per epoch,
// whatever teachers failed on the way. LibTorch-free.
//
// Thread-safety: one thread at a time per ledger.
#ifndef SPECSTREAM_STUDENT_LEDGER_H_
#define SPECSTREAM_STUDENT_LEDGER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/jsonl.h"

namespace specstream::student {

struct LedgerEntry {
  int64_t step = 0;
  int rank = 0;
  std::vector<int64_t> sample_ids;
};

class Ledger final {
 public:
  // `path` is appended to (created when missing). PermissionDenied naming
  // it when it cannot be.
  static absl::StatusOr<std::unique_ptr<Ledger>> Open(const std::string& path, int rank);
  // Step `step` trained these samples. DataLoss naming the file when the
  // line cannot be written.
  absl::Status Record(int64_t step, const std::vector<int64_t>& sample_ids);

 private:
  Ledger(std::unique_ptr<JsonlWriter> out, int rank) : out_(std::move(out)), rank_(rank) {}
  std::unique_ptr<JsonlWriter> out_;
  int rank_;
};

// The file name of rank `rank`'s ledger in data.ledger_dir.
std::string LedgerPath(const std::string& dir, int rank);

// Every entry of a ledger file, in order; errors name the file and line.
absl::StatusOr<std::vector<LedgerEntry>> ReadLedger(const std::string& path);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_LEDGER_H_
