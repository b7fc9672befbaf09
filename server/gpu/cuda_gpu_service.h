// CudaGpuService: GpuService on CUDA, one per served GPU (server/gpu_service.h). Internal to
// server/gpu/: gpu_service.cc builds batches, gpu_service_ahead.cc decodes ahead.
#ifndef CARPOOL_SERVER_GPU_CUDA_GPU_SERVICE_H_
#define CARPOOL_SERVER_GPU_CUDA_GPU_SERVICE_H_

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/mutex.h"
#include "server/gpu/batch_decoder.h"
#include "server/gpu/cuda_check.h"
#include "server/gpu/gpu_assembler.h"
#include "server/gpu_service.h"
#include "server/resident_area.h"

namespace carpool::gpu_service_internal {

inline Status OnDevice(int device) {
  return gpu::CudaCheck(cudaSetDevice(device), fmt::format("cudaSetDevice({})", device));
}

class CudaDeviceSlots : public DeviceSlots {
 public:
  int device() const override { return device_; }
  uint32_t count() const override { return count_; }
  uint64_t stride() const override { return stride_; }
  uint64_t slot_bytes() const override { return slot_bytes_; }
  uint64_t labels_offset() const override { return labels_offset_; }
  const std::string& ipc_handle() const override { return handle_; }
  uint64_t ipc_offset() const override { return offset_; }
  const std::string& pci_bus_id() const override { return pci_; }
  uint8_t* SlotBase(uint32_t slot) const {
    return static_cast<uint8_t*>(memory_.data()) + uint64_t{slot} * stride_;
  }
  ~CudaDeviceSlots() override {
    if (memory_) {
      (void)OnDevice(device_);
      memory_bytes_ = memory_.bytes();
      memory_.Reset();  // cudaFree waits for work still using it
      pool_bytes_->fetch_sub(memory_bytes_);
      pool_slots_->fetch_sub(count_);
    }
  }

  int device_ = 0;
  uint32_t count_ = 0;
  uint64_t stride_ = 0, slot_bytes_ = 0, labels_offset_ = 0, offset_ = 0;
  uint64_t memory_bytes_ = 0;  // what pool_bytes_ counts for these slots
  std::string handle_, pci_;
  gpu::DeviceBuffer memory_;
  std::atomic<uint64_t>* pool_bytes_ = nullptr;
  std::atomic<uint64_t>* pool_slots_ = nullptr;
};

class CudaGpuService : public GpuService {
 public:
  static Result<std::unique_ptr<CudaGpuService>> Create(int device,
                                                        const GpuServiceOptions& options,
                                                        bool register_host);
  ~CudaGpuService() override;

  int device() const override { return device_; }
  Result<std::unique_ptr<DeviceSlots>> CreateSlots(uint32_t count, uint32_t batch_size,
                                                   uint64_t image_bytes) override;
  Status Build(const DeviceBatchRequest& request) override;
  GpuCounters Counters() const override;
  const std::string& decoder() const override { return decoder_name_; }
  void DecodeAhead(uint32_t sample, const PrepareSpec& spec, PreparedShape shape,
                   std::vector<uint8_t> encoded) override;
  uint64_t DecodedSamplesHeld() const override {
    const uint64_t blocks = resident_blocks_.load(), bytes = resident_bytes_.load();
    if (gpu_decodes_.load() == 0 || blocks == 0 || bytes == 0) return 0;
    return resident_capacity_ / std::max<uint64_t>(1, bytes / blocks);
  }

 private:
  CudaGpuService(int device, std::string name, std::string pci, uint64_t resident_bytes)
      : device_(device), name_(std::move(name)), pci_(std::move(pci)), area_(resident_bytes) {}
  Status BuildLocked(const DeviceBatchRequest& request, const CudaDeviceSlots& slots) REQUIRES(mu_);
  // Decodes the encoded samples of a build into their blocks (GPU decode).
  Status DecodeLocked(const DeviceBatchRequest& request,
                      std::span<const gpu::DecodeTarget> targets) REQUIRES(mu_);
  // The decode-ahead thread: decodes queued samples into resident blocks on its own stream.
  struct AheadItem {
    uint32_t sample = 0;
    PrepareSpec spec;
    PreparedShape shape;  // pixels
    std::vector<uint8_t> encoded;
  };
  struct AheadBatch {  // enqueued, not known complete
    std::shared_ptr<gpu::CudaEvent> done;
    std::vector<uint32_t> samples;
    std::vector<AheadItem> items;  // their bytes stay alive until done
  };
  void AheadLoop();
  void AheadDecode(std::vector<AheadItem> items);
  void AheadRetire(bool all);
  void UpdateResidentCounters() REQUIRES(area_mu_);

  const int device_;
  const std::string name_, pci_;
  ResidentArea::NextUseFn next_use_;
  std::string decoder_name_;  // empty: this GPU does not decode; fixed at creation

  Mutex mu_;  // serializes Build: the stream, the assembler and the resident area
  std::unique_ptr<gpu::GpuAssembler> assembler_ GUARDED_BY(mu_);
  gpu::CudaStream stream_;
  gpu::HostRegistration registration_;  // the cache segment, for DMA
  gpu::DeviceBuffer area_memory_;
  Mutex area_mu_ ACQUIRED_AFTER(mu_);  // the area and which blocks are still being written
  ResidentArea area_ GUARDED_BY(area_mu_);
  // Blocks the decode-ahead is writing: the event recorded after its work (null until recorded;
  // a build that needs one waits for it on its stream).
  std::unordered_map<uint32_t, std::shared_ptr<gpu::CudaEvent>> pending_ GUARDED_BY(area_mu_);
  std::condition_variable pending_recorded_;
  std::unordered_set<uint32_t> building_ GUARDED_BY(area_mu_);  // samples of the build under way
  // Decode-ahead: its queue, thread, stream and decoder.
  Mutex ahead_mu_;
  std::condition_variable ahead_wake_;
  std::vector<AheadItem> ahead_queue_ GUARDED_BY(ahead_mu_);
  bool ahead_stop_ GUARDED_BY(ahead_mu_) = false;
  std::unique_ptr<gpu::BatchDecoder> ahead_decoder_;  // the ahead thread's only
  gpu::CudaStream ahead_stream_;
  std::deque<AheadBatch> ahead_inflight_;  // the ahead thread's only
  std::thread ahead_thread_;
  gpu::PinnedHostBuffer label_staging_ GUARDED_BY(mu_);
  std::unique_ptr<gpu::BatchDecoder> decode_ GUARDED_BY(mu_);  // null when decoder_name_ is empty
  gpu::DeviceBuffer prepared_scratch_ GUARDED_BY(mu_);  // decoded samples that found no block

  std::atomic<uint64_t> batches_{0}, images_{0}, uploads_{0}, upload_bytes_{0};
  std::atomic<uint64_t> resident_hits_{0}, resident_evictions_{0}, resident_bytes_{0};
  std::atomic<uint64_t> pool_bytes_{0}, pool_slots_{0};
  std::atomic<uint64_t> assemble_ns_{0};
  std::atomic<uint64_t> gpu_decodes_{0}, cpu_fallbacks_{0}, decoded_bytes_{0}, undecodable_{0};
  std::atomic<uint64_t> decode_ns_{0};
  std::atomic<uint64_t> resident_blocks_{0};
  std::atomic<uint64_t> ahead_decodes_{0}, ahead_dropped_{0};
  uint64_t resident_capacity_ = 0;  // fixed at creation
};

}  // namespace carpool::gpu_service_internal

#endif  // CARPOOL_SERVER_GPU_CUDA_GPU_SERVICE_H_
