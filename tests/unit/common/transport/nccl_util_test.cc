#include "common/transport/nccl_util.h"

#include "gtest/gtest.h"

namespace specstream {
namespace {

absl::Status FailingCall() {
  RETURN_IF_NCCL_ERROR(ncclInvalidArgument);
  return absl::OkStatus();
}

TEST(NcclUtilTest, VersionIsAtLeastTwo) {
  auto version = NcclVersion();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_GE(*version, 20000);
}

TEST(NcclUtilTest, UniqueIdsAreFreshAndFullSize) {
  auto a = NewNcclUniqueId();
  auto b = NewNcclUniqueId();
  if (!a.ok()) GTEST_SKIP() << "ncclGetUniqueId unavailable here: " << a.status();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->size(), static_cast<size_t>(NCCL_UNIQUE_ID_BYTES));
  EXPECT_NE(*a, *b);
}

TEST(NcclUtilTest, ErrorMacroNamesCallSite) {
  absl::Status s = FailingCall();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("nccl_util_test.cc:"), std::string::npos) << s;
  EXPECT_NE(s.message().find("ncclInvalidArgument"), std::string::npos) << s;
}

TEST(NcclUtilTest, DeviceCountIsZeroWithoutDriverNotACrash) { EXPECT_GE(CudaDeviceCount(), 0); }

}  // namespace
}  // namespace specstream
