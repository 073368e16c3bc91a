#include "common/vocab_map.h"

#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace specstream {
namespace {

TEST(VocabMapTest, CountsOnlyMaskedTokens) {
  TokenCounter counter(10);
  std::vector<int32_t> ids = {1, 2, 2, 3, 3, 3};
  std::vector<uint8_t> mask = {1, 1, 1, 0, 0, 1};
  ASSERT_TRUE(counter.Add(ids, mask).ok());
  EXPECT_EQ(counter.counts()[2], 2);
  EXPECT_EQ(counter.counts()[3], 1);
  EXPECT_EQ(counter.total(), 4);
  ASSERT_TRUE(counter.Add(ids, {}).ok());  // empty mask counts everything
  EXPECT_EQ(counter.counts()[3], 4);
}

TEST(VocabMapTest, RejectsOutOfRangeIdsAndMismatchedMask) {
  TokenCounter counter(4);
  std::vector<int32_t> ids = {0, 4};
  absl::Status s = counter.Add(ids, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("token id 4 at position 1"), std::string::npos) << s;
  EXPECT_EQ(counter.total(), 0);  // nothing counted on error
  std::vector<uint8_t> short_mask = {1};
  EXPECT_FALSE(counter.Add(ids, short_mask).ok());
}

TEST(VocabMapTest, TopKByFrequencyTiesBySmallerIdSorted) {
  TokenCounter counter(8);
  // counts: 7 -> 3, 5 -> 2, 1 -> 2, 6 -> 1
  std::vector<int32_t> ids = {7, 7, 7, 5, 5, 1, 1, 6};
  ASSERT_TRUE(counter.Add(ids, {}).ok());
  auto map = BuildVocabMap(counter, 3);
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->used, (std::vector<int64_t>{1, 5, 7}));
  EXPECT_EQ(map->d2t, (std::vector<int64_t>{1, 4, 5}));
  EXPECT_EQ(map->t2d, (std::vector<uint8_t>{0, 1, 0, 0, 0, 1, 0, 1}));
  EXPECT_DOUBLE_EQ(map->coverage, 7.0 / 8.0);
}

TEST(VocabMapTest, PadsWithSmallestUnseenIds) {
  TokenCounter counter(10);
  std::vector<int32_t> ids = {9, 4};
  ASSERT_TRUE(counter.Add(ids, {}).ok());
  auto map = BuildVocabMap(counter, 5);
  ASSERT_TRUE(map.ok());
  EXPECT_EQ(map->used, (std::vector<int64_t>{0, 1, 2, 4, 9}));
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(map->d2t[i] + i, map->used[i]);
  EXPECT_FALSE(BuildVocabMap(counter, 0).ok());
  EXPECT_FALSE(BuildVocabMap(counter, 11).ok());
}

TEST(VocabMapTest, SaveLoadRoundTripAsSafetensors) {
  testing::TempDir dir;
  TokenCounter counter(50);
  std::vector<int32_t> ids = {3, 3, 10, 20, 20, 20, 49};
  ASSERT_TRUE(counter.Add(ids, {}).ok());
  auto map = BuildVocabMap(counter, 6);
  ASSERT_TRUE(map.ok());
  ASSERT_TRUE(SaveVocabMap(*map, dir.Join("map.safetensors")).ok());

  auto file = SafetensorsFile::Open(dir.Join("map.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  auto d2t = (*file)->Get("d2t");
  auto t2d = (*file)->Get("t2d");
  ASSERT_TRUE(d2t.ok() && t2d.ok());
  EXPECT_EQ(d2t->dtype, DType::kI64);
  EXPECT_EQ(d2t->shape, (std::vector<int64_t>{6}));
  EXPECT_EQ(t2d->dtype, DType::kBool);
  EXPECT_EQ(t2d->shape, (std::vector<int64_t>{50}));

  auto loaded = LoadVocabMap(dir.Join("map.safetensors"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->d2t, map->d2t);
  EXPECT_EQ(loaded->t2d, map->t2d);
  EXPECT_EQ(loaded->used, map->used);
}

TEST(VocabMapTest, LoadRejectsInconsistentMaps) {
  testing::TempDir dir;
  VocabMap bad;
  bad.d2t = {0, 0};  // targets 0, 1
  bad.t2d = {1, 0, 1};
  ASSERT_TRUE(SaveVocabMap(bad, dir.Join("bad.safetensors")).ok());
  auto loaded = LoadVocabMap(dir.Join("bad.safetensors"));
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("t2d[1] is unset"), std::string::npos)
      << loaded.status();
}

}  // namespace
}  // namespace specstream
