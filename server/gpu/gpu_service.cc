// GpuService on CUDA: one per served GPU (server/gpu_service.h).
#include "server/gpu_service.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/elapsed.h"
#include "common/fair_mutex.h"
#include "common/log.h"
#include "common/mutex.h"
#include "server/gpu/batch_decoder.h"
#include "server/gpu/cuda_check.h"
#include "server/gpu/device_probe.h"
#include "server/gpu/gpu_assembler.h"
#include "server/resident_area.h"

namespace carpool {
namespace {

constexpr uint64_t kSlotAlign = 256;
constexpr uint64_t kAllocationGranule = uint64_t{2} << 20;
uint64_t AlignUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

Status OnDevice(int device) {
  return gpu::CudaCheck(cudaSetDevice(device), fmt::format("cudaSetDevice({})", device));
}

// Copies of many samples from the host to the device, in stream order. One cudaMemcpyBatchAsync
// pays the per-copy submission cost once (256 separate 196 KiB cudaMemcpyAsync reached 60% of one
// large copy's bandwidth on an H200); a runtime without it gets one cudaMemcpyAsync per sample.
Status CopyToDevice(const std::vector<void*>& dst, const std::vector<const void*>& src,
                    const std::vector<size_t>& bytes, cudaStream_t stream) {
  if (dst.empty()) return Status::OK();
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t first = 0;
  if (cudaMemcpyBatchAsync(dst.data(), src.data(), bytes.data(), dst.size(), &attr, &first, 1,
                           stream) == cudaSuccess) {
    return Status::OK();
  }
  (void)cudaGetLastError();  // not supported here: clear it and copy one by one
  for (size_t i = 0; i < dst.size(); ++i) {
    if (Status s = gpu::CudaCheck(
            cudaMemcpyAsync(dst[i], src[i], bytes[i], cudaMemcpyDefault, stream),
            "cudaMemcpyAsync(sample to resident area)");
        !s.ok()) {
      return s;
    }
  }
  return Status::OK();
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
      pool_jobs_->fetch_sub(1);
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
  std::atomic<uint64_t>* pool_jobs_ = nullptr;
};

class CudaGpuService : public GpuService {
 public:
  static Result<std::unique_ptr<CudaGpuService>> Create(int device,
                                                        const GpuServiceOptions& options,
                                                        bool register_host);
  ~CudaGpuService() override = default;

  int device() const override { return device_; }
  Result<std::unique_ptr<DeviceSlots>> CreateSlots(uint32_t count, uint32_t batch_size,
                                                   uint64_t image_bytes) override;
  Status Build(const DeviceBatchRequest& request) override;
  GpuCounters Counters() const override;
  const std::string& decoder() const override { return decoder_name_; }
  uint64_t DecodedSamplesHeld() const override {
    const uint64_t blocks = resident_blocks_.load(), bytes = resident_bytes_.load();
    if (gpu_decodes_.load() == 0 || blocks == 0 || bytes == 0) return 0;
    return resident_capacity_ / std::max<uint64_t>(1, bytes / blocks);
  }
  void ForgetJobDecoder(const JobDecoder* decoder) override;

 private:
  CudaGpuService(int device, std::string name, std::string pci, uint64_t resident_bytes)
      : device_(device), name_(std::move(name)), pci_(std::move(pci)), area_(resident_bytes) {}
  // A build between its phases (Build): what its plan placed and found, and its job's work.
  struct BuildPlan;
  // Phase 1: resident blocks found and placed, and what to upload and decode where. With
  // use_area false, nothing is placed or found: decodes go to the scratch (a restart).
  void PlanLocked(const DeviceBatchRequest& request, bool use_area, BuildPlan& plan) REQUIRES(mu_);
  // Phase 1: sends the plan's decodes to the job's process, if it decodes for this GPU now.
  void SendJobWorkLocked(const DeviceBatchRequest& request, BuildPlan& plan) REQUIRES(mu_);
  // Phase 3, in plan order: uploads, decodes (the job's copied out, the rest here), assembly,
  // labels, and the wait for the stream.
  Status FinishLocked(const DeviceBatchRequest& request, const CudaDeviceSlots& slots,
                      BuildPlan& plan) REQUIRES(mu_);
  // Decodes the encoded samples of a build into their blocks (GPU decode).
  Status DecodeLocked(const DeviceBatchRequest& request,
                      std::span<const gpu::DecodeTarget> targets) REQUIRES(mu_);
  // Points the build's sources at what the job's process decoded (its buffer, mapped here) and
  // marks the resident blocks the assembly fills from them; returns the targets left for the
  // server (all of them when the job failed).
  std::vector<gpu::DecodeTarget> UseJobWorkLocked(const DeviceBatchRequest& request,
                                                  BuildPlan& plan) REQUIRES(mu_);
  // Counts a job's decode fault in job_decode_failures, the first time only. O(1).
  void CountJobDecodeFailureLocked(const JobDecoder* decoder) REQUIRES(mu_) {
    bool& counted = job_buffers_[decoder].failure_counted;
    if (!counted) ++job_decode_failures_;
    counted = true;
  }
  // The job's decode buffer mapped into this process (opened once per handle), or an error.
  // `needed` bytes of it must be mapped (Corruption otherwise).
  Result<uint8_t*> MapJobBuffer(const JobDecoder* decoder, const std::string& handle,
                                uint64_t needed) REQUIRES(mu_);
  // Forgets a placed block whose pixels will not come; later plans that found it restart.
  void EraseLocked(uint32_t sample) REQUIRES(mu_) {
    area_.Erase(sample);
    erased_.emplace_back(++erasures_, sample);
  }

