#include "common/safetensors.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace specstream {
namespace {

using specstream::testing::TempDir;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

std::string Le64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// A file built by hand: length prefix, header exactly as given, data.
std::string RawFile(const std::string& header, const std::string& data) {
  return Le64(header.size()) + header + data;
}

std::string Bytes(const TensorView& view) {
  return std::string(reinterpret_cast<const char*>(view.data), view.nbytes);
}

std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 31 + seed * 7 + 1) & 0xff);
  return s;
}

// ---------------------------------------------------------------------------
// Round trips

TEST(SafetensorsTest, RoundTripsEveryDtypeWithMetadata) {
  struct Spec {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  const std::vector<Spec> specs = {
      {"f32", DType::kF32, {2, 3}},    {"f16", DType::kF16, {5}},
      {"bf16", DType::kBF16, {3, 1}},  {"i64", DType::kI64, {4}},
      {"i32", DType::kI32, {1, 1, 3}}, {"u8", DType::kU8, {7}},
      {"bool", DType::kBool, {3}},     {"scalar", DType::kF32, {}},
      {"empty", DType::kBF16, {0}},    {"empty2d", DType::kI64, {3, 0}},
  };
  SafetensorsWriter writer;
  std::vector<std::string> payloads;
  for (size_t i = 0; i < specs.size(); ++i) {
    int64_t elements = 1;
    for (int64_t d : specs[i].shape) elements *= d;
    payloads.push_back(Pattern(elements * DTypeSize(specs[i].dtype), static_cast<int>(i)));
    ASSERT_TRUE(writer
                    .Add(specs[i].name, specs[i].dtype, specs[i].shape, payloads[i].data(),
                         payloads[i].size())
                    .ok());
  }
  writer.SetMetadata("format", "pt");
  writer.SetMetadata("note", "caf\xc3\xa9 \"quoted\"\n");

  TempDir dir;
  const std::string path = dir.Join("all.safetensors");
  ASSERT_TRUE(writer.WriteFile(path).ok());
  auto serialized = writer.Serialize();
  ASSERT_TRUE(serialized.ok());
  EXPECT_EQ(specstream::testing::ReadFile(path), *serialized);

  auto opened = SafetensorsFile::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status();
  auto in_memory = SafetensorsFile::FromBytes(*serialized);
  ASSERT_TRUE(in_memory.ok()) << in_memory.status();
  for (const SafetensorsFile* file : {opened->get(), in_memory->get()}) {
    EXPECT_EQ(file->names().size(), specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      SCOPED_TRACE(specs[i].name);
      ASSERT_TRUE(file->Contains(specs[i].name));
      auto view = file->Get(specs[i].name);
      ASSERT_TRUE(view.ok()) << view.status();
      EXPECT_EQ(view->name, specs[i].name);
      EXPECT_EQ(view->dtype, specs[i].dtype);
      EXPECT_EQ(view->shape, specs[i].shape);
      EXPECT_EQ(Bytes(*view), payloads[i]);
      EXPECT_NE(view->data, nullptr);
    }
    EXPECT_EQ(file->metadata().size(), 2u);
    EXPECT_EQ(file->metadata().at("format"), "pt");
    EXPECT_EQ(file->metadata().at("note"), "caf\xc3\xa9 \"quoted\"\n");
  }
}

TEST(SafetensorsTest, EmptyFileRoundTrips) {
  SafetensorsWriter writer;
  auto bytes = writer.Serialize();
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, Le64(8) + "{}      ");
  auto file = SafetensorsFile::FromBytes(*bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file.value()->names().empty());
  EXPECT_TRUE(file.value()->metadata().empty());
}

