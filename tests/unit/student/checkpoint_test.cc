#include "student/checkpoint.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_env.h"
#include "tests/testing/testing.h"

namespace specstream::student {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::unique_ptr<CheckpointManager> Make(const std::string& root, int keep_last = 0,
                                        std::function<bool(absl::string_view)> crash_at = {},
                                        Env* env = nullptr) {
  CheckpointOptions options;
  options.root = root;
  options.keep_last = keep_last;
  options.crash_at = std::move(crash_at);
  options.env = env;
  auto manager = CheckpointManager::Create(options);
  EXPECT_TRUE(manager.ok()) << manager.status();
  return manager.ok() ? std::move(*manager) : nullptr;
}

// Random bits reinterpreted as `dtype`: NaN payloads and denormals included,
// so only a bitwise round trip passes.
torch::Tensor RandomBits(std::vector<int64_t> shape, torch::Dtype dtype) {
  torch::Tensor bytes = torch::randint(
      0, 256, {static_cast<int64_t>(c10::multiply_integers(shape) * c10::elementSize(dtype))},
      torch::kUInt8);
  if (dtype == torch::kBool) return (bytes % 2).to(torch::kBool).view(shape);
  return bytes.view(dtype).view(shape);
}

bool BitwiseEqual(const torch::Tensor& a, const torch::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
}

CheckpointContents Sample(int64_t step) {
  torch::manual_seed(step);
  CheckpointContents c;
  c.draft["fc.weight"] = RandomBits({4, 12}, torch::kBFloat16);
  c.draft["midlayer.mlp.up_proj.weight"] = RandomBits({8, 4}, torch::kFloat32);
  c.draft["norm.weight"] = RandomBits({4}, torch::kFloat16);
  c.optimizer["fc.weight.exp_avg"] = RandomBits({4, 12}, torch::kFloat32);
  c.optimizer["fc.weight.exp_avg_sq"] = RandomBits({4, 12}, torch::kFloat32);
  c.optimizer["step"] = torch::tensor(step, torch::kInt64);  // 0-dim
  c.optimizer["ids"] = RandomBits({3}, torch::kInt32);
  c.optimizer["bytes"] = RandomBits({5}, torch::kUInt8);
  c.optimizer["mask"] = RandomBits({7}, torch::kBool);
  c.optimizer["empty"] = torch::zeros({0, 3}, torch::kFloat32);
  c.state = {{"step", step},
             {"epoch", 1},
             {"cursor", {{"epoch", 1}, {"index", 17}}},
             {"scheduler", {{"last_lr", 1e-4}}},
             {"fingerprint", "0123456789abcdef"},
             {"world_size", 2}};
  c.rng_by_rank[0] = std::string("rank0\0bytes\xff", 12);
  c.rng_by_rank[1] = std::string(1000, '\x01');
  return c;
}

void ExpectSame(const CheckpointContents& a, const CheckpointContents& b) {
  ASSERT_EQ(a.draft.size(), b.draft.size());
  for (const auto& [name, t] : a.draft) {
    ASSERT_TRUE(b.draft.count(name)) << name;
    EXPECT_TRUE(BitwiseEqual(t, b.draft.at(name))) << name;
  }
  ASSERT_EQ(a.optimizer.size(), b.optimizer.size());
  for (const auto& [name, t] : a.optimizer) {
    ASSERT_TRUE(b.optimizer.count(name)) << name;
    EXPECT_TRUE(BitwiseEqual(t, b.optimizer.at(name))) << name;
  }
  EXPECT_EQ(a.state, b.state);
  EXPECT_EQ(a.rng_by_rank, b.rng_by_rank);
}

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

bool HasTmp(const std::string& dir) {
  for (const std::string& name : Entries(dir)) {
    if (name.rfind(".tmp-", 0) == 0) return true;
  }
  return false;
}

TEST(CheckpointTest, SaveLoadRoundTripIsBitwise) {
  testing::TempDir dir;
  auto manager = Make(dir.path());
  CheckpointContents saved = Sample(123);
  ASSERT_TRUE(manager->Save(123, saved).ok());
  EXPECT_EQ(Entries(dir.path()), (std::vector<std::string>{"latest", "step-00000123"}));
  EXPECT_EQ(Entries(dir.Join("step-00000123")),
            (std::vector<std::string>{"draft.safetensors", "manifest.json", "optimizer.safetensors",
                                      "rng-rank-0.bin", "rng-rank-1.bin", "state.json"}));
  auto loaded = manager->Load(123);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSame(saved, *loaded);
}

TEST(CheckpointTest, NonContiguousTensorsAreSavedByValue) {
  testing::TempDir dir;
  auto manager = Make(dir.path());
  CheckpointContents c;
  torch::Tensor base = torch::arange(12, torch::kFloat32).view({3, 4});
  c.draft["t"] = base.t();
  ASSERT_TRUE(manager->Save(0, c).ok());
  auto loaded = manager->Load(0);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(torch::equal(loaded->draft.at("t"), base.t()));
}

TEST(CheckpointTest, LatestPointerFollowsSaves) {
  testing::TempDir dir;
  auto manager = Make(dir.path());
  auto none = manager->LatestStep();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_EQ(manager->LoadLatest().status().code(), absl::StatusCode::kNotFound);

  ASSERT_TRUE(manager->Save(1, Sample(1)).ok());
  ASSERT_TRUE(manager->Save(2, Sample(2)).ok());
  EXPECT_EQ(testing::ReadFile(dir.Join("latest")), "step-00000002\n");
  // A fresh manager (a restarted trainer) sees the same.
  auto reopened = Make(dir.path());
  auto latest = reopened->LatestStep();
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ(**latest, 2);
  auto loaded = reopened->LoadLatest();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->state["step"], 2);
}