  const int device_;
  const std::string name_, pci_;
  ResidentArea::NextUseFn next_use_;
  std::string decoder_name_;  // empty: this GPU does not decode; fixed at creation

  // Serializes Build: the stream, the assembler and the resident area. Fair: builds of a GPU's
  // jobs take turns in the order they arrive, where std::mutex lets a thread arriving as the
  // holder leaves go first; GPU decode's builds hold it 20-70 ms (docs/gpu.md).
  FairMutex mu_;
  std::unique_ptr<gpu::GpuAssembler> assembler_ GUARDED_BY(mu_);
  gpu::CudaStream stream_;
  gpu::HostRegistration registration_;  // the cache segment, for DMA
  gpu::DeviceBuffer area_memory_;
  ResidentArea area_ GUARDED_BY(mu_);
  gpu::PinnedHostBuffer label_staging_ GUARDED_BY(mu_);
  std::unique_ptr<gpu::BatchDecoder> decode_ GUARDED_BY(mu_);  // null when decoder_name_ is empty
  gpu::DeviceBuffer prepared_scratch_ GUARDED_BY(mu_);  // decoded samples that found no block
  struct JobBuffer {
    uint64_t lane_bytes = 0;  // what the first work asked for: no later work asks more
    bool answered = false;    // a work came back: later deadlines are the short one
    std::string handle;
    void* base = nullptr;  // cudaIpcOpenMemHandle's mapping, at the first answer
    uint64_t bytes = 0;    // mapped from base on
    // Counted in job_decode_failures: once per job. With two works outstanding both can fail,
    // and whether the second fails or finds the decoder off is timing.
    bool failure_counted = false;
  };
  std::unordered_map<const JobDecoder*, JobBuffer> job_buffers_ GUARDED_BY(mu_);
  // Builds overlap: a job's next build plans and sends its JPEGs while the previous one waits for
  // the job's answer. Their blocks stay put (in_flight_), and they finish in plan order (turns).
  std::unordered_map<uint32_t, uint32_t> in_flight_ GUARDED_BY(mu_);  // sample -> builds using it
  uint64_t erasures_ GUARDED_BY(mu_) = 0;         // blocks forgotten (EraseLocked)
  // (erasures_ after it, sample) of the erasures since the oldest plan in flight, and the
  // erasures_ each plan in flight saw: a plan rebuilds only if a block it reads was erased.
  std::deque<std::pair<uint64_t, uint32_t>> erased_ GUARDED_BY(mu_);
  std::multiset<uint64_t> plan_marks_ GUARDED_BY(mu_);
  uint64_t next_turn_ GUARDED_BY(mu_) = 0;        // the next plan's
  uint64_t in_flight_waits_ GUARDED_BY(mu_) = 0;  // builds planned, unfinished, their JPEGs sent
  Mutex turn_mu_;
  std::condition_variable turn_cv_;
  uint64_t serving_turn_ GUARDED_BY(turn_mu_) = 0;  // the plan that may finish now