TEST(SafetensorsTest, HeaderIsPaddedWithSpacesToMultipleOf8) {
  for (int name_len = 1; name_len <= 9; ++name_len) {
    SCOPED_TRACE(name_len);
    SafetensorsWriter writer;
    const uint8_t byte = 42;
    ASSERT_TRUE(writer.Add(std::string(name_len, 'x'), DType::kU8, {1}, &byte, 1).ok());
    auto bytes = writer.Serialize();
    ASSERT_TRUE(bytes.ok());
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>((*bytes)[i]);
    EXPECT_EQ(header_len % 8, 0u);
    EXPECT_EQ(bytes->size(), 8 + header_len + 1);
    const std::string header = bytes->substr(8, header_len);
    const size_t close = header.rfind('}');
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos);
    EXPECT_LT(header.size() - close - 1, 8u);
  }
}

TEST(SafetensorsTest, LayoutIsAlignedAndIndependentOfAddOrder) {
  const std::string u8 = Pattern(3, 1), f32 = Pattern(8, 2), i64 = Pattern(8, 3),
                    f16 = Pattern(2, 4);
  SafetensorsWriter a, b;
  ASSERT_TRUE(a.Add("small", DType::kU8, {3}, u8.data(), 3).ok());
  ASSERT_TRUE(a.Add("half", DType::kF16, {1}, f16.data(), 2).ok());
  ASSERT_TRUE(a.Add("float", DType::kF32, {2}, f32.data(), 8).ok());
  ASSERT_TRUE(a.Add("long", DType::kI64, {1}, i64.data(), 8).ok());
  ASSERT_TRUE(b.Add("long", DType::kI64, {1}, i64.data(), 8).ok());
  ASSERT_TRUE(b.Add("float", DType::kF32, {2}, f32.data(), 8).ok());
  ASSERT_TRUE(b.Add("small", DType::kU8, {3}, u8.data(), 3).ok());
  ASSERT_TRUE(b.Add("half", DType::kF16, {1}, f16.data(), 2).ok());
  auto bytes_a = a.Serialize();
  auto bytes_b = b.Serialize();
  ASSERT_TRUE(bytes_a.ok() && bytes_b.ok());
  EXPECT_EQ(*bytes_a, *bytes_b);
  auto file = SafetensorsFile::FromBytes(*bytes_a);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT(file.value()->names(), ElementsAre("long", "float", "half", "small"));
  for (const std::string& name : file.value()->names()) {
    auto view = file.value()->Get(name);
    ASSERT_TRUE(view.ok());
    const size_t offset = view->data - file.value()->bytes();
    EXPECT_EQ(offset % DTypeSize(view->dtype), 0u) << name;
  }
}

TEST(SafetensorsTest, OpenIsZeroCopyIntoTheMapping) {
  TempDir dir;
  const std::string path = dir.Join("w.safetensors");
  const std::string payload = Pattern(4096, 9);
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.Add("w", DType::kF32, {1024}, payload.data(), payload.size()).ok());
  ASSERT_TRUE(writer.WriteFile(path).ok());

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsFile& f = **file;
  EXPECT_EQ(f.size(), std::filesystem::file_size(path));
  auto first = f.Get("w");
  auto second = f.Get("w");
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->data, second->data);
  EXPECT_GE(first->data, f.bytes() + f.data_start());
  EXPECT_LE(first->data + first->nbytes, f.bytes() + f.size());
  EXPECT_EQ(Bytes(*first), payload);
  // Page-aligned mapping + 8-aligned header => 4-aligned floats.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first->data) % 4, 0u);
}

