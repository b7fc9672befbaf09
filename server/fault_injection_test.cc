#include "server/fault_injection.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace carpool {
namespace {

TEST(FaultInjectionTest, ParsesSitesAndIdsAndPrintsThemBack) {
  Result<FaultInjection> f = FaultInjection::Parse("assemble=40;prepare=17,3");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->prepare.size(), 2u);
  EXPECT_EQ(f->assemble.count(40), 1u);
  EXPECT_TRUE(f->gpu_build.empty());
  EXPECT_EQ(f->ToString(), "prepare=3,17;assemble=40");
  EXPECT_THROW(FaultInjection::MaybeThrow(f->prepare, "preparation", 17), std::runtime_error);
  EXPECT_NO_THROW(FaultInjection::MaybeThrow(f->prepare, "preparation", 40));
  EXPECT_TRUE(FaultInjection::Parse("")->empty());
  Result<FaultInjection> r = FaultInjection::Parse("repeat=8,2");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->empty());
  EXPECT_EQ(r->ToString(), "repeat=2,8");
}

TEST(FaultInjectionTest, BadTextIsRefusedNamingThePart) {
  for (const char* bad :
       {"prepare", "decode=1", "prepare=x", "prepare=1,,2", "prepare=99999999999"}) {
    Result<FaultInjection> f = FaultInjection::Parse(bad);
    ASSERT_FALSE(f.ok()) << bad;
    EXPECT_NE(f.status().message().find("expected SITE="), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace carpool
