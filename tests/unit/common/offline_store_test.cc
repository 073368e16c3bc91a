#include "common/offline_store.h"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/testing.h"

namespace specstream {
namespace {

using specstream::testing::ReadFile;
using specstream::testing::TempDir;
using specstream::testing::WriteFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using Json = nlohmann::json;

constexpr int64_t kHidden = 4;

Json Contract(int64_t hidden = kHidden, DType hidden_dtype = DType::kBF16) {
  Json contract = {{"model_type", "llama"},
                   {"hidden_size", hidden},
                   {"vocab_size", 100},
                   {"capture_layer_ids", {1, 3, 4}}};
  contract["tensors"] = StoreTensorsContract({
      {"input_ids", DType::kI32, {}},
      {"loss_mask", DType::kU8, {}},
      {"aux_hidden", hidden_dtype, {3 * hidden}},
      {"last_hidden", hidden_dtype, {hidden}},
  });
  return contract;
}

// One sample's tensors with owned bytes; the contents depend on the id.
struct Sample {
  int64_t id = 0;
  std::map<std::string, std::string> bytes;
  std::vector<TensorView> views;
};

std::string Pattern(size_t n, int64_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 17 + 3) & 0xff);
  return s;
}

Sample MakeSample(int64_t id, int64_t tokens, int64_t hidden = kHidden) {
  Sample sample;
  sample.id = id;
  struct Spec {
    const char* name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  const std::vector<Spec> specs = {{"input_ids", DType::kI32, {tokens}},
                                   {"loss_mask", DType::kU8, {tokens}},
                                   {"aux_hidden", DType::kBF16, {tokens, 3 * hidden}},
                                   {"last_hidden", DType::kBF16, {tokens, hidden}}};
  int salt = 0;
  for (const Spec& spec : specs) {
    int64_t elements = 1;
    for (int64_t d : spec.shape) elements *= d;
    sample.bytes[spec.name] = Pattern(elements * DTypeSize(spec.dtype), id * 10 + salt++);
  }
  for (const Spec& spec : specs) {
    const std::string& b = sample.bytes[spec.name];
    sample.views.push_back(TensorView{spec.name, spec.dtype, spec.shape,
                                      reinterpret_cast<const uint8_t*>(b.data()), b.size()});
  }
  return sample;
}

// Tokens of sample `id` in the tests below: varied, never zero.
int64_t TokensOf(int64_t id) { return 3 + (id * 7) % 5; }

std::string Bytes(const TensorView& view) {
  return std::string(reinterpret_cast<const char*>(view.data), view.nbytes);
}

// Every regular file of `dir`, name -> bytes.
std::map<std::string, std::string> DirContents(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file()) {
      files[entry.path().filename().string()] = ReadFile(entry.path().string());
    }
  }
  return files;
}

Json ReadIndex(const std::string& dir) { return Json::parse(ReadFile(dir + "/index.json")); }