TEST(CheckpointTest, KeepLastPrunesOlderSteps) {
  testing::TempDir dir;
  auto manager = Make(dir.path(), /*keep_last=*/2);
  for (int64_t step : {10, 20, 30, 40}) ASSERT_TRUE(manager->Save(step, Sample(step)).ok());
  auto steps = manager->ListSteps();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, (std::vector<int64_t>{30, 40}));
  EXPECT_EQ(Entries(dir.path()),
            (std::vector<std::string>{"latest", "step-00000030", "step-00000040"}));
}

TEST(CheckpointTest, KeepLastNeverPrunesTheStepJustSavedOrLaterOnes) {
  testing::TempDir dir;
  auto manager = Make(dir.path(), /*keep_last=*/1);
  ASSERT_TRUE(manager->Save(50, Sample(50)).ok());
  // A run resumed from an older step saves below 50: 50 stays, the new one is
  // latest.
  ASSERT_TRUE(manager->Save(20, Sample(20)).ok());
  EXPECT_EQ(*manager->ListSteps(), (std::vector<int64_t>{20, 50}));
  EXPECT_EQ(**manager->LatestStep(), 20);
}

TEST(CheckpointTest, SavingTheSameStepReplacesIt) {
  testing::TempDir dir;
  auto manager = Make(dir.path());
  ASSERT_TRUE(manager->Save(7, Sample(1)).ok());
  CheckpointContents second = Sample(2);
  ASSERT_TRUE(manager->Save(7, second).ok());
  auto loaded = manager->Load(7);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSame(second, *loaded);
  EXPECT_FALSE(HasTmp(dir.path()));
}

TEST(CheckpointTest, CrashBeforeRenameIsIgnoredAndCleaned) {
  testing::TempDir dir;
  auto manager = Make(dir.path());
  ASSERT_TRUE(manager->Save(1, Sample(1)).ok());
  auto crashing =
      Make(dir.path(), 0, [](absl::string_view point) { return point == "tmp_written"; });
  EXPECT_EQ(crashing->Save(2, Sample(2)).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(HasTmp(dir.path()));
  // A step directory missing files (e.g. copied by hand and interrupted).
  fs::create_directories(dir.Join("step-00000003"));
  testing::WriteFile(dir.Join("step-00000003/draft.safetensors"), "partial");
  // A step directory whose manifest lists a file that was truncated.
  ASSERT_TRUE(manager->Save(4, Sample(4)).ok());
  fs::resize_file(dir.Join("step-00000004/draft.safetensors"), 10);

  auto latest = manager->LatestStep();
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ(**latest, 1) << "latest names step 4, which is broken; step 1 is the newest good one";
  EXPECT_EQ(*manager->ListSteps(), (std::vector<int64_t>{1}));

  auto restarted = Make(dir.path());  // Create cleans the debris.
  EXPECT_EQ(Entries(dir.path()), (std::vector<std::string>{"latest", "step-00000001"}));
  auto loaded = restarted->LoadLatest();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->state["step"], 1);
}

