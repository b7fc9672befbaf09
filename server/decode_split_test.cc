#include "server/decode_split.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

namespace carpool {
namespace {

TEST(HelperThreadsTest, RunsEveryTaskOnceAndWaitReturnsAfterTheLast) {
  HelperThreads helpers(3);
  for (size_t count : {0, 1, 7, 200}) {
    std::vector<std::atomic<int>> ran(count);
    std::atomic<size_t> finished{0};
    auto batch = helpers.Start(count, [&](size_t i) {
      std::this_thread::sleep_for(std::chrono::microseconds(50 * (i % 3)));
      ran[i].fetch_add(1);
      finished.fetch_add(1);
    });
    batch->Wait();
    EXPECT_EQ(finished.load(), count);  // none still running after Wait
    for (size_t i = 0; i < count; ++i) EXPECT_EQ(ran[i].load(), 1) << "task " << i;
    batch->Wait();  // idempotent
  }
}

TEST(HelperThreadsTest, TasksRunOnTheHelpersWhileTheCallerWorks) {
  HelperThreads helpers(2);
  std::mutex mu;
  std::set<std::thread::id> runners;
  auto batch = helpers.Start(4, [&](size_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::lock_guard<std::mutex> lock(mu);
    runners.insert(std::this_thread::get_id());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the caller's own work
  batch->Wait();
  EXPECT_EQ(runners.count(std::this_thread::get_id()), 0u) << "the helpers had time for all";
  EXPECT_EQ(runners.size(), 2u);
}

TEST(HelperThreadsTest, ConcurrentBatchesFromSeveralCallersAllFinish) {
  HelperThreads helpers(2);
  std::atomic<int> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round) {
        helpers.Start(5, [&](size_t) { total.fetch_add(1); })->Wait();
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 5);
}

TEST(DecodeSplitTest, NoThreadsNoShare) {
  DecodeSplit split(0);
  EXPECT_EQ(split.CpuShare(256), 0u);
}

TEST(DecodeSplitTest, ProbesWithAnEighthThenBalancesTheRates) {
  DecodeSplit split(8);
  EXPECT_EQ(split.CpuShare(256), 32u);  // no rates yet
  EXPECT_EQ(split.CpuShare(1), 0u);
  EXPECT_EQ(split.CpuShare(2), 1u);
  // GPU: 224 images in 24 ms (9,333/s); CPU: 3 ms a task on 8 threads (2,667/s).
  split.Record(224, 0.024, 32, 0.003);
  EXPECT_NEAR(split.gpu_rate(), 9333.3, 0.5);
  EXPECT_NEAR(split.cpu_rate(), 2666.7, 0.5);
  // Both finish together when the CPU takes 2,667 / (9,333 + 2,667) of the images.
  EXPECT_EQ(split.CpuShare(240), 53u);
  const size_t k = split.CpuShare(240);
  EXPECT_NEAR((240.0 - k) / split.gpu_rate(), k / split.cpu_rate(), 0.0005);
}

TEST(DecodeSplitTest, FollowsASlowerGpuAndNeverTakesEverything) {
  DecodeSplit split(4);
  split.Record(200, 0.010, 20, 0.002);  // GPU 20,000/s, CPU 2,000/s
  const size_t before = split.CpuShare(256);
  for (int i = 0; i < 40; ++i) split.Record(200, 0.200, 20, 0.002);  // GPU now 1,000/s
  EXPECT_GT(split.CpuShare(256), before);
  EXPECT_NEAR(split.gpu_rate(), 1000, 1);
  EXPECT_EQ(split.CpuShare(256), 171u);                            // 2,000 / 3,000 of 256
  for (int i = 0; i < 40; ++i) split.Record(1, 10.0, 20, 0.0001);  // the GPU all but stopped
  EXPECT_EQ(split.CpuShare(256), 255u);  // the GPU keeps one, so its rate stays measured
}

}  // namespace
}  // namespace carpool