// Writes ids in order and finishes.
void WriteStore(const std::string& dir, const std::vector<int64_t>& ids,
                StoreWriterOptions options) {
  auto writer = StoreWriter::Open(dir, Contract(), options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (int64_t id : ids) {
    Sample s = MakeSample(id, TokensOf(id));
    ASSERT_TRUE((*writer)->Add(id, s.views).ok()) << id;
  }
  ASSERT_TRUE((*writer)->Finish().ok());
}

std::vector<int64_t> Ids(int64_t n) {
  // Not sorted: ids are record indices in whatever order the dump visits them.
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back((i * 7) % n + 100 * (i % 2));
  return ids;
}

// ---------------------------------------------------------------------------
// Round trips and shard cutting

TEST(OfflineStoreTest, RoundTripsSamples) {
  TempDir dir;
  const std::vector<int64_t> ids = {5, 0, 12, 3, 1000000000007};
  WriteStore(dir.path(), ids, {});

  auto reader = StoreReader::Open(dir.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->complete());
  EXPECT_EQ((*reader)->sample_ids(), ids);
  EXPECT_EQ((*reader)->contract(), Contract());
  EXPECT_EQ((*reader)->num_shards(), 1);
  int64_t tokens = 0;
  for (int64_t id : ids) tokens += TokensOf(id);
  EXPECT_EQ((*reader)->num_tokens(), tokens);

  for (int64_t id : ids) {
    Sample expected = MakeSample(id, TokensOf(id));
    auto views = (*reader)->Get(id);
    ASSERT_TRUE(views.ok()) << views.status();
    ASSERT_EQ(views->size(), 4u);
    // Contract order: sorted by name.
    EXPECT_EQ((*views)[0].name, "aux_hidden");
    EXPECT_EQ((*views)[1].name, "input_ids");
    EXPECT_EQ((*views)[2].name, "last_hidden");
    EXPECT_EQ((*views)[3].name, "loss_mask");
    for (const TensorView& view : *views) {
      const TensorView* want = nullptr;
      for (const TensorView& v : expected.views) {
        if (v.name == view.name) want = &v;
      }
      ASSERT_NE(want, nullptr) << view.name;
      EXPECT_EQ(view.dtype, want->dtype) << view.name;
      EXPECT_EQ(view.shape, want->shape) << view.name;
      EXPECT_EQ(Bytes(view), Bytes(*want)) << "sample " << id << " " << view.name;
    }
  }

  // The index as documented, and a shard any safetensors reader opens.
  Json index = ReadIndex(dir.path());
  EXPECT_EQ(index["format"], "specstream-offline-store");
  EXPECT_EQ(index["version"], 1);
  EXPECT_EQ(index["complete"], true);
  ASSERT_EQ(index["shards"].size(), 1u);
  EXPECT_EQ(index["shards"][0]["file"], "shard-00000.safetensors");
  EXPECT_EQ(index["shards"][0]["tokens"], tokens);
  EXPECT_EQ(index["shards"][0]["samples"], Json(ids));
  auto shard = SafetensorsFile::Open(dir.Join("shard-00000.safetensors"));
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(index["shards"][0]["bytes"], (*shard)->size());
  EXPECT_EQ((*shard)->names().size(), ids.size() * 4);
  EXPECT_TRUE((*shard)->Contains("1000000000007.aux_hidden"));
  EXPECT_TRUE((*shard)->Contains("12.input_ids"));
  EXPECT_EQ((*shard)->metadata().at("format"), "pt");
}

TEST(OfflineStoreTest, RollsShardsBySampleCount) {
  TempDir dir;
  StoreWriterOptions options;
  options.max_shard_samples = 2;
  auto writer = StoreWriter::Open(dir.path(), Contract(), options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (int64_t id = 0; id < 5; ++id) {
    Sample s = MakeSample(id, TokensOf(id));
    ASSERT_TRUE((*writer)->Add(id, s.views).ok());
    EXPECT_TRUE((*writer)->Contains(id));
    // A shard is written as soon as it is full, not later.
    EXPECT_EQ((*writer)->num_shards(), (id + 1) / 2) << id;
  }
  EXPECT_FALSE(testing::FileExists(dir.Join("shard-00002.safetensors")));
  EXPECT_EQ(ReadIndex(dir.path())["complete"], false);
  ASSERT_TRUE((*writer)->Finish().ok());

  Json index = ReadIndex(dir.path());
  ASSERT_EQ(index["shards"].size(), 3u);
  EXPECT_EQ(index["shards"][0]["samples"], Json({0, 1}));
  EXPECT_EQ(index["shards"][1]["samples"], Json({2, 3}));
  EXPECT_EQ(index["shards"][2]["samples"], Json({4}));
  EXPECT_EQ(index["shards"][2]["file"], "shard-00002.safetensors");
  EXPECT_EQ(index["shards"][1]["tokens"], TokensOf(2) + TokensOf(3));

  auto reader = StoreReader::Open(dir.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_THAT((*reader)->sample_ids(), ElementsAre(0, 1, 2, 3, 4));
  for (int64_t id = 0; id < 5; ++id) {
    auto views = (*reader)->Get(id);
    ASSERT_TRUE(views.ok()) << views.status();
    EXPECT_EQ((*views)[1].shape, std::vector<int64_t>{TokensOf(id)});
  }
}

TEST(OfflineStoreTest, RollsShardsByBytes) {
  TempDir dir;
  // Every sample: T=4 tokens of 4 + 1 + 2*12 + 2*4 = 37 bytes a token.
  const int64_t sample_bytes = 4 * 37;
  StoreWriterOptions options;
  options.max_shard_bytes = sample_bytes * 5 / 2;  // Reached by the third sample.
  auto writer = StoreWriter::Open(dir.path(), Contract(), options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (int64_t id = 0; id < 7; ++id) {
    Sample s = MakeSample(id, 4);
    ASSERT_TRUE((*writer)->Add(id, s.views).ok());
  }
  ASSERT_TRUE((*writer)->Finish().ok());
  Json index = ReadIndex(dir.path());
  ASSERT_EQ(index["shards"].size(), 3u);
  EXPECT_EQ(index["shards"][0]["samples"], Json({0, 1, 2}));
  EXPECT_EQ(index["shards"][1]["samples"], Json({3, 4, 5}));
  EXPECT_EQ(index["shards"][2]["samples"], Json({6}));

  // A sample larger than the limit gets a shard of its own.
  TempDir dir2;
  options.max_shard_bytes = 1;
  WriteStore(dir2.path(), {0, 1, 2}, options);
  EXPECT_EQ(ReadIndex(dir2.path())["shards"].size(), 3u);
}

TEST(OfflineStoreTest, EmptyStoreAndFreshIndex) {
  TempDir dir;
  const std::string store = dir.Join("nested/store");  // Created on Open.
  auto writer = StoreWriter::Open(store, Contract());
  ASSERT_TRUE(writer.ok()) << writer.status();
  // The contract is on disk before any shard.
  auto partial = StoreReader::Open(store);
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_FALSE((*partial)->complete());
  EXPECT_EQ((*partial)->num_samples(), 0);
  ASSERT_TRUE((*writer)->Finish().ok());
  ASSERT_TRUE((*writer)->Finish().ok());  // A second Finish is a no-op.
  auto reader = StoreReader::Open(store);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->complete());
  EXPECT_EQ((*reader)->num_tokens(), 0);
  Sample s = MakeSample(1, 3);
  absl::Status after = (*writer)->Add(1, s.views);
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition) << after;
}

// ---------------------------------------------------------------------------
// Resume

TEST(OfflineStoreTest, ResumedDumpIsByteIdenticalToUninterruptedOne) {
  const std::vector<int64_t> ids = Ids(10);
  StoreWriterOptions by_count;
  by_count.max_shard_samples = 3;
  StoreWriterOptions by_bytes;
  by_bytes.max_shard_bytes = 400;  // Two or three samples a shard.
  for (const StoreWriterOptions& options : {by_count, by_bytes}) {
    SCOPED_TRACE(options.max_shard_samples > 0 ? "by count" : "by bytes");
    TempDir reference;
    WriteStore(reference.path(), ids, options);
    ASSERT_GE(ReadIndex(reference.path())["shards"].size(), 3u);

    TempDir resumed;
    {
      auto writer = StoreWriter::Open(resumed.path(), Contract(), options);
      ASSERT_TRUE(writer.ok()) << writer.status();
      for (size_t i = 0; i < 7; ++i) {
        Sample s = MakeSample(ids[i], TokensOf(ids[i]));
        ASSERT_TRUE((*writer)->Add(ids[i], s.views).ok());
      }
      ASSERT_GE((*writer)->num_shards(), 2);
      // Killed here: no Finish, the buffered samples are lost.
    }
    const int64_t finished = ReadIndex(resumed.path())["shards"].size();
    // What a kill leaves: a shard renamed before the index caught up, and
    // temporaries of both.
    WriteFile(resumed.Join(OfflineStoreShardFileName(finished)), "partial shard");
    WriteFile(resumed.Join(OfflineStoreShardFileName(finished) + ".tmp-Ab12Cd"), "x");
    WriteFile(resumed.Join("index.json.tmp-Zz99Yy"), "{");
    WriteFile(resumed.Join("notes.txt"), "not ours");  // Left alone.

    auto writer = StoreWriter::Open(resumed.path(), Contract(), options);
    ASSERT_TRUE(writer.ok()) << writer.status();
    EXPECT_EQ((*writer)->num_shards(), finished);
    int skipped = 0;
    for (int64_t id : ids) {
      if ((*writer)->Contains(id)) {
        ++skipped;
        continue;
      }
      Sample s = MakeSample(id, TokensOf(id));
      ASSERT_TRUE((*writer)->Add(id, s.views).ok()) << id;
    }
    EXPECT_GT(skipped, 0);
    EXPECT_LT(skipped, 7);  // Buffered samples were not stored.
    ASSERT_TRUE((*writer)->Finish().ok());

    auto got = DirContents(resumed.path());
    ASSERT_EQ(got.erase("notes.txt"), 1u);
    auto want = DirContents(reference.path());
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, bytes] : want) {
      ASSERT_EQ(got.count(name), 1u) << name;
      EXPECT_TRUE(got[name] == bytes) << name << " differs";
    }
  }
}