TEST(CheckpointTest, CrashAfterRenameKeepsBothCompleteSteps) {
  testing::TempDir dir;
  auto manager = Make(dir.path());
  ASSERT_TRUE(manager->Save(1, Sample(1)).ok());
  auto crashing = Make(dir.path(), 0, [](absl::string_view point) { return point == "renamed"; });
  EXPECT_EQ(crashing->Save(2, Sample(2)).code(), absl::StatusCode::kAborted);
  // `latest` was not updated: it still names step 1, which is complete.
  EXPECT_EQ(testing::ReadFile(dir.Join("latest")), "step-00000001\n");
  EXPECT_EQ(**manager->LatestStep(), 1);
  auto restarted = Make(dir.path());
  EXPECT_EQ(*restarted->ListSteps(), (std::vector<int64_t>{1, 2}));
}

// Filesystem faults at each durability step of Save (tests/testing/fake_env.h):
// the error names the checkpoint, the last good step stays the latest and
// loadable, and nothing half-written is left once a manager is created again.
TEST(CheckpointTest, FilesystemFaultsAtEachStepLoseNothing) {
  using Op = testing::FakeEnv::Op;
  struct Case {
    Op op;
    std::string path_part;
    int nth;
  };
  const std::vector<Case> cases = {
      {Op::kMakeTempDirectory, "/.tmp-step-", 1},
      {Op::kWriteFileAtomically, "/draft.safetensors", 1},
      {Op::kWriteFileAtomically, "/rng-rank", 1},
      {Op::kFsyncDirectory, "/.tmp-step-", 1},
      {Op::kRename, "/.tmp-step-", 1},
      {Op::kWriteFileAtomically, "/latest", 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path_part);
    testing::TempDir dir;
    testing::FakeEnv env;
    auto manager = Make(dir.path(), 0, {}, &env);
    CheckpointContents first = Sample(1);
    ASSERT_TRUE(manager->Save(1, first).ok());
    env.FailOn(c.op, c.path_part, absl::InternalError("injected: disk on fire"), c.nth);
    absl::Status saved = manager->Save(2, Sample(2));
    EXPECT_EQ(env.pending_faults(), 0) << "the fault never fired";
    ASSERT_FALSE(saved.ok());
    EXPECT_THAT(std::string(saved.message()), HasSubstr("saving checkpoint"));
    EXPECT_THAT(std::string(saved.message()), HasSubstr("disk on fire"));
    auto restarted = Make(dir.path());
    auto latest = restarted->LatestStep();
    ASSERT_TRUE(latest.ok() && latest->has_value());
    // Before the rename the new step does not exist; after it, step 2 is
    // complete but `latest` still names step 1, which is complete too.
    const bool renamed = c.op == Op::kWriteFileAtomically && c.path_part == "/latest";
    EXPECT_EQ(**latest, 1);
    const std::vector<int64_t> steps =
        renamed ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{1};
    EXPECT_EQ(*restarted->ListSteps(), steps);
    auto loaded = restarted->Load(1);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ExpectSame(first, *loaded);
    EXPECT_FALSE(HasTmp(dir.path()));
  }
}

