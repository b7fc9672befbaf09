// carpool::Mutex (common/mutex.h): waits through the held mutex, early unlock of a
// MutexLock. The lock rules themselves are checked at compile time (scripts/clang_tsa.sh).
#include "common/mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace carpool {
namespace {

struct Flag {
  Mutex mu;
  std::condition_variable cv;
  bool set GUARDED_BY(mu) = false;

  void Set() {
    {
      MutexLock lock(mu);
      set = true;
    }
    cv.notify_all();
  }
};

TEST(MutexTest, WaitReturnsOnceThePredicateHolds) {
  Flag f;
  std::thread setter([&] { f.Set(); });
  {
    MutexLock lock(f.mu);
    f.mu.Wait(f.cv, [&]() REQUIRES(f.mu) { return f.set; });
    EXPECT_TRUE(f.set);
  }
  setter.join();
}

TEST(MutexTest, WaitForTimesOutWithThePredicateFalse) {
  Flag f;
  MutexLock lock(f.mu);
  const auto begin = std::chrono::steady_clock::now();
  EXPECT_FALSE(f.mu.WaitFor(f.cv, std::chrono::milliseconds(20),
                            [&]() REQUIRES(f.mu) { return f.set; }));
  EXPECT_GE(std::chrono::steady_clock::now() - begin, std::chrono::milliseconds(20));
}

TEST(MutexTest, WaitForReturnsTrueWhenNotified) {
  Flag f;
  std::thread setter([&] { f.Set(); });
  {
    MutexLock lock(f.mu);
    EXPECT_TRUE(f.mu.WaitFor(f.cv, std::chrono::seconds(60),
                             [&]() REQUIRES(f.mu) { return f.set; }));
  }
  setter.join();
}

TEST(MutexTest, MutexLockUnlocksEarlyAndRelocks) {
  Mutex mu;
  MutexLock lock(mu);
  lock.Unlock();
  if (mu.TryLock()) {  // released: another owner can take it
    mu.Unlock();
  } else {
    ADD_FAILURE() << "MutexLock::Unlock left the mutex held";
  }
  lock.Lock();
}  // the destructor releases the relocked mutex

}  // namespace
}  // namespace carpool