  std::atomic<uint64_t> batches_{0}, images_{0}, uploads_{0}, upload_bytes_{0};
  std::atomic<uint64_t> resident_hits_{0}, resident_evictions_{0}, resident_bytes_{0};
  std::atomic<uint64_t> pool_bytes_{0}, pool_slots_{0};
  std::atomic<uint64_t> pool_jobs_{0};  // jobs holding batch slots on this GPU
  std::atomic<uint64_t> assemble_ns_{0};
  std::atomic<uint64_t> gpu_decodes_{0}, cpu_fallbacks_{0}, decoded_bytes_{0}, undecodable_{0};
  std::atomic<uint64_t> decode_ns_{0};
  std::atomic<uint64_t> job_decodes_{0}, job_decode_failures_{0}, job_decode_ns_{0};
  std::atomic<uint64_t> overlapped_builds_{0};
  std::atomic<uint64_t> job_copy_ns_{0}, job_wait_ns_{0}, job_copy_out_ns_{0}, assemble_kernel_ns_{0};
  std::atomic<uint64_t> lock_ns_{0}, inspect_ns_{0}, nvjpeg_ns_{0}, resize_ns_{0},
      cpu_decode_ns_{0}, decode_wait_ns_{0}, sync_ns_{0};  // GpuCounters::BuildPhases
  std::atomic<uint64_t> resident_blocks_{0};
  uint64_t resident_capacity_ = 0;  // fixed at creation
};

// Not analyzed: the new object is not shared yet, so its guarded members need no lock.
Result<std::unique_ptr<CudaGpuService>> CudaGpuService::Create(
    int device, const GpuServiceOptions& options, bool register_host) NO_THREAD_SAFETY_ANALYSIS {
  Result<std::vector<gpu::DeviceInfo>> devices = gpu::ListCudaDevices();
  if (!devices.ok()) return devices.status();
  if (device < 0 || device >= static_cast<int>(devices->size())) {
    return Status::InvalidArgument(fmt::format(
        "--gpus {}: CUDA device {} does not exist; this machine has {} GPU(s){}", device, device,
        devices->size(),
        devices->empty() ? std::string("; use --gpus none")
                         : fmt::format(" (0..{})", devices->size() - 1)));
  }
  if (Status s = OnDevice(device); !s.ok()) return s;
  // A thread waiting for its batch's GPU work sleeps instead of spinning: the workers need every
  // core (the default spins while fewer contexts than cores exist).
  if (Status s = gpu::CudaCheck(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync),
                                "cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync)");
      !s.ok()) {
    log::Warn("GPU {}: {}; waits for the GPU will spin", device, s.ToString());
  }
  char pci[32] = {0};
  if (Status s = gpu::CudaCheck(cudaDeviceGetPCIBusId(pci, sizeof(pci), device),
                                "cudaDeviceGetPCIBusId");
      !s.ok()) {
    return s;
  }
  std::unique_ptr<CudaGpuService> svc(
      new CudaGpuService(device, (*devices)[device].name, pci, options.resident_bytes));
  svc->next_use_ = options.next_use;
  svc->resident_capacity_ = svc->area_.capacity();
  Result<std::unique_ptr<gpu::GpuAssembler>> assembler = gpu::GpuAssembler::Create(device);
  if (!assembler.ok()) return assembler.status();
  svc->assembler_ = std::move(*assembler);
  Result<gpu::CudaStream> stream = gpu::CudaStream::Create();
  if (!stream.ok()) return stream.status();
  svc->stream_ = std::move(*stream);
  if (!options.host_region.empty() && register_host) {
    Result<gpu::HostRegistration> reg =
        gpu::HostRegistration::Register(options.host_region.data(), options.host_region.size());
    if (!reg.ok()) {
      return Status(reg.status().code(),
                    fmt::format("registering the {}-byte cache segment with GPU {} for DMA: {}",
                                options.host_region.size(), device, reg.status().message()));
    }
    svc->registration_ = std::move(*reg);
  }
  if (svc->area_.capacity() > 0) {
    Result<gpu::DeviceBuffer> area = gpu::DeviceBuffer::Allocate(svc->area_.capacity());
    if (!area.ok()) {
      return Status::ResourceExhausted(fmt::format(
          "GPU {}: cannot allocate the {}-byte resident sample area ({}); lower --gpu-cache-size",
          device, svc->area_.capacity(), area.status().message()));
    }
    svc->area_memory_ = std::move(*area);
  }
  if (options.gpu_decode != GpuDecode::kOff) {
    // Batches of up to 256 JPEGs: the engines' throughput is flat beyond (docs/gpu.md).
    Result<std::unique_ptr<gpu::JpegDecoder>> decoder = gpu::JpegDecoder::Create(256);
    if (decoder.ok()) {
      svc->decoder_name_ = gpu::JpegBackendName((*decoder)->backend());
      svc->decode_ = std::make_unique<gpu::BatchDecoder>(std::move(*decoder), options.decode_bytes);
    } else if (options.gpu_decode == GpuDecode::kOn) {
      return Status(decoder.status().code(),
                    fmt::format("--gpu-decode on: GPU {} cannot decode JPEGs: {}", device,
                                decoder.status().message()));
    } else {
      log::Info("GPU {}: JPEGs are decoded on the CPU (GPU decode unavailable: {})", device,
                decoder.status().message());
    }
  }
  log::Info("GPU {} ({}, {}): serving; cache segment {}, resident area {} bytes, decode {}",
            device, svc->name_, svc->pci_,
            options.host_region.empty() ? "absent (--cache-size 0)"
            : register_host             ? "registered for DMA (all GPUs)"
                                        : "registered for DMA by the first GPU served",
            svc->area_.capacity(),
            svc->decoder_name_.empty() ? "on the CPU" : "nvJPEG " + svc->decoder_name_);
  return svc;
}

Result<std::unique_ptr<DeviceSlots>> CudaGpuService::CreateSlots(uint32_t count,
                                                                 uint32_t batch_size,
                                                                 uint64_t image_bytes) {
  if (count == 0 || batch_size == 0) {
    return Status::InvalidArgument("device batch slots need a count and a batch size of >= 1");
  }
  auto slots = std::make_unique<CudaDeviceSlots>();
  slots->device_ = device_;
  slots->count_ = count;
  slots->pci_ = pci_;
  slots->labels_offset_ = AlignUp(uint64_t{batch_size} * image_bytes, kSlotAlign);
  slots->slot_bytes_ = slots->labels_offset_ + uint64_t{batch_size} * sizeof(int64_t);
  slots->stride_ = AlignUp(slots->slot_bytes_, kSlotAlign);
  // Whole 2 MiB pages: the driver gives such an allocation its own base, so the IPC handle maps
  // this job's slots and nothing else (the offset below covers a driver that does not).
  const uint64_t total = AlignUp(slots->stride_ * count, kAllocationGranule);
  if (Status s = OnDevice(device_); !s.ok()) return s;
  Result<gpu::DeviceBuffer> memory = gpu::DeviceBuffer::Allocate(total);
  if (!memory.ok()) {
    return Status::ResourceExhausted(fmt::format(
        "GPU {}: cannot allocate {} batch slots of {} bytes ({}); lower the batch size or "
        "prefetch depth, or free device memory",
        device_, count, slots->stride_, memory.status().message()));
  }
  slots->memory_ = std::move(*memory);
  cudaIpcMemHandle_t handle{};
  if (Status s = gpu::CudaCheck(cudaIpcGetMemHandle(&handle, slots->memory_.data()),
                                "cudaIpcGetMemHandle(batch slots)");
      !s.ok()) {
    return s;
  }
  slots->handle_.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  Result<std::pair<uintptr_t, size_t>> range = gpu::AllocationRange(slots->memory_.data());
  if (!range.ok()) return range.status();
  const auto address = reinterpret_cast<uintptr_t>(slots->memory_.data());
  slots->offset_ = address - range->first;
  if (slots->offset_ != 0 || range->second != total) {
    log::Warn("GPU {}: a job's {}-byte device slots lie at offset {} of a {}-byte allocation; "
              "its process can map the rest of that allocation too",
              device_, total, slots->offset_, range->second);
  }
  slots->pool_bytes_ = &pool_bytes_;
  slots->pool_slots_ = &pool_slots_;
  slots->pool_jobs_ = &pool_jobs_;
  pool_jobs_ += 1;
  pool_bytes_ += total;
  pool_slots_ += count;
  return std::unique_ptr<DeviceSlots>(std::move(slots));
}

struct CudaGpuService::BuildPlan {
  uint64_t turn = 0;
  // erasures_ when planned: an erasure since then may have taken a block it reads.
  uint64_t erasures = 0;
  uint64_t erasures_at_plan = 0;        // the same, kept through a rebuild (plan_marks_)
  std::vector<const uint8_t*> sources;  // null: staging, or a scratch decode (resolved in phase 3)
  std::vector<uint8_t*> keeps;  // per sample: the block the assembly fills as it reads, or null
  std::vector<PreparedView> views;
  std::unordered_map<uint32_t, const uint8_t*> placed;  // blocks this build fills
  uint64_t uploads = 0, upload_bytes = 0, hits = 0;
  std::vector<void*> copy_dst;
  std::vector<const void*> copy_src;
  std::vector<size_t> copy_bytes;
  // Encoded (decode=gpu) samples to decode: into a resident block, or the scratch at an offset.
  std::vector<gpu::DecodeTarget> decodes;
  std::vector<std::pair<size_t, uint64_t>> scratch_decodes;  // (index in decodes, offset)
  std::unordered_map<uint32_t, size_t> scratch_index;        // id -> index in decodes
  uint64_t scratch_bytes = 0;
  // The decodes sent to the job's process: its work, and its answer once awaited.
  std::vector<JobDecodeItem> job_items;
  std::optional<JobDecodeTicket> job_ticket;
  std::optional<Result<JobDecodeResult>> job_answer;
  bool job_first = false;  // no work of the job's has come back yet
  std::chrono::steady_clock::time_point job_start;
};

Status CudaGpuService::Build(const DeviceBatchRequest& request) {
  auto* slots = dynamic_cast<CudaDeviceSlots*>(request.slots);
  if (slots == nullptr || slots->device_ != device_ || request.slot >= slots->count_) {
    return Status::InvalidArgument(
        fmt::format("GPU {}: batch slot {} is not a slot of this device", device_, request.slot));
  }
  const size_t n = request.samples.size();
  if (request.sample_ids.size() != n || request.seeds.size() != n || request.labels.size() != n ||
      request.spec == nullptr) {
    return Status::InvalidArgument(fmt::format(
        "GPU batch of {} samples has {} ids, {} seeds and {} labels", n,
        request.sample_ids.size(), request.seeds.size(), request.labels.size()));
  }
  const auto start = std::chrono::steady_clock::now();
  BuildPlan plan;
  bool sent = false;      // the job has this build's JPEGs
  bool has_turn = false;  // phase 3 may run
  // Every build that took a turn gives it back, and its samples, whatever happens: a turn never
  // given back would stop every later build of this GPU. Also on a throw (the engine's fault
  // barrier survives one).
  auto wait_turn = [&] {
    MutexLock turn(turn_mu_);
    turn_mu_.Wait(turn_cv_, [&]() REQUIRES(turn_mu_) { return serving_turn_ == plan.turn; });
    has_turn = true;
  };
  auto end_build = [&]() REQUIRES(mu_) {
    if (sent) --in_flight_waits_;
    for (uint32_t id : request.sample_ids) {
      if (auto it = in_flight_.find(id); it != in_flight_.end() && --it->second == 0) {
        in_flight_.erase(it);
      }
    }
    plan_marks_.erase(plan_marks_.find(plan.erasures_at_plan));
    // Erasures older than every plan in flight concern none of them.
    while (!erased_.empty() &&
           (plan_marks_.empty() || erased_.front().first <= *plan_marks_.begin())) {
      erased_.pop_front();
    }
  };
  auto pass_turn = [&] {
    {
      MutexLock turn(turn_mu_);
      ++serving_turn_;
    }
    turn_cv_.notify_all();
  };
  bool planned = false;
  try {
    // Phase 1: the plan, and the job's work sent.
    {
      FairMutexLock lock(mu_);
      lock_ns_ += NanosSince(start);
      plan.turn = next_turn_++;
      plan.erasures = plan.erasures_at_plan = erasures_;
      plan_marks_.insert(plan.erasures_at_plan);
      if (in_flight_waits_ > 0) ++overlapped_builds_;  // an earlier build waits for its job
      for (uint32_t id : request.sample_ids) ++in_flight_[id];
      planned = true;
      PlanLocked(request, /*use_area=*/true, plan);
      SendJobWorkLocked(request, plan);
      sent = plan.job_ticket.has_value();
      if (sent) ++in_flight_waits_;
    }
    if (sent) {
      // The job's next build may plan and send now: the job decodes it while this one finishes.
      if (request.job_work_sent) request.job_work_sent();
      // Phase 2: the job's answer, with no lock held. A job slower than this to answer is not
      // decoding for us; its first answer may wait for its CUDA context and nvJPEG to start.
      plan.job_answer = request.job_decoder->Await(
          *plan.job_ticket, std::chrono::milliseconds(plan.job_first ? 30000 : 3000));
    }
    // Phase 3, in plan order: a later plan may read blocks this one fills.
    const auto turn_start = std::chrono::steady_clock::now();
    wait_turn();
    Status built;
    {
      FairMutexLock lock(mu_);
      lock_ns_ += NanosSince(turn_start);
      built = FinishLocked(request, *slots, plan);
      end_build();
    }
    pass_turn();
    assemble_ns_ += NanosSince(start);
    return built;
  } catch (...) {
    if (planned) {
      if (!has_turn) wait_turn();
      {
        FairMutexLock lock(mu_);
        for (auto [id, where] : plan.placed) EraseLocked(id);  // maybe never filled
        end_build();
      }
      pass_turn();
    }
    throw;
  }
}

void CudaGpuService::PlanLocked(const DeviceBatchRequest& request, bool use_area, BuildPlan& plan) {
  const size_t n = request.samples.size();
  // Resident samples are read in place; the others are copied into a new resident block (one
  // upload however many jobs use them while they stay), or left to the assembler's staging when
  // the area has no room. Blocks that builds in flight read or fill are never evicted.
  plan.sources.assign(n, nullptr);
  plan.keeps.assign(n, nullptr);
  plan.views.assign(request.samples.begin(), request.samples.end());
  // in_flight_ holds this request's ids too (Build counted them before planning).
  std::unordered_set<uint32_t> in_use;
  in_use.reserve(in_flight_.size());
  for (const auto& [id, builds] : in_flight_) in_use.insert(id);
  auto* area = use_area ? static_cast<uint8_t*>(area_memory_.data()) : nullptr;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t id = request.sample_ids[i];
    const PreparedView& view = request.samples[i];
    const uint64_t bytes = view.shape.bytes();
    plan.views[i].shape = view.shape.pixels();
    if (auto it = plan.placed.find(id); it != plan.placed.end()) {
      plan.sources[i] = it->second;
      continue;
    }
    if (area != nullptr) {
      if (std::optional<uint64_t> at = area_.Find(id, bytes)) {
        plan.sources[i] = area + *at;
        ++plan.hits;
        continue;
      }
      if (std::optional<uint64_t> at = area_.Place(id, bytes, in_use, next_use_)) {
        plan.sources[i] = area + *at;
        plan.placed[id] = plan.sources[i];
        if (view.shape.encoded()) {
          plan.decodes.push_back(
              {i, {view.data, view.shape.encoded_bytes}, plan.views[i].shape, area + *at});
          continue;
        }
        plan.copy_dst.push_back(area + *at);
        plan.copy_src.push_back(view.data);
        plan.copy_bytes.push_back(bytes);
        ++plan.uploads;
        plan.upload_bytes += bytes;
        continue;
      }
    }
    if (view.shape.encoded()) {  // no block: decoded into the scratch for this build only
      if (plan.scratch_index.count(id) == 0) {
        plan.scratch_index[id] = plan.decodes.size();
        plan.scratch_decodes.emplace_back(plan.decodes.size(), plan.scratch_bytes);
        plan.decodes.push_back(
            {i, {view.data, view.shape.encoded_bytes}, plan.views[i].shape, nullptr});
        plan.scratch_bytes += (bytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
      }
      continue;
    }
    // No resident block: the assembler uploads it through staging (counted from its stats).
  }
}

void CudaGpuService::SendJobWorkLocked(const DeviceBatchRequest& request, BuildPlan& plan) {
  // Only while this GPU serves one job: with four training processes on an H200 the jobs'
  // own decodes cost more than the server's (n4 0.56x against 0.90x of the GPU, one call),
  // while for one job they gain (0.73x against 0.63x; docs/gpu.md).
  if (plan.decodes.empty() || request.job_decoder == nullptr || !request.job_decoder->enabled() ||
      !decode_ || pool_jobs_.load() != 1) {
    return;
  }
  uint64_t output_bytes = 0, largest = 0;
  plan.job_items.reserve(plan.decodes.size());
  for (const gpu::DecodeTarget& t : plan.decodes) {
    plan.job_items.push_back({t.encoded, static_cast<uint32_t>(t.shape.height),
                              static_cast<uint32_t>(t.shape.width),
                              static_cast<uint32_t>(t.shape.channels), output_bytes});
    output_bytes += AlignUp(t.shape.bytes(), kSlotAlign);
    largest = std::max<uint64_t>(largest, AlignUp(t.shape.bytes(), kSlotAlign));
  }
  auto [known, first] = job_buffers_.try_emplace(request.job_decoder);
  JobBuffer& buffer = known->second;
  if (first) {
    // Lanes of room for a whole batch of the largest sample: the job allocates its buffer once,
    // and no later work asks for more, so it never frees a buffer this process has mapped.
    buffer.lane_bytes = std::max(output_bytes, largest * request.samples.size());
  } else if (output_bytes > buffer.lane_bytes) {
    plan.job_items.clear();
    return;  // more than a lane of the job's buffer holds: this build decodes here
  }
  plan.job_start = std::chrono::steady_clock::now();
  Result<JobDecodeTicket> ticket =
      request.job_decoder->Send(request.prepare->ToString(), plan.job_items, buffer.lane_bytes);
  if (!ticket.ok()) {
    plan.job_items.clear();
    // Both lanes taken, or turned off by another work's failure (counted there): not a failure.
    if (ticket.status().code() == StatusCode::kFailedPrecondition) return;
    CountJobDecodeFailureLocked(request.job_decoder);
    log::Warn(
        "GPU {}: a job's process did not take its batch's {} JPEGs; the server decodes them, "
        "and that job's from now on: {}",
        device_, plan.decodes.size(), ticket.status().ToString());
    return;
  }
  job_copy_ns_ += static_cast<uint64_t>(ticket->copy_seconds * 1e9);
  plan.job_ticket = *ticket;
  plan.job_first = !buffer.answered;
}

std::vector<gpu::DecodeTarget> CudaGpuService::UseJobWorkLocked(const DeviceBatchRequest& request,
                                                                BuildPlan& plan) {
  const std::span<const gpu::DecodeTarget> targets = plan.decodes;
  std::vector<gpu::DecodeTarget> all_targets(targets.begin(), targets.end());
  auto all = [&](const Status& why) {
    CountJobDecodeFailureLocked(request.job_decoder);
    request.job_decoder->Disable(why);  // a job that failed once decodes no more
    log::Warn(
        "GPU {}: a job's process did not decode its batch's {} JPEGs; the server decodes "
        "them, and that job's from now on: {}",
        device_, targets.size(), why.ToString());
    job_decode_ns_ += NanosSince(plan.job_start);
    return all_targets;
  };
  Result<JobDecodeResult>& done = *plan.job_answer;
  if (!done.ok()) {
    // Turned off by another work's failure: counted there.
    if (done.status().code() == StatusCode::kFailedPrecondition) return all_targets;
    return all(done.status());
  }
  job_wait_ns_ += static_cast<uint64_t>(done->wait_seconds * 1e9);
  const auto copy_out_start = std::chrono::steady_clock::now();
  JobBuffer& buffer = job_buffers_[request.job_decoder];
  Result<uint8_t*> base = MapJobBuffer(request.job_decoder, done->buffer_handle,
                                       done->buffer_offset + plan.job_ticket->lane_bytes);
  if (!base.ok()) return all(base.status());
  const bool first = !buffer.answered;
  buffer.answered = true;
  std::vector<bool> failed(targets.size(), false);
  for (uint32_t i : done->failed) failed[i] = true;  // each < targets.size(): Await checked
  // The assembly reads the job's pixels where they are and fills the resident blocks as it
  // reads them: a copy of their own, in this process's context, cost n1 about 4% of the GPU
  // (time slicing beside the training; docs/gpu.md item 13).
  std::unordered_map<const uint8_t*, const uint8_t*> decoded;  // target's dst -> job's pixels
  std::vector<gpu::DecodeTarget> left;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (failed[i]) {
      left.push_back(targets[i]);
      continue;
    }
    decoded[targets[i].dst] = *base + done->buffer_offset + plan.job_items[i].dst_offset;
  }
  std::unordered_set<const uint8_t*> blocks;
  for (const auto& [id, block] : plan.placed) blocks.insert(block);
  for (size_t i = 0; i < plan.sources.size(); ++i) {
    auto it = decoded.find(plan.sources[i]);
    if (it == decoded.end()) continue;
    const uint8_t* target = plan.sources[i];
    plan.sources[i] = it->second;
    // A resident block is filled once (a sample twice in a batch), a scratch one not at all.
    if (blocks.erase(target) != 0) plan.keeps[i] = const_cast<uint8_t*>(target);
  }
  job_copy_out_ns_ += NanosSince(copy_out_start);
  job_decodes_ += decoded.size();
  if (first) {
    log::Info(
        "GPU {}: a job's process decodes its JPEGs; its first {} took {:.0f} ms, its CUDA "
        "and nvJPEG start-up included",
        device_, targets.size(), done->wait_seconds * 1e3);
  }
  job_decode_ns_ += NanosSince(plan.job_start);
  return left;
}

