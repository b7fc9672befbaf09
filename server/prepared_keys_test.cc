#include "server/prepared_keys.h"

#include <gtest/gtest.h>

namespace carpool {
namespace {

PrepareSpec Spec(int side) { return {.resize = side, .crop = side}; }

TEST(PreparedKeysTest, EachSpecGetsItsOwnBaseAndKeepsIt) {
  PreparedKeys keys;
  EXPECT_EQ(*keys.BaseFor(Spec(28), 100, "a"), 0u);
  EXPECT_EQ(*keys.BaseFor(Spec(32), 100, "b"), 1u << kKeyIdBits);
  EXPECT_EQ(*keys.BaseFor(Spec(28), 50, "c"), 0u);
  EXPECT_EQ(*keys.BaseFor(Spec(32), 50, "d"), 1u << kKeyIdBits);
  ASSERT_EQ(keys.specs().size(), 2u);
  EXPECT_EQ(keys.specs()[1], Spec(32));
}

TEST(PreparedKeysTest, OneSpecKeysAnyIdAsItself) {
  PreparedKeys keys;
  EXPECT_EQ(*keys.BaseFor(Spec(28), UINT32_MAX, "big"), 0u);
  // A second spec would collide with those ids: refused with the limit and the way out.
  Result<uint32_t> second = keys.BaseFor(Spec(32), 10, "other");
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("134217728"), std::string::npos)
      << second.status().ToString();
  EXPECT_EQ(keys.specs().size(), 1u);  // the refused spec took no slot
}

TEST(PreparedKeysTest, LargeIdsAreRefusedBesideASecondSpec) {
  PreparedKeys keys;
  ASSERT_TRUE(keys.BaseFor(Spec(28), 10, "a").ok());
  ASSERT_TRUE(keys.BaseFor(Spec(32), 10, "b").ok());
  EXPECT_FALSE(keys.BaseFor(Spec(28), kKeyIdMask + 1, "a-big").ok());
  EXPECT_FALSE(keys.BaseFor(Spec(32), kKeyIdMask + 1, "b-big").ok());
  EXPECT_TRUE(keys.BaseFor(Spec(32), kKeyIdMask, "b-edge").ok());
}

TEST(PreparedKeysTest, TheSpecAfterTheLastSlotIsRefusedNamingTheFix) {
  PreparedKeys keys;
  for (uint32_t i = 0; i < kMaxSpecSlots; ++i) {
    ASSERT_EQ(*keys.BaseFor(Spec(10 + static_cast<int>(i)), 5, "d"), i << kKeyIdBits);
  }
  Result<uint32_t> more = keys.BaseFor(Spec(999), 5, "late");
  ASSERT_FALSE(more.ok());
  EXPECT_NE(more.status().message().find("\"late\""), std::string::npos);
  EXPECT_NE(more.status().message().find("restart the server"), std::string::npos);
  EXPECT_TRUE(keys.BaseFor(Spec(10), 5, "known").ok());  // specs in use still serve
}

TEST(PreparedKeysTest, KeysOfShiftsEveryIdByTheBase) {
  Roaring ids;
  ids.addRange(1, 70000);
  ids.add(100000);
  const Roaring keys = KeysOf(ids, 3u << kKeyIdBits);
  EXPECT_EQ(keys.cardinality(), ids.cardinality());
  EXPECT_EQ(keys.minimum(), (3u << kKeyIdBits) + 1);
  EXPECT_EQ(keys.maximum(), (3u << kKeyIdBits) + 100000);
  EXPECT_EQ(KeysOf(ids, 0), ids);
}

}  // namespace
}  // namespace carpool
