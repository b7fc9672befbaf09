#include "server/worker_pool.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>
#include <utility>

#include "common/log.h"

namespace carpool {

WorkerPool::WorkerPool(size_t threads, std::function<void()> thread_init) {
  if (threads == 0) threads = 1;
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) {
    threads_.emplace_back([this, thread_init] { Run(thread_init); });
  }
}

WorkerPool::~WorkerPool() { Shutdown(); }

void WorkerPool::Post(Queue queue, std::function<void()> task, uint64_t order) {
  {
    MutexLock lock(mu_);
    if (stop_) return;
    if (queue == Queue::kOrdered) {
      high_.emplace(std::pair{order, high_seq_++}, std::move(task));
    } else {
      normal_.push_back(std::move(task));
    }
  }
  ready_.notify_one();
}

void WorkerPool::Shutdown() {
  {
    MutexLock lock(mu_);
    if (stop_ && threads_.empty()) return;
    stop_ = true;
    high_.clear();
    normal_.clear();
  }
  ready_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

namespace {

// ParallelFor's shared state: helpers hold it by shared_ptr, since one may start after the call
// returned (it then finds no item left).
struct ParallelWork {
  std::function<void(size_t)> fn;
  size_t n = 0;
  std::atomic<size_t> next{0};
  Mutex mu;
  std::condition_variable all_done;
  size_t done GUARDED_BY(mu) = 0;
  std::exception_ptr error GUARDED_BY(mu);

  void Drain() {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      std::exception_ptr thrown;
      try {
        fn(i);
      } catch (...) {
        thrown = std::current_exception();
      }
      MutexLock lock(mu);
      if (thrown && !error) error = thrown;
      if (++done == n) all_done.notify_all();
    }
  }
};

}  // namespace

void WorkerPool::ParallelFor(size_t n, size_t helpers, std::function<void(size_t)> fn) {
  if (n == 0) return;
  auto work = std::make_shared<ParallelWork>();
  work->fn = std::move(fn);
  work->n = n;
  for (size_t h = 0; h < std::min(helpers, n - 1); ++h) {
    Post(Queue::kFifo, [work] { work->Drain(); });
  }
  work->Drain();
  MutexLock lock(work->mu);
  work->mu.Wait(work->all_done, [&]() REQUIRES(work->mu) { return work->done == n; });
  if (work->error) std::rethrow_exception(work->error);
}

WorkerPool::Load WorkerPool::CurrentLoad() {
  MutexLock lock(mu_);
  return {busy_, high_.size() + normal_.size()};
}

void WorkerPool::Run(const std::function<void()>& thread_init) {
  if (thread_init) thread_init();
  bool ran = false;
  for (;;) {
    std::function<void()> task;
    {
      MutexLock lock(mu_);
      if (ran) --busy_;  // the task of the previous turn is done
      ran = false;
      mu_.Wait(ready_,
               [this]() REQUIRES(mu_) { return stop_ || !high_.empty() || !normal_.empty(); });
      if (stop_) return;
      // While both queues hold tasks they alternate: strict priority starved the preparations of
      // samples that only a few jobs need (their jobs waited minutes) behind a never-empty
      // assembly queue of jobs whose samples were already cached.
      const bool take_high = !high_.empty() && (normal_.empty() || !high_turn_taken_);
      if (take_high) {
        task = std::move(high_.extract(high_.begin()).mapped());
        high_turn_taken_ = !normal_.empty();
      } else {
        task = std::move(normal_.front());
        normal_.pop_front();
        high_turn_taken_ = false;
      }
      ++busy_;
      ran = true;
    }
    // The last barrier: the engine's tasks catch their own throws and fail the jobs they serve,
    // so one reaching here is a bug; the server logs it and keeps serving the other jobs.
    try {
      task();
    } catch (const std::exception& e) {
      log::Error("a worker task threw and was dropped (a bug, please report it): {}", e.what());
    } catch (...) {
      log::Error("a worker task threw an exception of unknown type and was dropped (a bug)");
    }
  }
}

}  // namespace carpool