Status CudaGpuService::FinishLocked(const DeviceBatchRequest& request, const CudaDeviceSlots& slots,
                                    BuildPlan& plan) {
  const size_t n = request.samples.size();
  cudaStream_t stream = stream_.get();
  auto forget_placed = [&]() REQUIRES(mu_) {
    for (auto [id, where] : plan.placed) EraseLocked(id);
  };
  // The blocks only the assembly fills (keeps), where it may not have run.
  auto forget_kept = [&]() REQUIRES(mu_) {
    for (size_t i = 0; i < plan.keeps.size(); ++i) {
      if (plan.keeps[i] != nullptr) EraseLocked(request.sample_ids[i]);
    }
  };
  // Blocks it placed and cannot fill are forgotten on every way out before the fills.
  if (Status s = OnDevice(device_); !s.ok()) {
    forget_placed();
    return s;
  }
  // The assembly may be reading the job's decode buffer: every way out of this build waits for
  // it, so that the job's work after next (the same lane) cannot overwrite what it reads.
  struct SyncOnExit {
    gpu::CudaStream& stream;
    bool armed = false;
    ~SyncOnExit() {
      if (armed) (void)stream.Synchronize();
    }
  } job_reads{stream_};
  if (plan.erasures != erasures_) {
    // A build before this one forgot blocks since this plan (a damaged JPEG or a CUDA error). If
    // this plan reads one of them, it builds from the scratch and staging instead, all decoded
    // here; its own blocks (never evicted while it is in flight) are forgotten unfilled.
    std::unordered_set<uint32_t> gone;
    for (const auto& [at, id] : erased_) {
      if (at > plan.erasures) gone.insert(id);
    }
    bool stale = false;
    for (uint32_t id : request.sample_ids) {
      if (plan.placed.count(id) == 0 && gone.count(id) != 0) {
        stale = true;
        break;
      }
    }
    if (stale) {
      forget_placed();
      if (plan.job_answer && plan.job_answer->ok())
        job_buffers_[request.job_decoder].answered = true;
      BuildPlan again;
      again.turn = plan.turn;
      again.erasures_at_plan = plan.erasures_at_plan;
      PlanLocked(request, /*use_area=*/false, again);
      again.erasures = erasures_;
      plan = std::move(again);
    }
  }
  if (Status s = CopyToDevice(plan.copy_dst, plan.copy_src, plan.copy_bytes, stream); !s.ok()) {
    forget_placed();
    return s;
  }
  if (!plan.decodes.empty()) {
    if (prepared_scratch_.bytes() < plan.scratch_bytes) {
      prepared_scratch_.Reset();
      Result<gpu::DeviceBuffer> buf = gpu::DeviceBuffer::Allocate(plan.scratch_bytes);
      if (!buf.ok()) {
        forget_placed();
        return buf.status();
      }
      prepared_scratch_ = std::move(*buf);
    }
    auto* scratch = static_cast<uint8_t*>(prepared_scratch_.data());
    for (auto [k, offset] : plan.scratch_decodes) plan.decodes[k].dst = scratch + offset;
    for (size_t i = 0; i < n; ++i) {
      if (plan.sources[i] == nullptr && request.samples[i].shape.encoded()) {
        plan.sources[i] = plan.decodes[plan.scratch_index.at(request.sample_ids[i])].dst;
      }
    }
    std::vector<gpu::DecodeTarget> left;
    std::span<const gpu::DecodeTarget> server_decodes = plan.decodes;
    if (plan.job_answer) {
      job_reads.armed = true;
      left = UseJobWorkLocked(request, plan);
      server_decodes = left;
    }
    if (!server_decodes.empty()) {
      if (Status s = DecodeLocked(request, server_decodes); !s.ok()) {
        forget_placed();
        return s;
      }
    }
  }
  uint8_t* base = slots.SlotBase(request.slot);
  const gpu::JobBatchRequest job{*request.spec, plan.views, request.seeds, base,
                                 slots.labels_offset()};
  const std::span<const uint8_t* const> job_sources(plan.sources);
  const std::span<uint8_t* const> job_keeps(plan.keeps);
  const auto assemble_start = std::chrono::steady_clock::now();
  Result<gpu::AssembleStats> stats =
      assembler_->AssembleBatches({&job, 1}, stream, {&job_sources, 1}, {&job_keeps, 1});
  assemble_kernel_ns_ += NanosSince(assemble_start);
  if (!stats.ok()) {
    forget_kept();
    return stats.status();
  }
  // Labels as int64 after the images, from a pinned buffer (reused: the stream is synchronized
  // before the next call writes it).
  const size_t label_bytes = n * sizeof(int64_t);
  if (label_staging_.bytes() < label_bytes) {
    label_staging_.Reset();
    Result<gpu::PinnedHostBuffer> buf = gpu::PinnedHostBuffer::Allocate(AlignUp(label_bytes, 4096));
    if (!buf.ok()) return buf.status();
    label_staging_ = std::move(*buf);
  }
  auto* labels = static_cast<int64_t*>(label_staging_.data());
  for (size_t i = 0; i < n; ++i) labels[i] = request.labels[i];
  if (n > 0) {
    if (Status s = gpu::CudaCheck(cudaMemcpyAsync(base + slots.labels_offset(), labels,
                                                  label_bytes, cudaMemcpyHostToDevice, stream),
                                  "cudaMemcpyAsync(labels)");
        !s.ok()) {
      forget_kept();
      return s;
    }
  }
  // The job is told only after this: it never sees a batch before its kernel has finished.
  const auto sync_start = std::chrono::steady_clock::now();
  if (Status s = stream_.Synchronize(); !s.ok()) {
    forget_placed();  // which of the stream's work failed is not known
    return s;
  }
  sync_ns_ += NanosSince(sync_start);
  batches_ += 1;
  images_ += n;
  uploads_ += plan.uploads + stats->uploads;
  upload_bytes_ += plan.upload_bytes + stats->upload_bytes;
  resident_hits_ += plan.hits;
  resident_evictions_ = area_.evictions();
  resident_bytes_ = area_.resident_bytes();
  resident_blocks_ = area_.size();
  return Status::OK();
}

