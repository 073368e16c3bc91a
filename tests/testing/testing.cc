#include "tests/testing/testing.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"

namespace specstream::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(base ? base : "/tmp") + "/specstream-test-XXXXXX";
  char* made = mkdtemp(pattern.data());
  if (made == nullptr) std::abort();
  path_ = made;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  if (!out) {
    ADD_FAILURE() << "cannot write " << path;
    std::abort();
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    std::abort();
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

bool FileExists(const std::string& path) { return std::filesystem::exists(path); }

std::string SourceDir() { return SPECSTREAM_SOURCE_DIR; }
std::string BinaryDir() { return SPECSTREAM_BINARY_DIR; }

std::string FixturesDir() {
  const char* env = std::getenv("SPECSTREAM_FIXTURES");
  if (env != nullptr && *env != '\0') return env;
  return BinaryDir() + "/fixtures";
}

bool RunningInCi() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

}  // namespace specstream::testing