TEST(CheckpointTest, AFailedReplaceKeepsTheStepItWouldHaveReplaced) {
  testing::TempDir dir;
  testing::FakeEnv env;
  auto manager = Make(dir.path(), 0, {}, &env);
  CheckpointContents first = Sample(1);
  ASSERT_TRUE(manager->Save(7, first).ok());
  // Step 7 again: the old directory is moved aside, then the new one's
  // rename into place fails.
  env.FailOn(testing::FakeEnv::Op::kRename, "/.tmp-step-", absl::InternalError("injected"));
  EXPECT_FALSE(manager->Save(7, Sample(2)).ok());
  auto restarted = Make(dir.path());
  auto loaded = restarted->Load(7);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSame(first, *loaded);
  EXPECT_FALSE(HasTmp(dir.path()));
}

// P13 item 10: a same-size corruption used to load silently (sizes were the
// only check). Every file now carries a CRC32C in the manifest.
TEST(CheckpointTest, ASameSizeCorruptionIsCaughtAndTheNewestGoodStepLoads) {
  testing::TempDir dir;
  auto manager = Make(dir.path());
  CheckpointContents first = Sample(1);
  ASSERT_TRUE(manager->Save(1, first).ok());
  ASSERT_TRUE(manager->Save(2, Sample(2)).ok());
  // One flipped bit in the tensor bytes at the end of the file.
  const std::string draft = dir.Join("step-00000002/draft.safetensors");
  std::string bytes = testing::ReadFile(draft);
  bytes[bytes.size() - 3] ^= 0x10;
  testing::WriteFile(draft, bytes);

  auto direct = manager->Load(2);
  ASSERT_FALSE(direct.ok());
  EXPECT_EQ(direct.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(direct.status().message()), HasSubstr("draft.safetensors: CRC32C"));

  // A reader skips it and leaves it in place.
  CheckpointOptions read_only;
  read_only.root = dir.path();
  read_only.read_only = true;
  auto looker = CheckpointManager::Create(read_only);
  ASSERT_TRUE(looker.ok());
  auto seen = (*looker)->LoadNewest();
  ASSERT_TRUE(seen.ok() && seen->has_value()) << seen.status();
  EXPECT_EQ((*seen)->step, 1);
  EXPECT_TRUE(fs::exists(dir.Join("step-00000002")));

  // The writer sets it aside (never deletes it) and resumes from step 1.
  auto loaded = manager->LoadNewest();
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  EXPECT_EQ((*loaded)->step, 1);
  ExpectSame(first, (*loaded)->contents);
  EXPECT_FALSE(fs::exists(dir.Join("step-00000002")));
  EXPECT_TRUE(fs::exists(dir.Join("corrupt-step-00000002/draft.safetensors")));
  auto restarted = Make(dir.path());  // Create's cleanup keeps it too
  EXPECT_TRUE(fs::exists(dir.Join("corrupt-step-00000002")));
  EXPECT_EQ(*restarted->ListSteps(), (std::vector<int64_t>{1}));
}

TEST(CheckpointTest, ManifestsWithoutChecksumsStillLoad) {
  testing::TempDir dir;
  auto manager = Make(dir.path());
  CheckpointContents first = Sample(3);
  ASSERT_TRUE(manager->Save(3, first).ok());
  const std::string path = dir.Join("step-00000003/manifest.json");
  nlohmann::json manifest = nlohmann::json::parse(testing::ReadFile(path));
  ASSERT_TRUE(manifest.contains("crc32c"));
  manifest.erase("crc32c");  // as written before checksums existed
  testing::WriteFile(path, manifest.dump(2) + "\n");
  auto loaded = manager->Load(3);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSame(first, *loaded);
}

TEST(CheckpointTest, MissingLatestFallsBackToNewestCompleteStep) {
  testing::TempDir dir;
  auto manager = Make(dir.path());
  ASSERT_TRUE(manager->Save(3, Sample(3)).ok());
  ASSERT_TRUE(manager->Save(9, Sample(9)).ok());
  fs::remove(dir.Join("latest"));
  EXPECT_EQ(**manager->LatestStep(), 9);
  testing::WriteFile(dir.Join("latest"), "garbage\n");
  EXPECT_EQ(**manager->LatestStep(), 9);
}

