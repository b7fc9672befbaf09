#include "server/decode_split.h"

#include <algorithm>
#include <cmath>

namespace carpool {

HelperThreads::HelperThreads(size_t threads) {
  threads_.reserve(std::max<size_t>(threads, 1));
  for (size_t i = 0; i < std::max<size_t>(threads, 1); ++i)
    threads_.emplace_back([this] { Run(); });
}

HelperThreads::~HelperThreads() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  ready_.notify_all();
  for (std::thread& t : threads_) t.join();
}

std::shared_ptr<HelperThreads::Batch> HelperThreads::Start(size_t count,
                                                           std::function<void(size_t)> task) {
  auto batch = std::make_shared<Batch>(count, std::move(task));
  if (count == 0) return batch;
  {
    MutexLock lock(mu_);
    queue_.push_back(batch);
  }
  ready_.notify_all();
  return batch;
}

void HelperThreads::Run() {
  for (;;) {
    std::shared_ptr<Batch> batch;
    {
      MutexLock lock(mu_);
      mu_.Wait(ready_, [this]() REQUIRES(mu_) { return stop_ || !queue_.empty(); });
      if (stop_) return;
      batch = queue_.front();
      if (batch->Exhausted()) {  // every task taken: the next batch, if any
        queue_.pop_front();
        continue;
      }
    }
    batch->Drain();
  }
}

void HelperThreads::Batch::Drain() {
  for (size_t i; (i = next_.fetch_add(1)) < count_;) {
    task_(i);
    MutexLock lock(mu_);
    if (++done_ == count_) done_cv_.notify_all();
  }
}

void HelperThreads::Batch::Wait() {
  Drain();
  MutexLock lock(mu_);
  mu_.Wait(done_cv_, [this]() REQUIRES(mu_) { return done_ == count_; });
}

size_t DecodeSplit::CpuShare(size_t images) const {
  if (threads_ == 0 || images < 2) return 0;
  // Before both rates are known: an eighth, to measure the CPU's.
  const double share = gpu_rate_ > 0 && cpu_rate_ > 0 ? cpu_rate_ / (gpu_rate_ + cpu_rate_) : 0.125;
  const auto k = static_cast<size_t>(std::lround(share * static_cast<double>(images)));
  return std::clamp<size_t>(k, 1, images - 1);
}

void DecodeSplit::Record(size_t gpu_images, double gpu_seconds, size_t cpu_images,
                         double task_seconds) {
  auto blend = [](double* rate, double latest) {
    *rate = *rate > 0 ? (1 - kDecay) * *rate + kDecay * latest : latest;
  };
  if (gpu_images > 0 && gpu_seconds > 0)
    blend(&gpu_rate_, static_cast<double>(gpu_images) / gpu_seconds);
  // All threads busy at once: threads / seconds per task.
  if (cpu_images > 0 && task_seconds > 0) {
    blend(&cpu_rate_, static_cast<double>(threads_) / task_seconds);
  }
}

}  // namespace carpool
