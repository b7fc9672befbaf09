// carpool::FairMutex (common/fair_mutex.h): granted in the order Lock was called, a holder that
// locks again queues behind the waiters, and mutual exclusion under contention.
#include "common/fair_mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace carpool {
namespace {

// Sleeps until `n` callers wait in mu.Lock; fails the test after 10 s instead of hanging.
void AwaitWaiters(const FairMutex& mu, uint64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (mu.Waiting() < n) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "never " << n << " waiters";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(FairMutexTest, GrantsInTheOrderLockWasCalled) {
  FairMutex mu;
  std::vector<int> order;  // written only by holders of mu
  mu.Lock();
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      FairMutexLock lock(mu);
      order.push_back(i);
    });
    AwaitWaiters(mu, static_cast<uint64_t>(i) + 1);  // thread i has its ticket before i + 1 starts
  }
  mu.Unlock();
  for (auto& t : threads) t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(mu.Waiting(), 0u);
}

TEST(FairMutexTest, AHolderThatLocksAgainQueuesBehindTheWaiters) {
  FairMutex mu;
  std::vector<char> order;
  mu.Lock();
  std::thread waiter([&] {
    FairMutexLock lock(mu);
    order.push_back('w');
  });
  AwaitWaiters(mu, 1);
  mu.Unlock();
  mu.Lock();  // a std::mutex could be taken again here, ahead of the sleeping waiter
  order.push_back('h');
  mu.Unlock();
  waiter.join();
  EXPECT_EQ(order, (std::vector<char>{'w', 'h'}));
}

TEST(FairMutexTest, ExcludesUnderContention) {
  FairMutex mu;
  long counter = 0;  // not atomic: only the lock keeps the increments whole
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 5000; ++i) {
        FairMutexLock lock(mu);
        counter = counter + 1;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, 20000);
}

}  // namespace
}  // namespace carpool
