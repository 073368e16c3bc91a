#include "common/net_address.h"

#include "gtest/gtest.h"

namespace specstream {
namespace {

TEST(NetAddressTest, SplitsHostAndPort) {
  auto hp = SplitHostPort("coord.svc:7000", "--coordinator");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->host, "coord.svc");
  EXPECT_EQ(hp->port, 7000);
  hp = SplitHostPort("[::1]:50051", "--coordinator");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->host, "::1");
  EXPECT_EQ(hp->port, 50051);
  for (const char* bad : {"nohost", ":7000", "host:", "host:70000", "[::1]7000", "h:x"}) {
    auto refused = SplitHostPort(bad, "--coordinator");
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("--coordinator"), absl::string_view::npos);
  }
}

TEST(NetAddressTest, LocalAddressTowardFollowsTheRoute) {
  auto local = LocalAddressToward("127.0.0.1");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, "127.0.0.1");
  // Other loopback addresses route over lo with lo's source address.
  local = LocalAddressToward("127.0.0.5");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, "127.0.0.1");
  auto unresolvable = LocalAddressToward("no-such-host.invalid");
  ASSERT_FALSE(unresolvable.ok());
  EXPECT_NE(unresolvable.status().message().find("no-such-host.invalid"), absl::string_view::npos);
}

}  // namespace
}  // namespace specstream
