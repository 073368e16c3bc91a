// GGUF reading and exact dequantisation (common/gguf.h), on files the test
// builds block by block with hand-computed values.
#include "common/gguf.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace specstream {
namespace {

std::string Bytes(std::initializer_list<uint8_t> b) { return std::string(b.begin(), b.end()); }

std::string Half(float f) {
  const uint16_t h = FloatToHalf(f);
  return std::string(reinterpret_cast<const char*>(&h), 2);
}

TEST(GgufTest, HalfConversionIsExactAndRoundTrips) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // the smallest subnormal
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // a tie rounds to even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), h) << h;
  }
}

// One block of each quantised type, the values written out by hand.
TEST(GgufTest, DequantisesEachTypeExactly) {
  std::vector<GgufWriteTensor> tensors;
  // F32 and F16 / BF16 widen exactly.
  const float f32[2] = {1.5f, -0.1f};
  tensors.push_back({"f32", {2}, 0, std::string(reinterpret_cast<const char*>(f32), 8)});
  tensors.push_back({"f16", {2}, 1, Half(0.333251953125f) + Half(-65504.0f)});
  tensors.push_back({"bf16", {2}, 30, Bytes({0x80, 0x3f, 0x49, 0xc0})});  // 1.0, -3.140625
  // Q8_0: d = 0.5, q = -128, -1, 0, 1, 127, then 2 ... (27 more).
  std::string q8 = Half(0.5f) + Bytes({0x80, 0xff, 0x00, 0x01, 0x7f});
  for (int j = 5; j < 32; ++j) q8.push_back(2);
  tensors.push_back({"q8_0", {32}, 8, q8});
  // Q4_0: d = 0.25; byte j holds element j (low nibble) and j + 16 (high).
  std::string q4_0 = Half(0.25f) + Bytes({0xf0, 0x18});
  for (int j = 2; j < 16; ++j) q4_0.push_back(static_cast<char>(0x88));
  tensors.push_back({"q4_0", {32}, 2, q4_0});
  // Q4_1: d = 0.5, m = -1.
  std::string q4_1 = Half(0.5f) + Half(-1.0f) + Bytes({0x3a, 0x0f});
  for (int j = 2; j < 16; ++j) q4_1.push_back(0x00);
  tensors.push_back({"q4_1", {32}, 3, q4_1});
  absl::StatusOr<std::string> bytes = SerializeGguf({{"general.architecture", "llama"}}, tensors);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::FromBytes(*bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  auto values = [&](const char* name) {
    const GgufTensorInfo* t = (*file)->Find(name);
    EXPECT_NE(t, nullptr) << name;
    absl::StatusOr<std::vector<float>> v = (*file)->Dequantize(*t);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : std::vector<float>();
  };
  EXPECT_EQ(values("f32"), (std::vector<float>{1.5f, -0.1f}));
  EXPECT_EQ(values("f16"), (std::vector<float>{0.333251953125f, -65504.0f}));
  EXPECT_EQ(values("bf16"), (std::vector<float>{1.0f, -3.140625f}));
  const std::vector<float> q8_values = values("q8_0");
  ASSERT_EQ(q8_values.size(), 32u);
  EXPECT_EQ(std::vector<float>(q8_values.begin(), q8_values.begin() + 6),
            (std::vector<float>{-64.0f, -0.5f, 0.0f, 0.5f, 63.5f, 1.0f}));
  const std::vector<float> q4_0_values = values("q4_0");
  ASSERT_EQ(q4_0_values.size(), 32u);
  // 0xf0: element 0 = 0.25·(0 − 8), element 16 = 0.25·(15 − 8);
  // 0x18: element 1 = 0.25·(8 − 8), element 17 = 0.25·(1 − 8).
  EXPECT_EQ(q4_0_values[0], -2.0f);
  EXPECT_EQ(q4_0_values[16], 1.75f);
  EXPECT_EQ(q4_0_values[1], 0.0f);
  EXPECT_EQ(q4_0_values[17], -1.75f);
  EXPECT_EQ(q4_0_values[2], 0.0f);
  const std::vector<float> q4_1_values = values("q4_1");
  ASSERT_EQ(q4_1_values.size(), 32u);
  // 0x3a: element 0 = 0.5·10 − 1, element 16 = 0.5·3 − 1; 0x0f: 6.5, −1.
  EXPECT_EQ(q4_1_values[0], 4.0f);
  EXPECT_EQ(q4_1_values[16], 0.5f);
  EXPECT_EQ(q4_1_values[1], 6.5f);
  EXPECT_EQ(q4_1_values[17], -1.0f);
  EXPECT_EQ(q4_1_values[31], -1.0f);
  // Shapes: ggml order, PyTorch reversed.
  const GgufTensorInfo info{"m", {64, 3}, 8, 0, 0};
  EXPECT_EQ(info.TorchShape(), (std::vector<int64_t>{3, 64}));
}

TEST(GgufTest, ReadsMetadataOfEveryKind) {
  const nlohmann::json metadata = {
      {"a.string", "héllo"}, {"a.int", -7},    {"a.big", uint64_t{1} << 63},
      {"a.float", 0.5},      {"a.bool", true}, {"a.strings", {"x", "y"}},
      {"a.ints", {1, 2, 3}}};
  absl::StatusOr<std::string> bytes = SerializeGguf(metadata, {});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::FromBytes(*bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->version(), 3u);
  EXPECT_EQ((*file)->metadata(), metadata);
}

TEST(GgufTest, RefusesWhatIsNotAWellFormedGguf) {
  std::string q4 = Half(1.0f) + Half(0.0f) + std::string(16, '\0');
  absl::StatusOr<std::string> good = SerializeGguf({{"general.name", "x"}}, {{"t", {32}, 3, q4}});
  ASSERT_TRUE(good.ok());
  // Every proper prefix is refused, never read past its end.
  for (size_t n = 0; n < good->size(); ++n) {
    EXPECT_FALSE(GgufFile::FromBytes(good->substr(0, n)).ok()) << n;
  }
  std::string bad_magic = *good;
  bad_magic[0] = 'X';
  EXPECT_NE(GgufFile::FromBytes(bad_magic).status().message().find("magic"), std::string::npos);
  std::string version = *good;
  version[4] = 9;
  EXPECT_NE(GgufFile::FromBytes(version).status().message().find("version 9"), std::string::npos);

  // Rows that are not whole blocks, a duplicate tensor, an unknown type.
  absl::StatusOr<std::string> partial = SerializeGguf({}, {{"rows", {16, 2}, 3, q4}});
  ASSERT_TRUE(partial.ok());
  absl::Status status = GgufFile::FromBytes(*partial).status();
  EXPECT_NE(status.message().find("tensor rows"), std::string::npos) << status;
  absl::StatusOr<std::string> twice = SerializeGguf({}, {{"t", {32}, 3, q4}, {"t", {32}, 3, q4}});
  ASSERT_TRUE(twice.ok());
  EXPECT_NE(GgufFile::FromBytes(*twice).status().message().find("twice"), std::string::npos);
  absl::StatusOr<std::string> q6k = SerializeGguf({}, {{"k", {256}, 14, std::string(210, '\0')}});
  ASSERT_TRUE(q6k.ok());
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::FromBytes(*q6k, "model.gguf");
  ASSERT_TRUE(file.ok()) << file.status();  // listed, but not dequantised
  status = (*file)->Dequantize((*file)->tensors()[0]).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("model.gguf: tensor k is type 14"), std::string::npos) << status;
}

}  // namespace
}  // namespace specstream
