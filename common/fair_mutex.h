// FairMutex: a mutex that grants itself in the order Lock was called (a ticket lock), as a
// capability the thread-safety analysis checks; FairMutexLock, its scoped lock. std::mutex lets a
// thread that arrives as the holder leaves take it ahead of threads already asleep on it, so
// under steady contention for a long critical section some callers can win far more often than
// others. Use it where the order of waiters is the fairness (one GPU's batch builds, which
// several jobs wait for). Thread-safe.
#ifndef CARPOOL_COMMON_FAIR_MUTEX_H_
#define CARPOOL_COMMON_FAIR_MUTEX_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "common/thread_annotations.h"

namespace carpool {

class CAPABILITY("mutex") FairMutex {
 public:
  FairMutex() = default;
  FairMutex(const FairMutex&) = delete;
  FairMutex& operator=(const FairMutex&) = delete;

  // Waits for the callers before this one, then holds it. O(waiters) wake-ups per Unlock.
  void Lock() ACQUIRE() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t ticket = next_ticket_++;
    turn_.wait(lock, [&] { return serving_ == ticket; });
  }
  void Unlock() RELEASE() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++serving_;
    }
    turn_.notify_all();  // only the next ticket proceeds; the others sleep again
  }
  // Callers waiting in Lock now (for tests and stats).
  uint64_t Waiting() const {
    std::lock_guard<std::mutex> lock(mu_);
    return next_ticket_ == serving_ ? 0 : next_ticket_ - serving_ - 1;  // less the holder
  }

 private:
  mutable std::mutex mu_;  // guards the tickets only, never held by a FairMutex holder
  std::condition_variable turn_;
  uint64_t next_ticket_ = 0;  // the ticket the next Lock takes
  uint64_t serving_ = 0;      // the ticket that holds it, or next_ticket_ when free
};

// Holds a FairMutex for its scope, as std::lock_guard.
class SCOPED_CAPABILITY FairMutexLock {
 public:
  explicit FairMutexLock(FairMutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~FairMutexLock() RELEASE() { mu_.Unlock(); }
  FairMutexLock(const FairMutexLock&) = delete;
  FairMutexLock& operator=(const FairMutexLock&) = delete;

 private:
  FairMutex& mu_;
};

}  // namespace carpool

#endif  // CARPOOL_COMMON_FAIR_MUTEX_H_
