#include "server/resident_area.h"

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <set>

namespace carpool {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

// Next use = the value in the map (kNever when absent), as the scheduler answers.
ResidentArea::NextUseFn Oracle(const std::map<uint32_t, double>& next) {
  return [&next](std::span<const uint32_t> samples, std::span<double> out) {
    for (size_t i = 0; i < samples.size(); ++i) {
      auto it = next.find(samples[i]);
      out[i] = it == next.end() ? kNever : it->second;
    }
  };
}

TEST(ResidentAreaTest, PlacesFindsAndNeverOverlaps) {
  ResidentArea area(10 * 1024, /*chunk_bytes=*/4096);
  std::map<uint32_t, double> next;
  std::set<uint64_t> offsets;
  for (uint32_t s = 0; s < 10; ++s) {
    std::optional<uint64_t> at = area.Place(s, 1000, {}, Oracle(next));
    ASSERT_TRUE(at.has_value()) << s;
    EXPECT_EQ(*at % ResidentArea::kAlign, 0u);
    EXPECT_LE(*at + 1024, area.capacity());
    EXPECT_TRUE(offsets.insert(*at).second) << "offset reused while resident: " << *at;
    EXPECT_EQ(area.Find(s, 1000), at);
  }
  EXPECT_EQ(area.size(), 10u);
  EXPECT_EQ(area.resident_bytes(), 10000u);
  EXPECT_FALSE(area.Find(3, 999).has_value()) << "a different size is a different sample form";
  EXPECT_FALSE(area.Find(42, 1000).has_value());
  EXPECT_FALSE(area.Place(3, 1000, {}, Oracle(next)).has_value()) << "already resident";
}

TEST(ResidentAreaTest, EvictsTheFurthestNextUseAndSparesSamplesInUse) {
  ResidentArea area(4 * 1024, 4 * 1024);  // four blocks of 1 KiB
  std::map<uint32_t, double> next = {{0, 5.0}, {1, 1.0}, {2, 9.0}, {3, 2.0}};
  for (uint32_t s = 0; s < 4; ++s) ASSERT_TRUE(area.Place(s, 1024, {}, Oracle(next)));
  // Full: a fifth sample evicts a quarter of the 4 candidates (one), the furthest next use: 2.
  ASSERT_TRUE(area.Place(4, 1024, {}, Oracle(next)));
  EXPECT_FALSE(area.Find(2, 1024).has_value());
  EXPECT_TRUE(area.Find(0, 1024) && area.Find(1, 1024) && area.Find(3, 1024));
  EXPECT_EQ(area.evictions(), 1u);
  // Sample 4 has no next use (never again) but is in use by the batch being built: 0 goes.
  ASSERT_TRUE(area.Place(5, 1024, {4}, Oracle(next)));
  EXPECT_TRUE(area.Find(4, 1024).has_value());
  EXPECT_FALSE(area.Find(0, 1024).has_value());
  // Every block in use: no room, nothing evicted.
  EXPECT_FALSE(area.Place(6, 1024, {1, 3, 4, 5}, Oracle(next)).has_value());
  EXPECT_EQ(area.size(), 4u);
}

TEST(ResidentAreaTest, SizeClassesShareTheAreaAndEraseFrees) {
  ResidentArea area(8 * 1024, 2048);
  std::map<uint32_t, double> next;
  for (uint32_t s = 0; s < 4; ++s) ASSERT_TRUE(area.Place(s, 700, {}, Oracle(next)));  // 768
  ASSERT_TRUE(area.Place(100, 3000, {}, Oracle(next)));  // 3072: a chunk of its own
  EXPECT_LE(area.carved_bytes(), area.capacity());
  area.Erase(100);
  EXPECT_FALSE(area.Find(100, 3000).has_value());
  EXPECT_TRUE(area.Place(101, 3000, {}, Oracle(next)).has_value()) << "the freed block is reused";
  EXPECT_FALSE(area.Place(7, 9000, {}, Oracle(next)).has_value()) << "larger than the area";
}

TEST(ResidentAreaTest, ChurnKeepsBlocksDisjoint) {
  ResidentArea area(64 * 1024, 16 * 1024);
  std::map<uint32_t, double> next;
  for (uint32_t s = 0; s < 5000; ++s) {
    next[s] = static_cast<double>((s * 7919) % 1000);
    (void)area.Place(s, 256 + (s % 3) * 1024, {}, Oracle(next));
    ASSERT_LE(area.carved_bytes(), area.capacity());
  }
  // Every resident sample's block is disjoint from every other's.
  std::map<uint64_t, uint64_t> spans;
  for (uint32_t s = 0; s < 5000; ++s) {
    const uint64_t bytes = 256 + (s % 3) * 1024;
    if (auto at = area.Find(s, bytes)) spans[*at] = bytes;
  }
  EXPECT_EQ(spans.size(), area.size());
  uint64_t end = 0;
  for (const auto& [at, bytes] : spans) {
    EXPECT_GE(at, end);
    end = at + bytes;
  }
  EXPECT_LE(end, area.capacity());
  EXPECT_GT(area.evictions(), 0u);
}

}  // namespace
}  // namespace carpool