// The exact bytes huggingface/safetensors' save_file writes for
// {"a": tensor([1.0, 2.0])} (no metadata), and for
// {"b": tensor([7], dtype=int64), "a": tensor([1.0, -2.0], dtype=float16)}
// with metadata {"format": "pt"}: compact JSON, "__metadata__" first, tensors
// by dtype alignment then name, header padded with spaces to 8.
TEST(SafetensorsTest, ReadsAndWritesReferenceBytesExactly) {
  const std::string ref1 = std::string("\x38\x00\x00\x00\x00\x00\x00\x00", 8) +
                           "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}  " +
                           std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);
  auto file = SafetensorsFile::FromBytes(ref1);
  ASSERT_TRUE(file.ok()) << file.status();
  auto a = file.value()->Get("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_THAT(a->shape, ElementsAre(2));
  float values[2];
  ASSERT_EQ(a->nbytes, sizeof(values));
  std::memcpy(values, a->data, sizeof(values));
  EXPECT_EQ(values[0], 1.0f);
  EXPECT_EQ(values[1], 2.0f);

  SafetensorsWriter writer;
  const float floats[2] = {1.0f, 2.0f};
  ASSERT_TRUE(writer.Add("a", DType::kF32, {2}, floats, sizeof(floats)).ok());
  auto written = writer.Serialize();
  ASSERT_TRUE(written.ok());
  EXPECT_EQ(*written, ref1);

  const std::string ref2 = std::string("\x90\x00\x00\x00\x00\x00\x00\x00", 8) +
                           "{\"__metadata__\":{\"format\":\"pt\"},"
                           "\"b\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
                           "\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[8,12]}}     " +
                           std::string("\x07\x00\x00\x00\x00\x00\x00\x00", 8) +
                           std::string("\x00\x3c\x00\xc0", 4);
  auto file2 = SafetensorsFile::FromBytes(ref2);
  ASSERT_TRUE(file2.ok()) << file2.status();
  EXPECT_THAT(file2.value()->names(), ElementsAre("b", "a"));
  EXPECT_EQ(file2.value()->metadata().at("format"), "pt");
  auto b = file2.value()->Get("b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(Bytes(*b), std::string("\x07\x00\x00\x00\x00\x00\x00\x00", 8));

  SafetensorsWriter writer2;
  const int64_t seven = 7;
  const uint16_t halves[2] = {0x3c00, 0xc000};
  ASSERT_TRUE(writer2.Add("a", DType::kF16, {2}, halves, sizeof(halves)).ok());
  ASSERT_TRUE(writer2.Add("b", DType::kI64, {1}, &seven, sizeof(seven)).ok());
  writer2.SetMetadata("format", "pt");
  auto written2 = writer2.Serialize();
  ASSERT_TRUE(written2.ok());
  EXPECT_EQ(*written2, ref2);
}

TEST(SafetensorsTest, AcceptsUnpaddedHeaderAndNullMetadata) {
  // Readers must accept any N; the data region starts at 8 + N.
  auto file = SafetensorsFile::FromBytes(RawFile(
      R"({"__metadata__":null,"x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})", "abc"));
  ASSERT_TRUE(file.ok()) << file.status();
  auto x = file.value()->Get("x");
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(Bytes(*x), "abc");
  EXPECT_TRUE(file.value()->metadata().empty());
}

TEST(SafetensorsTest, GetUnknownNameIsNotFoundNamingTensorAndFile) {
  auto file = SafetensorsFile::FromBytes(
      RawFile(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "a"), "mem.safetensors");
  ASSERT_TRUE(file.ok());
  EXPECT_FALSE(file.value()->Contains("y"));
  auto y = file.value()->Get("y");
  EXPECT_EQ(y.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(y.status().message(), AllOf(HasSubstr("\"y\""), HasSubstr("mem.safetensors")));
}

// ---------------------------------------------------------------------------
// Rejections

struct BadFile {
  std::string label;
  std::string bytes;
  absl::StatusCode code;
  std::vector<std::string> must_mention;
};

std::string Entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":" + offsets + "}";
}

std::vector<BadFile> BadFiles() {
  using C = absl::StatusCode;
  const std::string ok_w = Entry("w", "F32", "[2]", "[0,8]");
  return {
      {"short", "\x01\x00\x00", C::kDataLoss, {"shorter than"}},
      {"header_over_limit", Le64(100'000'001) + "{}", C::kDataLoss, {"100000001", "limit"}},
      {"header_past_end", Le64(64) + "{}", C::kDataLoss, {"64", "past the end"}},
      {"not_json", RawFile("{\"w\":", ""), C::kInvalidArgument, {"invalid JSON"}},
      {"trailing_garbage", RawFile("{} x", ""), C::kInvalidArgument, {"invalid JSON"}},
      {"not_object", RawFile("[1,2]", ""), C::kInvalidArgument, {"not an object"}},
      {"invalid_utf8", RawFile("{\"w\xff\":{}}", ""), C::kInvalidArgument, {"invalid JSON"}},
      {"duplicate_name",
       RawFile("{" + ok_w + "," + Entry("w", "F32", "[2]", "[8,16]") + "}", std::string(16, '\0')),
       C::kInvalidArgument,
       {"duplicate key \"w\""}},
      {"duplicate_field",
       RawFile(R"({"w":{"dtype":"F32","dtype":"U8","shape":[2],"data_offsets":[0,8]}})",
               std::string(8, '\0')),
       C::kInvalidArgument,
       {"duplicate key \"dtype\""}},
      {"entry_not_object",
       RawFile(R"({"w":[1]})", ""),
       C::kInvalidArgument,
       {"\"w\"", "must be an object"}},
      {"missing_dtype",
       RawFile(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0')),
       C::kInvalidArgument,
       {"\"w\"", "missing dtype"}},
      {"dtype_not_string",
       RawFile(R"({"w":{"dtype":5,"shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0')),
       C::kInvalidArgument,
       {"\"w\"", "dtype must be a string"}},
      {"unknown_dtype",
       RawFile("{" + Entry("w", "F64", "[1]", "[0,8]") + "}", std::string(8, '\0')),
       C::kInvalidArgument,
       {"\"w\"", "unknown dtype \"F64\""}},
      {"missing_shape",
       RawFile(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", std::string(8, '\0')),
       C::kInvalidArgument,
       {"\"w\"", "missing shape"}},
      {"shape_not_array",
       RawFile(R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", std::string(8, '\0')),
       C::kInvalidArgument,
       {"\"w\"", "shape must be an array"}},
      {"shape_float",
       RawFile("{" + Entry("w", "F32", "[2.0]", "[0,8]") + "}", std::string(8, '\0')),
       C::kInvalidArgument,
       {"\"w\"", "non-negative integer"}},
      {"negative_dim",
       RawFile("{" + Entry("w", "F32", "[-2]", "[0,8]") + "}", std::string(8, '\0')),
       C::kInvalidArgument,
       {"\"w\"", "negative"}},
      {"missing_offsets",
       RawFile(R"({"w":{"dtype":"F32","shape":[2]}})", std::string(8, '\0')),
       C::kInvalidArgument,
       {"\"w\"", "missing data_offsets"}},
      {"offsets_wrong_arity",
       RawFile("{" + Entry("w", "F32", "[2]", "[0]") + "}", std::string(8, '\0')),
       C::kInvalidArgument,
       {"\"w\"", "data_offsets must be an array [begin, end]"}},
      {"offsets_not_int",
       RawFile("{" + Entry("w", "F32", "[2]", "[0,\"8\"]") + "}", std::string(8, '\0')),
       C::kInvalidArgument,
       {"\"w\"", "data_offsets end must be a non-negative integer"}},
      {"offsets_negative",
       RawFile("{" + Entry("w", "F32", "[2]", "[-8,0]") + "}", ""),
       C::kInvalidArgument,
       {"\"w\"", "data_offsets begin is negative"}},
      {"unknown_field",
       RawFile(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})",
               std::string(8, '\0')),
       C::kInvalidArgument,
       {"\"w\"", "unknown field \"extra\""}},
      {"begin_after_end",
       RawFile("{" + Entry("w", "F32", "[0]", "[8,0]") + "}", std::string(8, '\0')),
       C::kDataLoss,
       {"\"w\"", "begin after end"}},
      {"out_of_region",
       RawFile("{" + Entry("w", "F32", "[2]", "[0,8]") + "}", std::string(4, '\0')),
       C::kDataLoss,
       {"\"w\"", "out of the data region"}},
      {"byte_count_mismatch",
       RawFile("{" + Entry("w", "F32", "[3]", "[0,8]") + "}", std::string(8, '\0')),
       C::kDataLoss,
       {"\"w\"", "byte count mismatch", "needs 12"}},
      {"overlap",
       RawFile("{" + ok_w + "," + Entry("v", "F32", "[2]", "[4,12]") + "}", std::string(12, '\0')),
       C::kDataLoss,
       {"\"v\"", "overlap", "\"w\""}},
      {"gap_at_start",
       RawFile("{" + Entry("w", "F32", "[2]", "[4,12]") + "}", std::string(12, '\0')),
       C::kDataLoss,
       {"\"w\"", "gap of 4 unused bytes"}},
      {"gap_between",
       RawFile("{" + ok_w + "," + Entry("v", "U8", "[1]", "[9,10]") + "}", std::string(10, '\0')),
       C::kDataLoss,
       {"\"v\"", "gap of 1 unused bytes", "\"w\""}},
      {"unused_tail",
       RawFile("{" + ok_w + "}", std::string(11, '\0')),
       C::kDataLoss,
       {"3 unused bytes at the end", "\"w\""}},
      {"metadata_not_string",
       RawFile(R"({"__metadata__":{"step":3},)" + ok_w + "}", std::string(8, '\0')),
       C::kInvalidArgument,
       {"__metadata__", "\"step\"", "must be a string"}},
      {"metadata_not_object",
       RawFile(R"({"__metadata__":[],)" + ok_w + "}", std::string(8, '\0')),
       C::kInvalidArgument,
       {"__metadata__", "must be an object"}},
      {"too_deep",
       RawFile("{\"w\":" + std::string(40, '[') + std::string(40, ']') + "}", ""),
       C::kInvalidArgument,
       {"nests deeper"}},
  };
}

// gtest prints the label instead of the struct's bytes.
void PrintTo(const BadFile& bad, std::ostream* os) { *os << bad.label; }

class SafetensorsRejectTest : public ::testing::TestWithParam<BadFile> {};

TEST_P(SafetensorsRejectTest, RefusesWithNameAndReason) {
  const BadFile& bad = GetParam();
  auto file = SafetensorsFile::FromBytes(bad.bytes, "bad.safetensors");
  ASSERT_FALSE(file.ok()) << bad.label << " was accepted";
  EXPECT_EQ(file.status().code(), bad.code) << file.status();
  EXPECT_THAT(file.status().message(), HasSubstr("bad.safetensors"));
  for (const std::string& piece : bad.must_mention) {
    EXPECT_THAT(file.status().message(), HasSubstr(piece));
  }
}

INSTANTIATE_TEST_SUITE_P(All, SafetensorsRejectTest, ::testing::ValuesIn(BadFiles()),
                         [](const ::testing::TestParamInfo<BadFile>& info) {
                           return info.param.label;
                         });

TEST(SafetensorsTest, OpenRefusesShortAndMissingFilesNamingThePath) {
  TempDir dir;
  const std::string short_path = dir.Join("short.safetensors");
  specstream::testing::WriteFile(short_path, "abc");
  auto short_file = SafetensorsFile::Open(short_path);
  EXPECT_EQ(short_file.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(short_file.status().message(), AllOf(HasSubstr(short_path), HasSubstr("shorter")));

  auto missing = SafetensorsFile::Open(dir.Join("missing.safetensors"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("missing.safetensors"));

  auto directory = SafetensorsFile::Open(dir.path());
  EXPECT_FALSE(directory.ok());
}

TEST(SafetensorsTest, EveryTruncationOfAValidFileIsRefused) {
  SafetensorsWriter writer;
  const std::string payload = Pattern(24, 5);
  ASSERT_TRUE(writer.Add("a", DType::kI32, {2, 3}, payload.data(), payload.size()).ok());
  auto bytes = writer.Serialize();
  ASSERT_TRUE(bytes.ok());
  for (size_t n = 0; n < bytes->size(); ++n) {
    EXPECT_FALSE(SafetensorsFile::FromBytes(bytes->substr(0, n)).ok()) << "prefix of " << n;
  }
  EXPECT_FALSE(SafetensorsFile::FromBytes(*bytes + "x").ok());
}

// ---------------------------------------------------------------------------
// Writer

TEST(SafetensorsWriterTest, RefusesBadTensors) {
  SafetensorsWriter writer;
  const std::string data(16, '\0');
  ASSERT_TRUE(writer.Add("w", DType::kF32, {4}, data.data(), 16).ok());

  absl::Status dup = writer.Add("w", DType::kF32, {4}, data.data(), 16);
  EXPECT_EQ(dup.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dup.message(), AllOf(HasSubstr("\"w\""), HasSubstr("duplicate")));

  absl::Status mismatch = writer.Add("v", DType::kBF16, {4}, data.data(), 16);
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatch.message(),
              AllOf(HasSubstr("\"v\""), HasSubstr("byte count mismatch"), HasSubstr("needs 8")));

  absl::Status negative = writer.Add("n", DType::kU8, {-1}, data.data(), 0);
  EXPECT_THAT(negative.message(), AllOf(HasSubstr("\"n\""), HasSubstr("negative")));

  absl::Status reserved = writer.Add("__metadata__", DType::kU8, {1}, data.data(), 1);
  EXPECT_THAT(reserved.message(), HasSubstr("reserved"));

  absl::Status utf8 = writer.Add("bad\xff", DType::kU8, {1}, data.data(), 1);
  EXPECT_THAT(utf8.message(), HasSubstr("UTF-8"));

  // None of the refused tensors made it in.
  auto bytes = writer.Serialize();
  ASSERT_TRUE(bytes.ok());
  auto file = SafetensorsFile::FromBytes(*bytes);
  ASSERT_TRUE(file.ok());
  EXPECT_THAT(file.value()->names(), ElementsAre("w"));
}

TEST(SafetensorsWriterTest, WriteFileReplacesAtomicallyAndLeavesNothingOnFailure) {
  TempDir dir;
  const std::string path = dir.Join("w.safetensors");
  specstream::testing::WriteFile(path, "old contents");
  SafetensorsWriter writer;
  const uint8_t byte = 1;
  ASSERT_TRUE(writer.Add("b", DType::kBool, {1}, &byte, 1).ok());
  ASSERT_TRUE(writer.WriteFile(path).ok());
  EXPECT_EQ(specstream::testing::ReadFile(path), *writer.Serialize());

  // The target is a directory: rename fails after the data was written.
  const std::string blocked = dir.Join("blocked");
  std::filesystem::create_directory(blocked);
  specstream::testing::WriteFile(blocked + "/keep", "x");
  absl::Status status = writer.WriteFile(blocked);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr(blocked));

  // The directory does not exist: nothing can be created.
  const std::string nowhere = dir.Join("no/such/dir/w.safetensors");
  EXPECT_FALSE(writer.WriteFile(nowhere).ok());
  EXPECT_FALSE(specstream::testing::FileExists(nowhere));

  std::vector<std::string> entries;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    entries.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(entries, UnorderedElementsAre("w.safetensors", "blocked"));
}

// ---------------------------------------------------------------------------
// Checkpoint directories

void WriteShard(const std::string& path, const std::vector<std::string>& names) {
  SafetensorsWriter writer;
  for (const std::string& name : names) {
    const std::string data = Pattern(8, static_cast<int>(name.size()));
    ASSERT_TRUE(writer.Add(name, DType::kF32, {2}, data.data(), data.size()).ok());
  }
  ASSERT_TRUE(writer.WriteFile(path).ok());
}

TEST(CheckpointTensorsTest, OpensSingleFile) {
  TempDir dir;
  WriteShard(dir.Join("model.safetensors"), {"b", "a"});
  auto ckpt = CheckpointTensors::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_THAT(ckpt.value()->names(), ElementsAre("a", "b"));
  EXPECT_EQ(ckpt.value()->shard_paths().size(), 1u);
  auto a = ckpt.value()->Get("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(Bytes(*a), Pattern(8, 1));
}

TEST(CheckpointTensorsTest, OpensShardedIndexOncePerShard) {
  TempDir dir;
  WriteShard(dir.Join("model-00001-of-00002.safetensors"), {"embed", "layer0"});
  WriteShard(dir.Join("model-00002-of-00002.safetensors"), {"layer1", "lm_head", "unlisted"});
  specstream::testing::WriteFile(dir.Join("model.safetensors.index.json"), R"({
    "metadata": {"total_size": 40},
    "weight_map": {
      "embed": "model-00001-of-00002.safetensors",
      "layer0": "model-00001-of-00002.safetensors",
      "layer1": "model-00002-of-00002.safetensors",
      "lm_head": "model-00002-of-00002.safetensors"
    }
  })");
  auto ckpt = CheckpointTensors::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_THAT(ckpt.value()->names(), ElementsAre("embed", "layer0", "layer1", "lm_head"));
  EXPECT_EQ(ckpt.value()->shard_paths().size(), 2u);
  auto head = ckpt.value()->Get("lm_head");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(Bytes(*head), Pattern(8, 7));
  auto again = ckpt.value()->Get("lm_head");
  EXPECT_EQ(head->data, again->data);
  EXPECT_TRUE(ckpt.value()->Contains("layer0"));
  EXPECT_FALSE(ckpt.value()->Contains("unlisted"));
  auto missing = ckpt.value()->Get("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("\"nope\""));
}

TEST(CheckpointTensorsTest, RefusesTensorMissingFromItsShard) {
  TempDir dir;
  WriteShard(dir.Join("s1.safetensors"), {"a"});
  WriteShard(dir.Join("s2.safetensors"), {"b"});
  specstream::testing::WriteFile(
      dir.Join("model.safetensors.index.json"),
      R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})");
  auto ckpt = CheckpointTensors::Open(dir.path());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_THAT(ckpt.status().message(),
              AllOf(HasSubstr("\"b\""), HasSubstr("s1.safetensors"), HasSubstr("missing")));
}

TEST(CheckpointTensorsTest, RefusesShardPathsEscapingTheDirectory) {
  for (const std::string& shard :
       {std::string("../outside.safetensors"), std::string("sub/../../outside.safetensors"),
        std::string("/etc/passwd"), std::string("")}) {
    SCOPED_TRACE(shard);
    TempDir dir;
    specstream::testing::WriteFile(dir.Join("model.safetensors.index.json"),
                                   R"({"weight_map": {"w": ")" + shard + R"("}})");
    auto ckpt = CheckpointTensors::Open(dir.path());
    ASSERT_FALSE(ckpt.ok());
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(ckpt.status().message(), AllOf(HasSubstr("\"w\""), HasSubstr("escapes")));
  }
}

TEST(CheckpointTensorsTest, RefusesBadIndexAndEmptyDirectory) {
  TempDir dir;
  auto empty = CheckpointTensors::Open(dir.path());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kNotFound);

  specstream::testing::WriteFile(dir.Join("model.safetensors.index.json"),
                                 R"({"weight_map": {"w": "a.safetensors", "w": "b.safetensors"}})");
  auto dup = CheckpointTensors::Open(dir.path());
  EXPECT_THAT(dup.status().message(), HasSubstr("duplicate key \"w\""));

  specstream::testing::WriteFile(dir.Join("model.safetensors.index.json"), R"({"metadata": {}})");
  auto no_map = CheckpointTensors::Open(dir.path());
  EXPECT_THAT(no_map.status().message(), HasSubstr("missing weight_map"));

  specstream::testing::WriteFile(dir.Join("model.safetensors.index.json"),
                                 R"({"weight_map": {"w": "gone.safetensors"}})");
  auto gone = CheckpointTensors::Open(dir.path());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gone.status().message(), HasSubstr("gone.safetensors"));
}

}  // namespace
}  // namespace specstream
