// TensorBoard event files (tfevents), written without TensorFlow: each record
// is [u64 length][u32 masked crc32c(length)][Event proto][u32 masked
// crc32c(data)], and an Event carries wall_time, step and a Summary of
// scalar values, hand-encoded in protobuf wire format (tensorboard's
// event.proto / summary.proto field numbers).
//
// Not thread-safe: one writer per file, owned by rank 0's trainer.
#ifndef SPECSTREAM_STUDENT_TENSORBOARD_H_
#define SPECSTREAM_STUDENT_TENSORBOARD_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specstream::student {

class TensorBoardWriter final {
 public:
  // Creates `dir` and events.out.tfevents.<seconds>.<host> inside it.
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Create(const std::string& dir);
  ~TensorBoardWriter();

  // One event with all `scalars` (tag, value) at `step`; flushed.
  absl::Status WriteScalars(int64_t step,
                            const std::vector<std::pair<std::string, double>>& scalars);
  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  absl::Status WriteRecord(const std::string& data);
  std::string path_;
  std::FILE* file_;
};

// TFRecord's masking of a CRC-32C (common/crc32c.h).
uint32_t MaskCrc(uint32_t crc);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_TENSORBOARD_H_
