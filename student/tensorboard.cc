#include "student/tensorboard.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/coding.h"
#include "common/crc32c.h"

namespace specstream::student {
namespace {

// Protobuf wire format: just the pieces an Event needs.
void PutTag(std::string& out, int field, int wire_type) {
  PutVarint64(out, (static_cast<uint64_t>(field) << 3) | wire_type);
}
void PutBytes(std::string& out, int field, absl::string_view bytes) {
  PutTag(out, field, 2);
  PutVarint64(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}
void PutDouble(std::string& out, int field, double v) {
  PutTag(out, field, 1);
  char raw[8];
  std::memcpy(raw, &v, 8);  // little-endian hosts only (x86-64, aarch64)
  out.append(raw, 8);
}
void PutFloat(std::string& out, int field, float v) {
  PutTag(out, field, 5);
  char raw[4];
  std::memcpy(raw, &v, 4);
  out.append(raw, 4);
}

double WallTime() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t MaskCrc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Create(
    const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  std::string path =
      absl::StrCat(dir, "/events.out.tfevents.", static_cast<int64_t>(WallTime()), ".", host);
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return absl::InternalError(absl::StrCat("cannot open ", path));
  std::unique_ptr<TensorBoardWriter> writer(new TensorBoardWriter(path, file));
  std::string event;
  PutDouble(event, 1, WallTime());      // Event.wall_time
  PutBytes(event, 3, "brain.Event:2");  // Event.file_version
  if (absl::Status s = writer->WriteRecord(event); !s.ok()) return s;
  return writer;
}

TensorBoardWriter::~TensorBoardWriter() { std::fclose(file_); }

absl::Status TensorBoardWriter::WriteRecord(const std::string& data) {
  std::string record;
  uint64_t length = data.size();
  char raw[8];
  std::memcpy(raw, &length, 8);
  record.append(raw, 8);
  uint32_t length_crc = MaskCrc(Crc32c(absl::string_view(raw, 8)));
  record.append(reinterpret_cast<const char*>(&length_crc), 4);
  record += data;
  uint32_t data_crc = MaskCrc(Crc32c(data));
  record.append(reinterpret_cast<const char*>(&data_crc), 4);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fflush(file_) != 0) {
    return absl::InternalError(absl::StrCat("cannot write ", path_));
  }
  return absl::OkStatus();
}

absl::Status TensorBoardWriter::WriteScalars(
    int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    PutBytes(v, 1, tag);                        // Summary.Value.tag
    PutFloat(v, 2, static_cast<float>(value));  // Summary.Value.simple_value
    PutBytes(summary, 1, v);                    // Summary.value
  }
  std::string event;
  PutDouble(event, 1, WallTime());  // Event.wall_time
  PutTag(event, 2, 0);              // Event.step
  PutVarint64(event, static_cast<uint64_t>(step));
  PutBytes(event, 5, summary);  // Event.summary
  return WriteRecord(event);
}

}  // namespace specstream::student