TEST(OfflineStoreTest, ReopeningACompleteStoreKeepsItByteIdentical) {
  TempDir dir;
  StoreWriterOptions options;
  options.max_shard_samples = 2;
  WriteStore(dir.path(), {1, 2, 3}, options);
  auto before = DirContents(dir.path());
  auto writer = StoreWriter::Open(dir.path(), Contract(), options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (int64_t id : {1, 2, 3}) EXPECT_TRUE((*writer)->Contains(id));
  EXPECT_FALSE((*writer)->Contains(4));
  ASSERT_TRUE((*writer)->Finish().ok());
  EXPECT_EQ(DirContents(dir.path()), before);
}

TEST(OfflineStoreTest, RefusesADifferentContract) {
  TempDir dir;
  WriteStore(dir.path(), {1, 2}, {});
  auto before = DirContents(dir.path());

  auto wider = StoreWriter::Open(dir.path(), Contract(/*hidden=*/8));
  ASSERT_FALSE(wider.ok());
  EXPECT_EQ(wider.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wider.status().message(), HasSubstr("\"contract.hidden_size\""));

  auto f32 = StoreWriter::Open(dir.path(), Contract(kHidden, DType::kF32));
  ASSERT_FALSE(f32.ok());
  EXPECT_THAT(f32.status().message(), HasSubstr("contract.tensors.aux_hidden.dtype"));

  Json extra = Contract();
  extra["dtype"] = "bfloat16";
  auto with_extra = StoreWriter::Open(dir.path(), extra);
  ASSERT_FALSE(with_extra.ok());
  EXPECT_THAT(with_extra.status().message(), HasSubstr("\"contract.dtype\""));

  EXPECT_EQ(DirContents(dir.path()), before);  // Nothing deleted or rewritten.
}

// ---------------------------------------------------------------------------
// Refused samples

TEST(OfflineStoreTest, RefusesDuplicates) {
  TempDir dir;
  StoreWriterOptions options;
  options.max_shard_samples = 2;
  {
    auto writer = StoreWriter::Open(dir.path(), Contract(), options);
    ASSERT_TRUE(writer.ok()) << writer.status();
    Sample s = MakeSample(7, 3);
    ASSERT_TRUE((*writer)->Add(7, s.views).ok());
    absl::Status buffered = (*writer)->Add(7, s.views);
    EXPECT_EQ(buffered.code(), absl::StatusCode::kAlreadyExists) << buffered;
    EXPECT_THAT(buffered.message(), HasSubstr("sample 7"));
    Sample t = MakeSample(8, 3);
    ASSERT_TRUE((*writer)->Add(8, t.views).ok());  // Shard 0 written.
    absl::Status stored = (*writer)->Add(7, s.views);
    EXPECT_EQ(stored.code(), absl::StatusCode::kAlreadyExists) << stored;
    EXPECT_THAT(stored.message(), HasSubstr("shard-00000"));
  }
  auto writer = StoreWriter::Open(dir.path(), Contract(), options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  Sample s = MakeSample(8, 3);
  EXPECT_EQ((*writer)->Add(8, s.views).code(), absl::StatusCode::kAlreadyExists);
}

TEST(OfflineStoreTest, RefusesMalformedSamplesNamingIdAndTensor) {
  TempDir dir;
  auto writer = StoreWriter::Open(dir.path(), Contract());
  ASSERT_TRUE(writer.ok()) << writer.status();
  auto expect_refused = [&](int64_t id, std::vector<TensorView> views,
                            const std::vector<std::string>& needles) {
    absl::Status status = (*writer)->Add(id, views);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    for (const std::string& needle : needles) EXPECT_THAT(status.message(), HasSubstr(needle));
    EXPECT_FALSE((*writer)->Contains(id));
  };

  Sample good = MakeSample(42, 5);
  {
    auto views = good.views;
    views.pop_back();  // last_hidden
    expect_refused(42, views, {"sample 42", "missing tensor \"last_hidden\""});
  }
  {
    auto views = good.views;
    views.push_back(views[0]);
    expect_refused(42, views, {"sample 42", "\"input_ids\" given twice"});
  }
  {
    auto views = good.views;
    views[1].name = "logits";
    expect_refused(42, views, {"sample 42", "unknown tensor \"logits\""});
  }
  {
    auto views = good.views;
    views[2].dtype = DType::kF16;  // aux_hidden, same byte count
    expect_refused(42, views, {"sample 42", "\"aux_hidden\"", "BF16"});
  }
  {
    auto views = good.views;
    views[3].shape = {5, 2};  // last_hidden [T, 2]: wrong inner dim
    views[3].nbytes = 5 * 2 * 2;
    expect_refused(42, views, {"sample 42", "\"last_hidden\"", "[T, 4]"});
  }
  {
    Sample other = MakeSample(42, 6);
    auto views = good.views;
    views[1] = other.views[1];  // loss_mask with 6 tokens
    expect_refused(42, views, {"sample 42", "\"loss_mask\"", "6 tokens"});
  }
  {
    auto views = good.views;
    views[0].nbytes -= 4;
    expect_refused(42, views, {"sample 42", "\"input_ids\"", "bytes"});
  }
  Sample empty = MakeSample(43, 0);
  expect_refused(43, empty.views, {"sample 43", "no tokens"});
  expect_refused(-1, good.views, {"sample -1", "non-negative"});

  // Nothing was buffered by the refusals: the good sample still goes in.
  ASSERT_TRUE((*writer)->Add(42, good.views).ok());
  ASSERT_TRUE((*writer)->Finish().ok());
  auto reader = StoreReader::Open(dir.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_THAT((*reader)->sample_ids(), ElementsAre(42));
}

TEST(OfflineStoreTest, RefusesBadOptionsAndContracts) {
  TempDir dir;
  StoreWriterOptions zero;
  zero.max_shard_bytes = 0;
  EXPECT_THAT(StoreWriter::Open(dir.path(), Contract(), zero).status().message(),
              HasSubstr("max_shard_bytes"));
  StoreWriterOptions negative;
  negative.max_shard_samples = -1;
  EXPECT_THAT(StoreWriter::Open(dir.path(), Contract(), negative).status().message(),
              HasSubstr("max_shard_samples"));

  Json no_tensors = Contract();
  no_tensors.erase("tensors");
  EXPECT_THAT(StoreWriter::Open(dir.path(), no_tensors).status().message(),
              HasSubstr("contract.tensors"));
  Json bad_shape = Contract();
  bad_shape["tensors"]["aux_hidden"]["shape"] = {12, "T"};
  EXPECT_THAT(StoreWriter::Open(dir.path(), bad_shape).status().message(),
              HasSubstr("contract.tensors.aux_hidden.shape"));
  Json bad_dtype = Contract();
  bad_dtype["tensors"]["input_ids"]["dtype"] = "INT4";
  EXPECT_THAT(StoreWriter::Open(dir.path(), bad_dtype).status().message(),
              HasSubstr("contract.tensors.input_ids.dtype"));
  Json bad_name = Contract();
  bad_name["tensors"]["a.b"] = {{"dtype", "U8"}, {"shape", {"T"}}};
  EXPECT_THAT(StoreWriter::Open(dir.path(), bad_name).status().message(),
              HasSubstr("contract.tensors.a.b"));
  EXPECT_FALSE(testing::FileExists(dir.Join("index.json")));
}

// ---------------------------------------------------------------------------
// Reader errors

class OfflineStoreReaderErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreWriterOptions options;
    options.max_shard_samples = 2;
    WriteStore(dir_.path(), {10, 11, 12}, options);
  }
  absl::Status OpenStatus() { return StoreReader::Open(dir_.path()).status(); }
  void EditIndex(const std::function<void(Json&)>& edit) {
    Json index = ReadIndex(dir_.path());
    edit(index);
    WriteFile(dir_.Join("index.json"), index.dump(2));
  }

  TempDir dir_;
};

TEST_F(OfflineStoreReaderErrorTest, UnknownIdIsNotFound) {
  auto reader = StoreReader::Open(dir_.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto missing = (*reader)->Get(13);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("sample 13"));
  EXPECT_TRUE((*reader)->Contains(12));
  EXPECT_FALSE((*reader)->Contains(13));
}

TEST_F(OfflineStoreReaderErrorTest, MissingIndexIsNotFound) {
  std::filesystem::remove(dir_.Join("index.json"));
  EXPECT_EQ(OpenStatus().code(), absl::StatusCode::kNotFound) << OpenStatus();
}

TEST_F(OfflineStoreReaderErrorTest, MissingShard) {
  std::filesystem::remove(dir_.Join("shard-00001.safetensors"));
  absl::Status status = OpenStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("shard-00001.safetensors"));
  EXPECT_THAT(status.message(), HasSubstr("missing"));
  // The writer refuses to resume over it too.
  EXPECT_EQ(StoreWriter::Open(dir_.path(), Contract()).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(OfflineStoreReaderErrorTest, ResizedShard) {
  std::string bytes = ReadFile(dir_.Join("shard-00000.safetensors"));
  WriteFile(dir_.Join("shard-00000.safetensors"), bytes + "        ");
  EXPECT_THAT(OpenStatus().message(), HasSubstr("shard-00000.safetensors"));
  EXPECT_EQ(OpenStatus().code(), absl::StatusCode::kDataLoss);
}

TEST_F(OfflineStoreReaderErrorTest, CorruptIndex) {
  WriteFile(dir_.Join("index.json"), "{\"format\": \"specstream-offline-store\", ");
  absl::Status status = OpenStatus();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr("index.json"));
}

TEST_F(OfflineStoreReaderErrorTest, BadIndexFieldsAreNamed) {
  const std::vector<std::pair<std::function<void(Json&)>, std::string>> cases = {
      {[](Json& j) { j["format"] = "other"; }, "\"format\""},
      {[](Json& j) { j["version"] = 2; }, "\"version\""},
      {[](Json& j) { j.erase("complete"); }, "\"complete\""},
      {[](Json& j) { j["contract"] = 3; }, "\"contract\""},
      {[](Json& j) { j["contract"].erase("tensors"); }, "contract.tensors"},
      {[](Json& j) { j["shards"] = Json::object(); }, "\"shards\""},
      {[](Json& j) { j["shards"][1]["tokens"] = -1; }, "\"shards[1].tokens\""},
      {[](Json& j) { j["shards"][0].erase("bytes"); }, "\"shards[0].bytes\""},
      {[](Json& j) { j["shards"][1]["file"] = "../shard-00001.safetensors"; },
       "\"shards[1].file\""},
      {[](Json& j) { j["shards"][1]["samples"][0] = "x"; }, "\"shards[1].samples[0]\""},
      {[](Json& j) { j["shards"][1]["samples"][0] = 10; }, "sample 10 listed twice"},
  };
  const std::string original = ReadFile(dir_.Join("index.json"));
  for (const auto& [edit, needle] : cases) {
    WriteFile(dir_.Join("index.json"), original);
    EditIndex(edit);
    absl::Status status = OpenStatus();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << needle << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(needle));
  }
}

