#include "common/file.h"

#include <sys/stat.h>

#include <filesystem>

#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace specstream {
namespace {

size_t EntryCount(const std::string& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

TEST(FileTest, WriteAtomicallyReplacesWholeFileWithPlainPermissions) {
  testing::TempDir dir;
  std::string path = dir.Join("out.txt");
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "second").ok());
  EXPECT_EQ(*ReadFileToString(path), "second");
  EXPECT_EQ(EntryCount(dir.path()), 1u);  // no temporaries left
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  mode_t mask = umask(022);
  umask(mask);
  EXPECT_EQ(st.st_mode & 0777, 0666 & ~mask);
}

TEST(FileTest, FailedWriteLeavesNothing) {
  testing::TempDir dir;
  absl::Status s = WriteFileAtomically(dir.Join("missing/out.txt"), "x");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("missing/out.txt"), std::string::npos) << s;
  EXPECT_EQ(EntryCount(dir.path()), 0u);
  EXPECT_EQ(ReadFileToString(dir.Join("nope")).status().code(), absl::StatusCode::kNotFound);
}

TEST(FileTest, AtomicOutputAppearsOnlyOnCommit) {
  testing::TempDir dir;
  std::string path = dir.Join("lines.jsonl");
  {
    auto out = AtomicOutputFile::Create(path);
    ASSERT_TRUE(out.ok());
    ASSERT_TRUE((*out)->Append("a\n").ok());
    EXPECT_FALSE(testing::FileExists(path));
    // Dropped without Commit: the temporary goes too.
  }
  EXPECT_EQ(EntryCount(dir.path()), 0u);
  auto out = AtomicOutputFile::Create(path);
  ASSERT_TRUE(out.ok());
  ASSERT_TRUE((*out)->Append("a\n").ok());
  ASSERT_TRUE((*out)->Append("b\n").ok());
  ASSERT_TRUE((*out)->Commit().ok());
  EXPECT_EQ(*ReadFileToString(path), "a\nb\n");
  EXPECT_FALSE((*out)->Append("c").ok());
  EXPECT_EQ(EntryCount(dir.path()), 1u);
}

}  // namespace
}  // namespace specstream
