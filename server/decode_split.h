// The CPU's share of a GPU decode. Beside a training process the GPU decodes a build's JPEGs in
// time slices, while most cores sit idle; the CPU gives the JPEG engines' pixels exactly
// (PrepareGpuPixelsOnCpu), so a build can hand part of its images to the CPU and both finish
// together.
//   HelperThreads: a fixed set of threads that run a batch of tasks a caller waits for, the
//     caller joining in (DALI's thread pool, without exceptions: tasks report through their
//     own results).
//   DecodeSplit: how many of a build's images the CPU takes, from the rates both sides showed.
// HelperThreads is thread-safe; DecodeSplit is thread-compatible (GpuService's build lock).
#ifndef CARPOOL_SERVER_DECODE_SPLIT_H_
#define CARPOOL_SERVER_DECODE_SPLIT_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace carpool {

class HelperThreads {
 public:
  class Batch;

  explicit HelperThreads(size_t threads);  // >= 1
  ~HelperThreads();  // joins; batches are finished by their Wait, never dropped
  HelperThreads(const HelperThreads&) = delete;
  HelperThreads& operator=(const HelperThreads&) = delete;

  size_t size() const { return threads_.size(); }

  // Starts task(0) ... task(count - 1) on the threads and returns at once; the caller must call
  // Wait on the result before `task`'s captures go. O(1).
  std::shared_ptr<Batch> Start(size_t count, std::function<void(size_t)> task);

  class Batch {
   public:
    Batch(size_t count, std::function<void(size_t)> task) : task_(std::move(task)), count_(count) {}
    // Runs the tasks no thread has taken, then waits for the rest. Idempotent.
    void Wait();

   private:
    friend class HelperThreads;
    bool Exhausted() const { return next_.load() >= count_; }
    void Drain();  // runs tasks until none is left to take

    std::function<void(size_t)> task_;
    const size_t count_;
    std::atomic<size_t> next_{0};
    Mutex mu_;
    std::condition_variable done_cv_;
    size_t done_ GUARDED_BY(mu_) = 0;
  };

 private:
  void Run();

  Mutex mu_;
  std::condition_variable ready_;
  std::deque<std::shared_ptr<Batch>> queue_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

class DecodeSplit {
 public:
  explicit DecodeSplit(size_t cpu_threads) : threads_(cpu_threads) {}

  // Of `images` the GPU could decode in a build, how many the CPU takes: so that, at the rates
  // seen so far, both sides take the same time. 0 without threads or with under 2 images; at least
  // 1 and at most images - 1 otherwise, so that both rates stay measured. O(1).
  size_t CpuShare(size_t images) const;

  // After a build: the GPU side decoded gpu_images in gpu_seconds (wall time), and the CPU's
  // tasks took task_seconds each on average for cpu_images. Decayed averages. O(1).
  void Record(size_t gpu_images, double gpu_seconds, size_t cpu_images, double task_seconds);

  double gpu_rate() const { return gpu_rate_; }  // images a second; 0 before the first build
  double cpu_rate() const { return cpu_rate_; }  // of every thread together; 0 likewise
  size_t threads() const { return threads_; }

 private:
  static constexpr double kDecay = 0.25;  // weight of the latest build
  size_t threads_;
  double gpu_rate_ = 0, cpu_rate_ = 0;
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_DECODE_SPLIT_H_
