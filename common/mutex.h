// Mutex: std::mutex as a capability the thread-safety analysis checks (carpool/
// thread_annotations.h), and MutexLock, its scoped lock. Waits on a std::condition_variable go
// through the Mutex, which must be held. Thread-safe.
#ifndef CARPOOL_COMMON_MUTEX_H_
#define CARPOOL_COMMON_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/thread_annotations.h"

namespace carpool {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // std::mutex cannot tell its owner; this only tells the analysis the caller holds it.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

  // Waits for a notification on `cv` (or a spurious wakeup), released meanwhile; held again on
  // return.
  void Wait(std::condition_variable& cv) REQUIRES(this) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    cv.wait(lock);
    lock.release();
  }
  // Waits until `ready()` is true. `ready` runs with the mutex held: annotate a lambda that
  // reads guarded state REQUIRES(mu), which the analysis cannot check through the call here.
  template <class Predicate>
  void Wait(std::condition_variable& cv, Predicate ready) REQUIRES(this) {
    while (!CallHeld(ready)) Wait(cv);
  }
  // As Wait, for at most `timeout`; returns ready() (false: timed out).
  template <class Rep, class Period, class Predicate>
  bool WaitFor(std::condition_variable& cv, std::chrono::duration<Rep, Period> timeout,
               Predicate ready) REQUIRES(this) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!CallHeld(ready)) {
      std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
      const std::cv_status status = cv.wait_until(lock, deadline);
      lock.release();
      if (status == std::cv_status::timeout) return CallHeld(ready);
    }
    return true;
  }

 private:
  // The predicate's own REQUIRES names the caller's Mutex, which the analysis cannot match with
  // `this` here; callers of Wait and WaitFor are checked to hold it.
  template <class Predicate>
  bool CallHeld(Predicate& ready) REQUIRES(this) NO_THREAD_SAFETY_ANALYSIS {
    return ready();
  }

  std::mutex mu_;
};

// Holds a Mutex for its scope, as std::lock_guard; Unlock and Lock release and retake it early.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_.Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    mu_.Unlock();
    held_ = false;
  }
  void Lock() ACQUIRE() {
    mu_.Lock();
    held_ = true;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

}  // namespace carpool

#endif  // CARPOOL_COMMON_MUTEX_H_
