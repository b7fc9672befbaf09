#include "server/gpu/upload_runs.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace carpool::gpu {
namespace {

// Copies each run out of host memory as the decoder would, then reads every range back at its
// offset: the bytes must be the range's own.
void ExpectEachRangeReadsBack(std::span<const std::span<const uint8_t>> ranges,
                              const UploadPlan& plan) {
  std::vector<uint8_t> device(plan.bytes, 0xEE);
  uint64_t next = 0;
  for (const UploadRun& r : plan.runs) {
    ASSERT_EQ(r.offset, next) << "runs lie back to back";
    ASSERT_LT(r.begin, r.end);
    std::memcpy(device.data() + r.offset, reinterpret_cast<const void*>(r.begin), r.end - r.begin);
    next += r.end - r.begin;
  }
  EXPECT_EQ(next, plan.bytes);
  ASSERT_EQ(plan.at.size(), ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    ASSERT_LE(plan.at[i] + ranges[i].size(), plan.bytes);
    EXPECT_EQ(0, std::memcmp(device.data() + plan.at[i], ranges[i].data(), ranges[i].size()))
        << "range " << i;
  }
}

std::vector<uint8_t> Pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + 7);
  return v;
}

TEST(UploadRunsTest, RangesBackToBackAreOneCopy) {
  const std::vector<uint8_t> segment = Pattern(10000);
  const uint8_t* s = segment.data();
  // Out of order, as a build's samples may be.
  const std::vector<std::span<const uint8_t>> ranges = {
      {s + 3000, 2000}, {s, 1000}, {s + 1000, 2000}, {s + 5000, 5000}};
  const UploadPlan plan = PlanUploadRuns(ranges);
  ASSERT_EQ(plan.runs.size(), 1u);
  EXPECT_EQ(plan.bytes, 10000u);
  EXPECT_EQ(plan.at[1], 0u);
  EXPECT_EQ(plan.at[0], 3000u);
  ExpectEachRangeReadsBack(ranges, plan);
}

TEST(UploadRunsTest, AGapUnderAPageIsCopiedAlongAndALargerOneSplits) {
  const std::vector<uint8_t> segment = Pattern(40000);
  const uint8_t* s = segment.data();
  const std::vector<std::span<const uint8_t>> ranges = {
      {s, 1000},
      {s + 1000 + kUploadMaxGap, 500},          // the largest gap still merged
      {s + 1500 + kUploadMaxGap + 4096, 700}};  // a page apart: its own run
  const UploadPlan plan = PlanUploadRuns(ranges);
  ASSERT_EQ(plan.runs.size(), 2u);
  EXPECT_EQ(plan.bytes, 1500u + kUploadMaxGap + 700u);
  ExpectEachRangeReadsBack(ranges, plan);
}

TEST(UploadRunsTest, RepeatedAndOverlappingRangesShareTheirBytes) {
  const std::vector<uint8_t> segment = Pattern(6000);
  const uint8_t* s = segment.data();
  const std::vector<std::span<const uint8_t>> ranges = {
      {s + 100, 3000}, {s + 100, 3000}, {s + 2000, 500}, {s + 2500, 3000}, {s + 200, 0}};
  const UploadPlan plan = PlanUploadRuns(ranges);
  ASSERT_EQ(plan.runs.size(), 1u);
  EXPECT_EQ(plan.bytes, 5400u);  // [100, 5500)
  EXPECT_EQ(plan.at[0], plan.at[1]);
  ExpectEachRangeReadsBack(ranges, plan);
}

TEST(UploadRunsTest, RangesOfSeparateAllocationsReadBack) {
  const std::vector<uint8_t> a = Pattern(3000), b = Pattern(5000);
  const std::vector<std::span<const uint8_t>> ranges = {{b.data() + 10, 4000}, {a.data(), 3000}};
  const UploadPlan plan = PlanUploadRuns(ranges);
  EXPECT_GE(plan.runs.size(), 1u);
  ExpectEachRangeReadsBack(ranges, plan);
  EXPECT_TRUE(PlanUploadRuns({}).runs.empty());
}

}  // namespace
}  // namespace carpool::gpu
