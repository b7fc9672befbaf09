// WorkerPool: the engine's preparation and assembly threads. Two queues: assembly tasks (they
// finish deliveries a job is waiting for) run in ascending order of a tag the engine gives them
// (samples-fair queuing: a job of batch 16 waits behind as many samples as one of batch 512, not
// as many batches); preparation tasks run FIFO, fed by the engine in earliest-deadline-first order
// and kept short, so priorities stay fresh. An assembly goes first; while both queues hold tasks,
// they take turns, so neither starves.
// Thread-safe.
#ifndef CARPOOL_SERVER_WORKER_POOL_H_
#define CARPOOL_SERVER_WORKER_POOL_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <utility>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace carpool {

class WorkerPool {
 public:
  // The two queues: kOrdered (the engine's assemblies, by their samples-fair tag) and kFifo (its
  // preparations). kOrdered goes first except right after a kOrdered start that passed waiting
  // kFifo tasks: while both hold tasks they alternate, so neither starves.
  enum class Queue { kOrdered, kFifo };

  // Starts `threads` (>= 1) threads; each runs `thread_init` once before its first task.
  WorkerPool(size_t threads, std::function<void()> thread_init);
  ~WorkerPool();  // Shutdown()
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // kOrdered tasks start in ascending `order`, FIFO among equal ones; kFifo ones FIFO (`order` is
  // ignored). While both kinds are queued, they start in turns. O(log queued).
  void Post(Queue queue, std::function<void()> task, uint64_t order = 0);
  // Runs fn(i) for every i in [0, n): on the calling thread, joined by up to `helpers` kFifo tasks
  // (give it the idle threads: a busy pool's helpers would only queue). Returns when every fn has
  // returned, and rethrows the first exception one threw (the others still run). It never waits
  // on a helper that has not started: the caller claims items itself and waits only for items a
  // running helper took, and a helper that starts after the last item was taken returns at once
  // without calling fn. So any thread may call it, a worker included. O(n) calls of fn.
  void ParallelFor(size_t n, size_t helpers, std::function<void(size_t)> fn);
  // Drops the tasks not yet started, waits for running ones and joins the threads. Idempotent.
  void Shutdown();
  size_t size() const { return threads_.size(); }

  struct Load {
    size_t busy = 0;    // threads running a task
    size_t queued = 0;  // tasks waiting for a thread
  };
  Load CurrentLoad();  // O(1), takes the pool's lock

 private:
  void Run(const std::function<void()>& thread_init);

  Mutex mu_;
  std::condition_variable ready_;
  std::map<std::pair<uint64_t, uint64_t>, std::function<void()>> high_ GUARDED_BY(mu_);  // order, seq
  uint64_t high_seq_ GUARDED_BY(mu_) = 0;
  bool high_turn_taken_ GUARDED_BY(mu_) = false;  // the last start was an assembly, with both queued
  std::deque<std::function<void()>> normal_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  size_t busy_ GUARDED_BY(mu_) = 0;
  std::vector<std::thread> threads_;
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_WORKER_POOL_H_
