// CpuShare: the server's CPU decodes a share of a build whose JPEGs a job's process decodes on
// its GPU (docs/gpu.md, "Decoding in the jobs' processes", item 11). While one job has the GPU,
// its build waits for the job's nvJPEG, which makes host round trips per image; a few of the
// server's cores decoding the last JPEGs of each build to the same decode=gpu pixels
// (PrepareGpuPixelsOnCpu: bit-identical to the JPEG engines) shorten that wait.
//
// The share adapts: a build reports whether its CPU part was done when the job's answer came.
// Done first, the next builds keep a little more; the job first, they keep less. So the CPU
// part tracks the job's decode rate without knowing either rate.
//
// Thread-safe. Owns `threads` threads; every task's error (a throw included) comes back to the
// build that started it.
#ifndef CARPOOL_SERVER_CPU_SHARE_H_
#define CARPOOL_SERVER_CPU_SHARE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "carpool/status.h"
#include "common/mutex.h"
#include "datasets/prepare_spec.h"
#include "server/prepare.h"

namespace carpool {

class CpuShare {
 public:
  // One build's CPU part: results[i] for encoded[i], once Wait returns.
  class Part {
   public:
    bool Done() const;
    // Blocks until every JPEG of the part is decoded or has failed.
    void Wait() const;
    // REQUIRES: Wait returned (the results are written before it does).
    const std::vector<Result<PreparedImage>>& results() const { return results_; }

   private:
    friend class CpuShare;
    PrepareSpec spec_;
    std::vector<std::span<const uint8_t>> encoded_;
    std::vector<Result<PreparedImage>> results_;  // slot i written by the task of JPEG i only
    mutable Mutex mu_;
    mutable std::condition_variable done_cv_;
    size_t left_ GUARDED_BY(mu_) = 0;
  };

  // The share starts at `initial` of a build and stays within [0, max_fraction].
  struct Options {
    uint32_t threads = 0;  // 0: off (Keep returns 0)
    double initial = 0.05, step_up = 0.01, step_down = 0.02, max_fraction = 0.5;
  };

  explicit CpuShare(const Options& options);
  ~CpuShare();  // finishes the queued tasks, then joins
  CpuShare(const CpuShare&) = delete;
  CpuShare& operator=(const CpuShare&) = delete;

  uint32_t threads() const { return static_cast<uint32_t>(threads_.size()); }
  // How many of a build's n decodes the CPU takes now (the rest go to the job). O(1).
  size_t Keep(size_t n) const;
  // Queues the decode of each JPEG (views that must outlive the part). O(n).
  std::shared_ptr<const Part> Start(const PrepareSpec& spec,
                                    std::vector<std::span<const uint8_t>> encoded);
  // After the job's answer: whether the part was already done then. Adapts Keep. O(1).
  void Report(bool cpu_done_first);

  double fraction() const;
  uint64_t decoded() const;     // JPEGs the CPU decoded (failures excluded)
  double busy_seconds() const;  // the threads' time decoding, all together

 private:
  void Run();

  const Options options_;
  mutable Mutex mu_;
  std::condition_variable work_cv_;
  std::deque<std::pair<std::shared_ptr<Part>, size_t>> queue_ GUARDED_BY(mu_);  // (part, index)
  bool stopping_ GUARDED_BY(mu_) = false;
  double fraction_ GUARDED_BY(mu_);
  uint64_t decoded_ GUARDED_BY(mu_) = 0;
  double busy_seconds_ GUARDED_BY(mu_) = 0;
  double fixed_ = -1;  // CARPOOL_CPU_SHARE_FIXED (diagnostic): a share that never adapts
  std::vector<std::thread> threads_;
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_CPU_SHARE_H_
