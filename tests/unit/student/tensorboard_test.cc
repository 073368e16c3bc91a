#include "student/tensorboard.h"

#include <cstring>
#include <filesystem>

#include "common/crc32c.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace specstream::student {
namespace {

TEST(TensorBoardTest, Crc32cKnownVector) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);  // the CRC-32C check value
  EXPECT_EQ(Crc32c(""), 0u);
}

// Minimal protobuf reader for the test: field -> raw bytes / varint / fixed.
struct Field {
  int number;
  int wire;
  uint64_t varint = 0;
  std::string bytes;
};
std::vector<Field> Parse(const std::string& data) {
  std::vector<Field> fields;
  size_t i = 0;
  auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      unsigned char b = data[i++];
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
  };
  while (i < data.size()) {
    uint64_t key = varint();
    Field f{static_cast<int>(key >> 3), static_cast<int>(key & 7)};
    if (f.wire == 0) f.varint = varint();
    if (f.wire == 1) {
      f.bytes = data.substr(i, 8);
      i += 8;
    }
    if (f.wire == 5) {
      f.bytes = data.substr(i, 4);
      i += 4;
    }
    if (f.wire == 2) {
      size_t n = varint();
      f.bytes = data.substr(i, n);
      i += n;
    }
    fields.push_back(f);
  }
  return fields;
}

TEST(TensorBoardTest, WritesValidRecordsWithScalars) {
  specstream::testing::TempDir dir;
  {
    auto writer = TensorBoardWriter::Create(dir.Join("tb"));
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->WriteScalars(7, {{"train/loss", 2.5}, {"train/acc_0", 0.25}}).ok());
  }
  std::string file;
  for (const auto& e : std::filesystem::directory_iterator(dir.Join("tb"))) {
    file = e.path().string();
  }
  ASSERT_NE(file.find("events.out.tfevents."), std::string::npos);
  std::string bytes = specstream::testing::ReadFile(file);
  std::vector<std::string> records;
  size_t pos = 0;
  while (pos < bytes.size()) {
    uint64_t length;
    std::memcpy(&length, bytes.data() + pos, 8);
    uint32_t length_crc, data_crc;
    std::memcpy(&length_crc, bytes.data() + pos + 8, 4);
    EXPECT_EQ(length_crc, MaskCrc(Crc32c(bytes.substr(pos, 8))));
    std::string data = bytes.substr(pos + 12, length);
    std::memcpy(&data_crc, bytes.data() + pos + 12 + length, 4);
    EXPECT_EQ(data_crc, MaskCrc(Crc32c(data)));
    records.push_back(data);
    pos += 16 + length;
  }
  ASSERT_EQ(records.size(), 2u);
  auto version = Parse(records[0]);
  EXPECT_EQ(version[1].number, 3);
  EXPECT_EQ(version[1].bytes, "brain.Event:2");
  auto event = Parse(records[1]);
  ASSERT_EQ(event.size(), 3u);
  EXPECT_EQ(event[1].number, 2);
  EXPECT_EQ(event[1].varint, 7u);
  auto values = Parse(event[2].bytes);
  ASSERT_EQ(values.size(), 2u);
  auto loss = Parse(values[0].bytes);
  EXPECT_EQ(loss[0].bytes, "train/loss");
  float value;
  std::memcpy(&value, loss[1].bytes.data(), 4);
  EXPECT_FLOAT_EQ(value, 2.5f);
}

}  // namespace
}  // namespace specstream::student
