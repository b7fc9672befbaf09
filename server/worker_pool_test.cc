#include "server/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

namespace carpool {
namespace {

// Polls `pool` until its load equals (busy, queued), or 10 s pass.
::testing::AssertionResult LoadBecomes(WorkerPool& pool, size_t busy, size_t queued) {
  WorkerPool::Load load;
  for (int i = 0; i < 10000; ++i) {
    load = pool.CurrentLoad();
    if (load.busy == busy && load.queued == queued) return ::testing::AssertionSuccess();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return ::testing::AssertionFailure() << "busy " << load.busy << " queued " << load.queued
                                       << ", expected " << busy << " and " << queued;
}

TEST(WorkerPoolTest, LoadCountsRunningAndWaitingTasks) {
  WorkerPool pool(2, [] {});
  EXPECT_TRUE(LoadBecomes(pool, 0, 0));
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::atomic<int> done{0};
  for (int i = 0; i < 5; ++i) {
    pool.Post(WorkerPool::Priority::kNormal, [open, &done] {
      open.wait();
      ++done;
    });
  }
  EXPECT_TRUE(LoadBecomes(pool, 2, 3));  // two threads blocked in tasks, three tasks waiting
  gate.set_value();
  EXPECT_TRUE(LoadBecomes(pool, 0, 0));
  EXPECT_EQ(done.load(), 5);
}

TEST(WorkerPoolTest, HighPriorityRunsFirst) {
  WorkerPool pool(1, [] {});
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::vector<int> order;  // written by the one worker only
  pool.Post(WorkerPool::Priority::kNormal, [open] { open.wait(); });
  ASSERT_TRUE(LoadBecomes(pool, 1, 0));
  pool.Post(WorkerPool::Priority::kNormal, [&order] { order.push_back(1); });
  pool.Post(WorkerPool::Priority::kHigh, [&order] { order.push_back(2); });
  gate.set_value();
  ASSERT_TRUE(LoadBecomes(pool, 0, 0));
  EXPECT_EQ(order, (std::vector<int>{2, 1}));
}

}  // namespace
}  // namespace carpool
