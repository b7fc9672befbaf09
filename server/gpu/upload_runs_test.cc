#include "server/gpu/upload_runs.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

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

// Three pages with the middle one unmapped (PROT_NONE): a plan that copied a byte of it would
// fault. Ranges a page or more apart stay apart, and an empty range (no byte is its own, not
// even at its address) neither bridges two ranges nor makes a run.
TEST(UploadRunsTest, NoRunReadsAPageNoRangeTouches) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* mapped =
      mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  auto* m = static_cast<uint8_t*>(mapped);
  for (size_t i = 0; i < 3 * page; ++i) m[i] = static_cast<uint8_t>(i * 7 + 1);
  ASSERT_EQ(mprotect(m + page, page, PROT_NONE), 0);
  const std::vector<std::span<const uint8_t>> ranges = {
      {m + page - 96, 96},       // the last bytes before the hole
      {m + page + page / 2, 0},  // empty, inside the hole
      {m + 2 * page, 100},       // the first bytes after it
      {m + 2 * page + 200, 0}};  // empty, next to a range
  const UploadPlan plan = PlanUploadRuns(ranges);
  ASSERT_EQ(plan.runs.size(), 2u) << "a page apart, and the empty range bridges nothing";
  EXPECT_EQ(plan.bytes, 196u);
  EXPECT_EQ(plan.at[1], 0u);
  EXPECT_EQ(plan.at[3], 0u);
  ExpectEachRangeReadsBack(ranges, plan);  // faults if a run reaches into the hole
  const std::vector<std::span<const uint8_t>> empty_only = {{m + 10, 0}};
  const UploadPlan none = PlanUploadRuns(empty_only);
  EXPECT_TRUE(none.runs.empty());
  EXPECT_EQ(none.bytes, 0u);
  EXPECT_EQ(none.at[0], 0u);
  EXPECT_TRUE(PlanUploadRuns({}).runs.empty());
  ASSERT_EQ(munmap(mapped, 3 * page), 0);
}

}  // namespace
}  // namespace carpool::gpu