Result<uint8_t*> CudaGpuService::MapJobBuffer(const JobDecoder* decoder, const std::string& handle,
                                              uint64_t needed) {
  JobBuffer& buffer = job_buffers_[decoder];
  if (buffer.base != nullptr) {
    // The server never asks a job for more than its first work did, so its buffer never moves.
    if (buffer.handle != handle) {
      return Status::Corruption("the job answered with another decode buffer than before");
    }
  } else {
    cudaIpcMemHandle_t h{};
    std::memcpy(&h, handle.data(), sizeof(h));
    void* base = nullptr;
    if (Status s = gpu::CudaCheck(cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess),
                                  "cudaIpcOpenMemHandle(a job's decode buffer)");
        !s.ok()) {
      return s;
    }
    // What the handle really maps, not what the job says: copies never read past it.
    Result<std::pair<uintptr_t, size_t>> range = gpu::AllocationRange(base);
    if (!range.ok()) {
      (void)cudaIpcCloseMemHandle(base);
      return range.status();
    }
    const uint64_t skip = reinterpret_cast<uintptr_t>(base) - range->first;
    buffer.handle = handle;
    buffer.base = base;
    buffer.bytes = range->second - skip;
  }
  if (needed > buffer.bytes) {
    return Status::Corruption(fmt::format(
        "the job's decode buffer maps {} bytes, the work needs {}", buffer.bytes, needed));
  }
  return static_cast<uint8_t*>(buffer.base);
}