TEST(CheckpointTest, LoadOfMissingOrCorruptCheckpointNamesTheFile) {
  testing::TempDir dir;
  auto manager = Make(dir.path());
  auto missing = manager->Load(99);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("step-00000099"));

  struct Damage {
    std::string file;
    std::function<void(const std::string&)> apply;
  };
  const std::vector<Damage> damages = {
      {"draft.safetensors", [](const std::string& p) { fs::resize_file(p, 16); }},
      {"optimizer.safetensors",
       [](const std::string& p) {
         // Same size, garbage header: only parsing can tell.
         std::string bytes = testing::ReadFile(p);
         for (size_t i = 8; i < 24; ++i) bytes[i] = '#';
         testing::WriteFile(p, bytes);
       }},
      {"state.json",
       [](const std::string& p) {
         std::string bytes = testing::ReadFile(p);
         testing::WriteFile(p, std::string(bytes.size(), '{'));
       }},
      {"rng-rank-1.bin", [](const std::string& p) { fs::remove(p); }},
      {"manifest.json", [](const std::string& p) { fs::remove(p); }},
  };
  int64_t step = 0;
  for (const Damage& d : damages) {
    ++step;
    ASSERT_TRUE(manager->Save(step, Sample(step)).ok());
    d.apply(dir.Join(CheckpointDirName(step) + "/" + d.file));
    auto loaded = manager->Load(step);
    ASSERT_FALSE(loaded.ok()) << d.file;
    EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(d.file)) << loaded.status();
    EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(CheckpointDirName(step)));
  }
}

TEST(CheckpointTest, SaveRefusesBadInputWithoutWriting) {
  testing::TempDir dir;
  auto manager = Make(dir.path());
  CheckpointContents c = Sample(1);
  c.draft["midlayer.bad"] = torch::zeros({2}, torch::kFloat64);
  absl::Status status = manager->Save(1, c);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("midlayer.bad"));

  c = Sample(1);
  c.rng_by_rank.erase(0);
  EXPECT_EQ(manager->Save(1, c).code(), absl::StatusCode::kInvalidArgument);
  c = Sample(1);
  c.state = nlohmann::json::array();
  EXPECT_EQ(manager->Save(1, c).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(manager->Save(-1, Sample(1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Entries(dir.path()).empty());
}

TEST(CheckpointTest, ReadOnlyManagersNeitherCleanNorSave) {
  testing::TempDir dir;
  auto writer = Make(dir.path());
  ASSERT_TRUE(writer->Save(1, Sample(1)).ok());
  // Rank 0 is mid-save of step 2 when another rank opens the root.
  auto crashing =
      Make(dir.path(), 0, [](absl::string_view point) { return point == "tmp_written"; });
  ASSERT_EQ(crashing->Save(2, Sample(2)).code(), absl::StatusCode::kAborted);
  CheckpointOptions options;
  options.root = dir.path();
  options.read_only = true;
  auto reader = CheckpointManager::Create(options);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE(HasTmp(dir.path())) << "a reader must not remove a save in progress";
  auto loaded = (*reader)->LoadLatest();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->rng_by_rank.at(1), Sample(1).rng_by_rank.at(1));
  EXPECT_EQ((*reader)->Save(3, Sample(3)).code(), absl::StatusCode::kFailedPrecondition);

  options.root = dir.Join("not-yet");  // Readers may start before the first save.
  reader = CheckpointManager::Create(options);
  ASSERT_TRUE(reader.ok());
  auto latest = (*reader)->LatestStep();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_FALSE(latest->has_value());
  EXPECT_FALSE(testing::FileExists(dir.Join("not-yet")));
}

TEST(CheckpointTest, CreateRefusesBadOptions) {
  CheckpointOptions options;
  EXPECT_EQ(CheckpointManager::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  testing::TempDir dir;
  options.root = dir.path();
  options.keep_last = -1;
  EXPECT_EQ(CheckpointManager::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckpointTest, DirNamesArePadded) {
  EXPECT_EQ(CheckpointDirName(0), "step-00000000");
  EXPECT_EQ(CheckpointDirName(123), "step-00000123");
  EXPECT_EQ(CheckpointDirName(1234567890), "step-1234567890");
}

}  // namespace
}  // namespace specstream::student
