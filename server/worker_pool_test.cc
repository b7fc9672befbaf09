#include "server/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

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
    pool.Post(WorkerPool::Queue::kFifo, [open, &done] {
      open.wait();
      ++done;
    });
  }
  EXPECT_TRUE(LoadBecomes(pool, 2, 3));  // two threads blocked in tasks, three tasks waiting
  gate.set_value();
  EXPECT_TRUE(LoadBecomes(pool, 0, 0));
  EXPECT_EQ(done.load(), 5);
}

// Holds a one-thread pool's worker until the tasks posted meanwhile are all queued, then runs
// them and returns the order in which they ran (each pushes its label).
template <typename PostAll>
std::vector<int> RunOrder(PostAll post_all) {
  WorkerPool pool(1, [] {});
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::vector<int> order;  // written by the one worker only
  pool.Post(WorkerPool::Queue::kFifo, [open] { open.wait(); });
  EXPECT_TRUE(LoadBecomes(pool, 1, 0));
  post_all(pool, order);
  gate.set_value();
  EXPECT_TRUE(LoadBecomes(pool, 0, 0));
  return order;
}

TEST(WorkerPoolTest, TheOrderedQueueStartsFirst) {
  EXPECT_EQ(RunOrder([](WorkerPool& pool, std::vector<int>& order) {
              pool.Post(WorkerPool::Queue::kFifo, [&order] { order.push_back(1); });
              pool.Post(WorkerPool::Queue::kOrdered, [&order] { order.push_back(2); });
            }),
            (std::vector<int>{2, 1}));
}

// Preparations of samples few jobs need must not wait for an assembly queue that never empties.
TEST(WorkerPoolTest, WhileBothQueuesHoldTasksTheyTakeTurns) {
  EXPECT_EQ(RunOrder([](WorkerPool& pool, std::vector<int>& order) {
              for (int i = 0; i < 3; ++i) {
                pool.Post(WorkerPool::Queue::kOrdered, [&order, i] { order.push_back(i); });
              }
              for (int i = 10; i < 12; ++i) {
                pool.Post(WorkerPool::Queue::kFifo, [&order, i] { order.push_back(i); });
              }
            }),
            (std::vector<int>{0, 10, 1, 11, 2}));
}

TEST(WorkerPoolTest, OrderedTasksStartInOrderOfTheirTagAndFifoAmongEqualTags) {
  EXPECT_EQ(RunOrder([](WorkerPool& pool, std::vector<int>& order) {
              const std::vector<std::pair<int, uint64_t>> posted = {
                  {1, 512}, {2, 16}, {3, 512}, {4, 0}, {5, 16}};
              for (const auto& entry : posted) {  // clang 14 cannot capture a structured binding
                const int label = entry.first;
                pool.Post(
                    WorkerPool::Queue::kOrdered, [&order, label] { order.push_back(label); },
                    entry.second);
              }
            }),
            (std::vector<int>{4, 2, 5, 1, 3}));
}

// Issue 21: a throwing task used to end the server in std::terminate. Now the pool drops it,
// and the same thread runs the tasks after it.
TEST(WorkerPoolTest, ATaskThatThrowsIsDroppedAndTheThreadRunsOn) {
  WorkerPool pool(1, [] {});
  std::promise<void> ran;
  pool.Post(WorkerPool::Queue::kFifo, [] { throw std::bad_alloc(); });
  pool.Post(WorkerPool::Queue::kOrdered, [] { throw 42; });
  pool.Post(WorkerPool::Queue::kFifo, [&ran] { ran.set_value(); });
  ASSERT_EQ(ran.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(LoadBecomes(pool, 0, 0));
}

TEST(WorkerPoolTest, ParallelForRunsEveryItemOnceWithIdleThreadsHelping) {
  WorkerPool pool(4, [] {});
  constexpr size_t kItems = 400;
  std::vector<std::atomic<int>> runs(kItems);
  Mutex mu;
  std::set<std::thread::id> threads;
  pool.ParallelFor(kItems, 3, [&](size_t i) {
    ++runs[i];
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    MutexLock lock(mu);
    threads.insert(std::this_thread::get_id());
  });
  for (size_t i = 0; i < kItems; ++i) ASSERT_EQ(runs[i].load(), 1) << "item " << i;
  MutexLock lock(mu);
  EXPECT_GT(threads.size(), 1u) << "no helper took an item in 80 ms of work";
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 1u) << "the caller works too";
}

// A worker of a one-thread pool calls it: its helper cannot start until the call returns, so the
// caller must do every item itself and not wait for the helper; the helper then finds nothing.
TEST(WorkerPoolTest, ParallelForFromTheOnlyWorkerDoesNotWaitForItsHelpers) {
  WorkerPool pool(1, [] {});
  std::promise<int> result;
  pool.Post(WorkerPool::Queue::kOrdered, [&pool, &result] {
    int sum = 0;  // items run on this thread only: no race
    pool.ParallelFor(10, 5, [&sum](size_t i) { sum += static_cast<int>(i); });
    result.set_value(sum);
  });
  std::future<int> f = result.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "deadlock";
  EXPECT_EQ(f.get(), 45);
  EXPECT_TRUE(LoadBecomes(pool, 0, 0)) << "the late helper ran and returned";
}

TEST(WorkerPoolTest, ParallelForRethrowsAnItemsExceptionAfterTheRestRan) {
  WorkerPool pool(2, [] {});
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.ParallelFor(50, 1,
                                [&ran](size_t i) {
                                  ++ran;
                                  if (i == 7) throw std::runtime_error("item 7");
                                }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 50);
  pool.ParallelFor(0, 4, [](size_t) { FAIL() << "no item"; });
}

}  // namespace
}  // namespace carpool
