// PlanUploadRuns: how to copy many host byte ranges (a batch's JPEGs) to one device buffer with
// few copies: ranges that touch, overlap or lie less than a page apart become one run, copied
// whole (the bytes between them included: they lie in pages the two ranges already occupy, so
// reading them cannot fault). Pure: no CUDA, so it is tested on every machine.
// GpuAssembler::Plan::Finish merges only exactly adjacent samples, since its staging keeps each
// sample aligned for the kernel; here the device copy keeps the host layout, gaps included.
#ifndef CARPOOL_SERVER_GPU_UPLOAD_RUNS_H_
#define CARPOOL_SERVER_GPU_UPLOAD_RUNS_H_

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

namespace carpool::gpu {

struct UploadRun {
  uintptr_t begin = 0, end = 0;  // host addresses, [begin, end)
  uint64_t offset = 0;           // where the run starts in the device buffer
};

struct UploadPlan {
  std::vector<UploadRun> runs;  // ascending by address, offsets back to back
  std::vector<uint64_t> at;     // range i's offset in the device buffer
  uint64_t bytes = 0;           // the device buffer's size needed
};

// Below the smallest page size (4 KiB): such a gap never spans a page that neither range touches.
inline constexpr uintptr_t kUploadMaxGap = 4095;

// O(n log n) in the ranges.
inline UploadPlan PlanUploadRuns(std::span<const std::span<const uint8_t>> ranges) {
  const size_t n = ranges.size();
  auto begin = [&](size_t i) { return reinterpret_cast<uintptr_t>(ranges[i].data()); };
  auto end = [&](size_t i) { return begin(i) + ranges[i].size(); };
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return begin(a) < begin(b); });
  UploadPlan plan;
  plan.at.resize(n);
  std::vector<size_t> run_of(n);
  for (size_t i : order) {
    // An empty range owns no byte, not even at its address: it may neither start a run nor
    // bridge two (its offset is 0; nothing is read through it).
    if (ranges[i].empty()) continue;
    if (plan.runs.empty() || begin(i) > plan.runs.back().end + kUploadMaxGap) {
      plan.runs.push_back({begin(i), end(i), plan.bytes});
    } else {
      plan.bytes -= plan.runs.back().end - plan.runs.back().begin;
      plan.runs.back().end = std::max(plan.runs.back().end, end(i));
    }
    plan.bytes += plan.runs.back().end - plan.runs.back().begin;
    run_of[i] = plan.runs.size() - 1;
  }
  for (size_t i = 0; i < n; ++i) {
    if (ranges[i].empty()) continue;  // at[i] stays 0
    const UploadRun& r = plan.runs[run_of[i]];
    plan.at[i] = r.offset + (begin(i) - r.begin);
  }
  return plan;
}

}  // namespace carpool::gpu

#endif  // CARPOOL_SERVER_GPU_UPLOAD_RUNS_H_