void CudaGpuService::ForgetJobDecoder(const JobDecoder* decoder) {
  FairMutexLock lock(mu_);
  auto it = job_buffers_.find(decoder);
  if (it == job_buffers_.end()) return;
  if (OnDevice(device_).ok() && it->second.base != nullptr) {
    (void)cudaIpcCloseMemHandle(it->second.base);
  }
  job_buffers_.erase(it);
}

Status CudaGpuService::DecodeLocked(const DeviceBatchRequest& request,
                                    std::span<const gpu::DecodeTarget> targets) {
  if (request.prepare == nullptr || request.undecodable == nullptr) {
    return Status::InvalidArgument(fmt::format(
        "GPU {}: a batch with {} encoded samples needs their prepare spec and a list for the "
        "undecodable ones",
        device_, targets.size()));
  }
  if (!decode_) {  // a GPU without nvJPEG got encoded samples: the CPU decodes them
    decode_ = std::make_unique<gpu::BatchDecoder>(nullptr, 0);
  }
  const auto start = std::chrono::steady_clock::now();
  gpu::DecodeCounts counts;
  std::vector<std::pair<size_t, Status>> failed;
  Status s = decode_->Decode(*request.prepare, targets, stream_.get(), &failed, &counts);
  decode_ns_ += NanosSince(start);
  auto ns = [](double s) { return static_cast<uint64_t>(s * 1e9); };
  inspect_ns_ += ns(counts.inspect_s);
  nvjpeg_ns_ += ns(counts.decode_s);
  resize_ns_ += ns(counts.resize_s);
  cpu_decode_ns_ += ns(counts.cpu_s);
  decode_wait_ns_ += ns(counts.wait_s);
  gpu_decodes_ += counts.gpu;
  cpu_fallbacks_ += counts.cpu;
  decoded_bytes_ += counts.bytes;
  undecodable_ += counts.failed;
  if (!s.ok()) return s;
  if (failed.empty()) return Status::OK();
  for (auto& [index, why] : failed) {
    EraseLocked(request.sample_ids[index]);  // never resident with pixels it does not have
    request.undecodable->emplace_back(index, std::move(why));
  }
  return Status::Corruption(fmt::format("GPU {}: {} of the batch's {} samples do not decode",
                                        device_, failed.size(), request.samples.size()));
}