TEST_F(OfflineStoreReaderErrorTest, ShardNotMatchingTheIndexFailsOnFirstUse) {
  // Shard 0 holds samples 10 and 11; the index now claims 10 and 99.
  EditIndex([](Json& j) { j["shards"][0]["samples"] = {10, 99}; });
  auto reader = StoreReader::Open(dir_.path());
  ASSERT_TRUE(reader.ok()) << reader.status();     // Shards are checked lazily.
  for (int attempt = 0; attempt < 2; ++attempt) {  // The error is kept.
    auto views = (*reader)->Get(10);
    EXPECT_EQ(views.status().code(), absl::StatusCode::kDataLoss) << views.status();
    EXPECT_THAT(views.status().message(), HasSubstr("99."));
    EXPECT_THAT(views.status().message(), HasSubstr("shard-00000.safetensors"));
  }
  EXPECT_TRUE((*reader)->Get(12).ok());  // Shard 1 is fine.
}

TEST_F(OfflineStoreReaderErrorTest, ShardTokenCountMismatch) {
  EditIndex([](Json& j) { j["shards"][1]["tokens"] = 1000; });
  auto reader = StoreReader::Open(dir_.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto views = (*reader)->Get(12);
  EXPECT_EQ(views.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(views.status().message(), HasSubstr("1000"));
}

TEST(OfflineStoreTest, ConcurrentReads) {
  TempDir dir;
  StoreWriterOptions options;
  options.max_shard_samples = 3;
  const std::vector<int64_t> ids = Ids(12);
  WriteStore(dir.path(), ids, options);
  auto reader = StoreReader::Open(dir.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (int64_t id : ids) {
          Sample want = MakeSample(id, TokensOf(id));
          auto views = (*reader)->Get(id);
          if (!views.ok() || Bytes((*views)[0]) != want.bytes["aux_hidden"]) ++failures[t];
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_THAT(failures, ElementsAre(0, 0, 0, 0));
}

}  // namespace
}  // namespace specstream
