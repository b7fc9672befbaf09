// The engine's view of the GPUs it serves (`carpool server --gpus`). No CUDA type appears here, so
// the engine builds the same with and without CUDA: server/gpu/gpu_service.cc implements it where
// CUDA is built, server/gpu_service_none.cc (every call a clear error) where it is not.
//
// Per GPU: the cache segment registered for DMA once, a device-resident sample area keyed by
// sample id (a sample that several jobs on this GPU use crosses PCIe once while it stays there;
// eviction in the scheduler's next-use order), and the jobs' device batch slots, exported to the
// job's process through legacy CUDA IPC handles. docs/gpu.md says why and how.
#ifndef CARPOOL_SERVER_GPU_SERVICE_H_
#define CARPOOL_SERVER_GPU_SERVICE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "carpool/status.h"
#include "server/job_decode.h"
#include "server/prepare.h"
#include "server/transform.h"

namespace carpool {

// One job's batch slots in device memory: one cudaMalloc of count * stride bytes, exported once.
// Destroying it frees the memory (after the last batch written into it has completed).
class DeviceSlots {
 public:
  virtual ~DeviceSlots() = default;
  virtual int device() const = 0;
  virtual uint32_t count() const = 0;
  virtual uint64_t stride() const = 0;        // bytes between slots; a multiple of 256
  virtual uint64_t slot_bytes() const = 0;    // usable bytes of a slot: images, then int64 labels
  virtual uint64_t labels_offset() const = 0;  // of the int64 labels inside a slot
  virtual const std::string& ipc_handle() const = 0;  // cudaIpcMemHandle_t bytes (64)
  virtual uint64_t ipc_offset() const = 0;  // of slot 0 from the base the handle names
  virtual const std::string& pci_bus_id() const = 0;  // e.g. "0000:1B:00.0", to check the client's
};

// One batch to build on the GPU into slot `slot` of `slots`. The same contract as AssembleBatch
// (server/assemble.h) for spec, samples and seeds; sample_ids key the resident area (a prepared
// sample's bytes are a function of its id); labels are written as int64 after the images.
struct DeviceBatchRequest {
  const TransformSpec* spec = nullptr;
  // Host memory: the cache segment or transient buffers. A view whose shape is encoded() holds a
  // decode=gpu JPEG: Build decodes it (nvJPEG) and resizes it on the GPU into the resident area.
  std::span<const PreparedView> samples;
  const PrepareSpec* prepare = nullptr;  // the dataset's spec; required for encoded views
  std::span<const uint32_t> sample_ids;
  std::span<const uint64_t> seeds;
  std::span<const int32_t> labels;
  DeviceSlots* slots = nullptr;
  uint32_t slot = 0;
  // Filled with (index into samples, why) for encoded samples that neither nvJPEG nor the CPU
  // decodes (damaged files); Build then returns Corruption without building, and the caller
  // builds again without them. Required when any view is encoded.
  std::vector<std::pair<size_t, Status>>* undecodable = nullptr;
  // The job's process, where it decodes for the server (job_decode.h): the build's JPEGs are
  // decoded there and copied into the resident area; what it leaves, the server decodes. Null:
  // the server decodes them all.
  JobDecoder* job_decoder = nullptr;
  // Called once the job's process has this build's JPEGs (never when the server decodes them
  // all): the job's next build may start, so that the job decodes it while this one finishes.
  // From Build's thread, with no lock of the GPU held.
  std::function<void()> job_work_sent;
};

// Counters of one GPU since the server started (read without locks; each is monotonic except
// the byte gauges).
struct GpuCounters {
  int device = 0;
  std::string name;
  uint64_t batches = 0, images = 0;
  uint64_t uploads = 0, upload_bytes = 0;  // samples copied host -> device, and their bytes
  uint64_t resident_hits = 0;              // images whose sample was already on the device
  uint64_t resident_evictions = 0;
  uint64_t resident_bytes = 0, resident_capacity = 0;
  uint64_t pool_bytes = 0;  // device batch slots held by jobs now
  uint64_t pool_slots = 0;
  double assemble_seconds = 0;  // wall time of Build calls: uploads, kernel and wait
  // GPU decode (decode=gpu samples): the backend ("hardware", "gpu-hybrid", "" when off), images
  // nvJPEG decoded, images decoded on the CPU instead (streams it refuses), encoded bytes read,
  // and samples neither could decode.
  std::string decoder;
  uint64_t gpu_decodes = 0, cpu_fallbacks = 0, decoded_bytes = 0, undecodable = 0;
  double decode_seconds = 0;  // of Build's wall time, spent decoding and resizing
  // Decoded in the jobs' own processes (job_decode.h): images, the wall time of those round
  // trips (apart from decode_seconds), and jobs whose decode failed or missed, once each (the
  // server decodes for them from then on).
  uint64_t job_decodes = 0, job_decode_failures = 0;
  double job_decode_seconds = 0;
  // Builds planned while an earlier one waited for its job's decode: the job's next JPEGs went
  // out before the previous build finished.
  uint64_t overlapped_builds = 0;
  // Build's wall time by phase, to tell where a slow build waits: for the previous build (lock),
  // nvJPEG's header parse, its decode call, the resize launch, CPU decode of what nvJPEG refused,
  // the stream between decode batches, and the final wait for the batch's GPU work; with decode
  // in the jobs' processes, copying the JPEGs into the job's segment, waiting for its answer,
  // and pointing the build at its buffer (job_copy_out: the assembly reads it in place and fills
  // the resident blocks, since session 38) and the assembly.
  struct BuildPhases {
    double lock = 0, inspect = 0, nvjpeg = 0, resize = 0, cpu_decode = 0, decode_wait = 0,
           sync = 0, job_copy = 0, job_wait = 0, job_copy_out = 0, assemble = 0;
  } phases;
};

enum class GpuDecode { kOff, kAuto, kOn };
// "auto" | "on" | "off"; InvalidArgument naming the value otherwise.
Result<GpuDecode> ParseGpuDecode(const std::string& text);

class GpuService {
 public:
  virtual ~GpuService() = default;
  virtual int device() const = 0;
  // Allocates and exports `count` slots for batches of up to `batch_size` images of
  // `image_bytes` each. ResourceExhausted (naming the bytes) when the device is full. ~1 ms.
  virtual Result<std::unique_ptr<DeviceSlots>> CreateSlots(uint32_t count, uint32_t batch_size,
                                                           uint64_t image_bytes) = 0;
  // Uploads what is not resident, runs the assembly kernel and copies the labels; returns once
  // the batch is complete in device memory, so the job may read it as soon as it is told.
  // REQUIRES: the sample bytes stay valid until it returns. Thread-safe: calls on one GPU plan
  // one at a time and finish one at a time in the order they planned; between the two, a build
  // whose JPEGs its job decodes waits for the job with no lock held, so the next build plans.
  // Cost: the uploads (PCIe) plus the kernel, about 1 ms for 256 images, plus any decode.
  virtual Status Build(const DeviceBatchRequest& request) = 0;
  virtual GpuCounters Counters() const = 0;
  // The GPU decode backend ("hardware", "gpu-hybrid"), or empty when this GPU does not decode:
  // its jobs then get the CPU's prepared samples. Fixed at creation.
  virtual const std::string& decoder() const = 0;
  // The decoded samples its resident area holds (capacity over the mean block), 0 before its
  // first GPU decode: a decoded sample is shared only while it stays there. O(1), no lock.
  virtual uint64_t DecodedSamplesHeld() const = 0;
  // Unmaps what a job's decoder exported to this GPU; called once its job is gone (no build of it
  // runs or will). Waits for a build in flight.
  virtual void ForgetJobDecoder(const JobDecoder* decoder) = 0;
};

struct GpuServiceOptions {
  std::vector<int> devices;          // CUDA device indices to serve
  uint64_t resident_bytes = 0;       // per GPU; 0: no resident area (upload every use)
  std::span<uint8_t> host_region;    // the cache segment, registered for DMA; may be empty
  // GPU decode: off, auto (on where nvJPEG loads) or on (the server fails to start without it).
  GpuDecode gpu_decode = GpuDecode::kAuto;
  uint64_t decode_bytes = uint64_t{512} << 20;  // cap on the decoded images held at once
  // Next uses (the scheduler's clock) of `samples`, written to `out`; +inf for none. Called from
  // Build while it evicts resident samples, with no engine lock held by the caller.
  std::function<void(std::span<const uint32_t> samples, std::span<double> out)> next_use;
};

// Opens every device of options.devices. Unavailable when built without CUDA or when no GPU is
// found; InvalidArgument naming the device count for an index out of range.
Result<std::vector<std::unique_ptr<GpuService>>> CreateGpuServices(const GpuServiceOptions& options);

// The CUDA devices this process sees (0 without a GPU, a driver or a CUDA build). Never fails.
int VisibleGpuCount();

// "all" | "none" | "0,2,...": the devices to serve. "all" on a machine without GPUs is none.
Result<std::vector<int>> ParseGpuList(const std::string& text, int visible);

}  // namespace carpool

#endif  // CARPOOL_SERVER_GPU_SERVICE_H_
