// CudaGpuService's decode-ahead (server/gpu/cuda_gpu_service.h): a thread per GPU that decodes
// samples into the resident area as soon as the host has their encoded bytes, on a stream of its
// own, so that their batch's build finds them decoded (docs/gpu.md "GPU decode").
#include <fmt/format.h>

#include "common/log.h"
#include "server/gpu/cuda_gpu_service.h"
#include "server/thread_name.h"

namespace carpool::gpu_service_internal {

CudaGpuService::~CudaGpuService() {
  if (ahead_thread_.joinable()) {
    {
      MutexLock lock(ahead_mu_);
      ahead_stop_ = true;
    }
    ahead_wake_.notify_all();
    ahead_thread_.join();
  }
}

void CudaGpuService::DecodeAhead(uint32_t sample, const PrepareSpec& spec, PreparedShape shape,
                                 std::vector<uint8_t> encoded) {
  if (!ahead_thread_.joinable() || !shape.encoded()) return;
  {
    MutexLock lock(ahead_mu_);
    // Beyond a few batches the build decodes what it needs itself.
    if (ahead_queue_.size() >= 2048) {
      ++ahead_dropped_;
      return;
    }
    ahead_queue_.push_back({sample, spec, shape.pixels(), std::move(encoded)});
  }
  ahead_wake_.notify_one();
}

void CudaGpuService::AheadLoop() {
  NameThisThread(fmt::format("carpool-ahead{}", device_));
  if (!OnDevice(device_).ok()) return;
  while (true) {
    bool idle = false;
    {
      MutexLock lock(ahead_mu_);
      idle = ahead_queue_.empty() && !ahead_stop_;
    }
    if (idle) AheadRetire(/*all=*/true);  // nothing queued: finish what is in flight
    std::vector<AheadItem> items;
    {
      MutexLock lock(ahead_mu_);
      ahead_mu_.Wait(ahead_wake_, [&]() REQUIRES(ahead_mu_) {
        return ahead_stop_ || !ahead_queue_.empty();
      });
      if (ahead_stop_) break;
      // Up to one nvJPEG batch, of one spec.
      const PrepareSpec spec = ahead_queue_.front().spec;
      size_t take = 0;
      while (take < ahead_queue_.size() && take < 256 && ahead_queue_[take].spec == spec) ++take;
      items.assign(std::make_move_iterator(ahead_queue_.begin()),
                   std::make_move_iterator(ahead_queue_.begin() + static_cast<long>(take)));
      ahead_queue_.erase(ahead_queue_.begin(), ahead_queue_.begin() + static_cast<long>(take));
    }
    AheadDecode(std::move(items));
  }
  AheadRetire(/*all=*/true);
}

void CudaGpuService::AheadDecode(std::vector<AheadItem> items) {
  auto* area = static_cast<uint8_t*>(area_memory_.data());
  std::vector<gpu::DecodeTarget> targets;
  AheadBatch batch;
  {
    MutexLock lock(area_mu_);
    // Never evict a block a build is reading or the decode-ahead is still writing.
    std::unordered_set<uint32_t> in_use(building_);
    for (const auto& [id, done] : pending_) in_use.insert(id);
    for (size_t i = 0; i < items.size(); ++i) {
      const uint64_t bytes = items[i].shape.bytes();
      if (area_.Find(items[i].sample, bytes)) continue;  // resident, or being written
      std::optional<uint64_t> at = area_.Place(items[i].sample, bytes, in_use, next_use_);
      if (!at) continue;
      in_use.insert(items[i].sample);
      pending_[items[i].sample] = nullptr;  // builds wait until its event is recorded
      batch.samples.push_back(items[i].sample);
      targets.push_back({i, items[i].encoded, items[i].shape, area + *at});
    }
    UpdateResidentCounters();
  }
  if (targets.empty()) return;
  Result<gpu::CudaEvent> done = gpu::CudaEvent::Create();
  gpu::DecodeCounts counts;
  std::vector<std::pair<size_t, Status>> failed;
  Status s = done.ok() ? ahead_decoder_->Decode(items.front().spec, targets, ahead_stream_.get(),
                                                &failed, &counts)
                       : done.status();
  if (s.ok()) s = done->Record(ahead_stream_.get());
  gpu_decodes_ += counts.gpu;
  ahead_decodes_ += counts.gpu + counts.cpu;
  decoded_bytes_ += counts.bytes;
  {
    MutexLock lock(area_mu_);
    if (!s.ok()) {  // nothing of it can be trusted: the builds decode these themselves
      log::Warn("GPU {}: decode-ahead of {} samples failed: {}", device_, targets.size(),
                s.ToString());
      for (uint32_t id : batch.samples) {
        area_.Erase(id);
        pending_.erase(id);
      }
    } else {
      batch.done = std::make_shared<gpu::CudaEvent>(std::move(*done));
      for (uint32_t id : batch.samples) pending_[id] = batch.done;
      // A stream neither decoder takes: forgotten here; its build reports it.
      for (const auto& [index, why] : failed) {
        area_.Erase(items[index].sample);
        pending_.erase(items[index].sample);
      }
    }
    UpdateResidentCounters();
  }
  pending_recorded_.notify_all();
  if (!s.ok()) return;
  batch.items = std::move(items);
  ahead_inflight_.push_back(std::move(batch));
  AheadRetire(/*all=*/false);
}

// Forgets the pending marks of decode-ahead batches that have completed; with all, waits for
// every one; else keeps at most two in flight (their scratch and bytes are reused or freed).
void CudaGpuService::AheadRetire(bool all) {
  while (!ahead_inflight_.empty()) {
    AheadBatch& oldest = ahead_inflight_.front();
    const bool complete = cudaEventQuery(oldest.done->get()) == cudaSuccess;
    if (!complete && !all && ahead_inflight_.size() <= 2) return;
    if (!complete) (void)oldest.done->Synchronize();
    {
      MutexLock lock(area_mu_);
      for (uint32_t id : oldest.samples) {
        auto it = pending_.find(id);
        if (it != pending_.end() && it->second == oldest.done) pending_.erase(it);
      }
    }
    ahead_inflight_.pop_front();
  }
}

void CudaGpuService::UpdateResidentCounters() {
  resident_evictions_ = area_.evictions();
  resident_bytes_ = area_.resident_bytes();
  resident_blocks_ = area_.size();
}

}  // namespace carpool::gpu_service_internal
