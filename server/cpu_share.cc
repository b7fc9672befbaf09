#include "server/cpu_share.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>

#include "common/log.h"

namespace carpool {

bool CpuShare::Part::Done() const {
  MutexLock lock(mu_);
  return left_ == 0;
}

void CpuShare::Part::Wait() const {
  MutexLock lock(mu_);
  mu_.Wait(done_cv_, [&]() REQUIRES(mu_) { return left_ == 0; });
}

CpuShare::CpuShare(const Options& options)
    : options_(options), fraction_(std::clamp(options.initial, 0.0, options.max_fraction)) {
  if (const char* fixed = std::getenv("CARPOOL_CPU_SHARE_FIXED")) fixed_ = std::atof(fixed);
  for (uint32_t t = 0; t < options.threads; ++t) threads_.emplace_back([this] { Run(); });
}

CpuShare::~CpuShare() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  MutexLock lock(mu_);
  if (decoded_ > 0) {
    log::Info(
        "CPU share: {} JPEGs decoded in {:.2f} s of {} threads ({:.2f} ms a JPEG); share {:.3f}",
        decoded_, busy_seconds_, threads_.size(), 1e3 * busy_seconds_ / double(decoded_),
        fraction_);
  }
}

size_t CpuShare::Keep(size_t n) const {
  if (threads_.empty() || n < 2) return 0;  // a build of one JPEG: the job's alone
  MutexLock lock(mu_);
  const double f = fixed_ >= 0 ? fixed_ : fraction_;
  return std::min(n - 1, static_cast<size_t>(std::lround(f * static_cast<double>(n))));
}

std::shared_ptr<const CpuShare::Part> CpuShare::Start(
    const PrepareSpec& spec, std::vector<std::span<const uint8_t>> encoded) {
  auto part = std::make_shared<Part>();
  part->spec_ = spec;
  part->encoded_ = std::move(encoded);
  const size_t n = part->encoded_.size();
  part->results_.assign(n, Result<PreparedImage>(Status::Internal("not decoded yet")));
  {
    MutexLock part_lock(part->mu_);
    part->left_ = n;
  }
  {
    MutexLock lock(mu_);
    for (size_t i = 0; i < n; ++i) queue_.emplace_back(part, i);
  }
  work_cv_.notify_all();
  return part;
}

void CpuShare::Report(bool cpu_done_first) {
  MutexLock lock(mu_);
  fraction_ = cpu_done_first ? std::min(options_.max_fraction, fraction_ + options_.step_up)
                             : std::max(0.0, fraction_ - options_.step_down);
}

double CpuShare::fraction() const {
  MutexLock lock(mu_);
  return fraction_;
}

double CpuShare::busy_seconds() const {
  MutexLock lock(mu_);
  return busy_seconds_;
}

uint64_t CpuShare::decoded() const {
  MutexLock lock(mu_);
  return decoded_;
}

void CpuShare::Run() {
  for (;;) {
    std::shared_ptr<Part> part;
    size_t i = 0;
    {
      MutexLock lock(mu_);
      mu_.Wait(work_cv_, [&]() REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left that a build waits for
      std::tie(part, i) = queue_.front();
      queue_.pop_front();
    }
    // The error barrier: whatever the decode throws comes back to the build as this JPEG's error.
    Result<PreparedImage> image = Status::Internal("not decoded");
    const auto start = std::chrono::steady_clock::now();
    try {
      image = PrepareGpuPixelsOnCpu(part->spec_, part->encoded_[i]);
    } catch (const std::exception& e) {
      image = Status::Internal(fmt::format("the CPU decode threw: {}", e.what()));
    } catch (...) {
      image = Status::Internal("the CPU decode threw a non-standard exception");
    }
    const bool ok = image.ok();
    part->results_[i] = std::move(image);
    {
      MutexLock lock(mu_);
      busy_seconds_ +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (ok) ++decoded_;
    }
    bool last = false;
    {
      MutexLock part_lock(part->mu_);
      last = --part->left_ == 0;
    }
    if (last) part->done_cv_.notify_all();
  }
}

}  // namespace carpool