// Not analyzed: area_.capacity() is fixed at creation, and taking mu_ would wait out a build.
GpuCounters CudaGpuService::Counters() const NO_THREAD_SAFETY_ANALYSIS {
  GpuCounters c;
  c.device = device_;
  c.name = name_;
  c.batches = batches_.load();
  c.images = images_.load();
  c.uploads = uploads_.load();
  c.upload_bytes = upload_bytes_.load();
  c.resident_hits = resident_hits_.load();
  c.resident_evictions = resident_evictions_.load();
  c.resident_bytes = resident_bytes_.load();
  c.resident_capacity = area_.capacity();  // fixed at creation
  c.pool_bytes = pool_bytes_.load();
  c.pool_slots = pool_slots_.load();
  c.assemble_seconds = static_cast<double>(assemble_ns_.load()) * 1e-9;
  c.decoder = decoder_name_;
  c.gpu_decodes = gpu_decodes_.load();
  c.cpu_fallbacks = cpu_fallbacks_.load();
  c.decoded_bytes = decoded_bytes_.load();
  c.undecodable = undecodable_.load();
  c.decode_seconds = static_cast<double>(decode_ns_.load()) * 1e-9;
  c.job_decodes = job_decodes_.load();
  c.job_decode_failures = job_decode_failures_.load();
  c.overlapped_builds = overlapped_builds_.load();
  c.job_decode_seconds = static_cast<double>(job_decode_ns_.load()) * 1e-9;
  auto seconds = [](const std::atomic<uint64_t>& ns) {
    return static_cast<double>(ns.load()) * 1e-9;
  };
  c.phases = {seconds(lock_ns_),   seconds(inspect_ns_),     seconds(nvjpeg_ns_),
              seconds(resize_ns_), seconds(cpu_decode_ns_), seconds(decode_wait_ns_),
              seconds(sync_ns_),   seconds(job_copy_ns_),    seconds(job_wait_ns_),
              seconds(job_copy_out_ns_), seconds(assemble_kernel_ns_)};
  return c;
}

}  // namespace

int VisibleGpuCount() { return gpu::CudaDeviceCount(); }

Result<std::vector<std::unique_ptr<GpuService>>> CreateGpuServices(
    const GpuServiceOptions& options) {
  std::vector<std::unique_ptr<GpuService>> out;
  if (options.devices.empty()) return out;
  if (gpu::CudaDeviceCount() == 0) {
    return Status::Unavailable(
        "no CUDA device or driver found; start the server with --gpus none to serve CPU jobs");
  }
  for (int device : options.devices) {
    // The first service registers the cache segment once, portably, for all the GPUs; it is
    // destroyed first (vector order), after the engine has stopped every build.
    Result<std::unique_ptr<CudaGpuService>> svc =
        CudaGpuService::Create(device, options, /*register_host=*/out.empty());
    if (!svc.ok()) return svc.status();
    out.push_back(std::move(*svc));
  }
  return out;
}

}  // namespace carpool
