// Batch assembly on a GPU: several jobs' batches from one upload of their prepared samples.
// Each unique sample (by host address) crosses PCIe once per call into a device staging area,
// then one kernel gathers, crops, flips, normalizes and converts every job's images into that
// job's device buffer. The results are byte-identical to the CPU AssembleBatch
// (server/assemble.h) for every dtype and layout; docs/gpu.md says why.
// Thread-compatible: callers serialize calls on one GpuAssembler (it owns the staging area).
#ifndef CARPOOL_SERVER_GPU_GPU_ASSEMBLER_H_
#define CARPOOL_SERVER_GPU_GPU_ASSEMBLER_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "carpool/status.h"
#include "server/gpu/cuda_check.h"
#include "server/prepare.h"
#include "server/transform.h"

namespace carpool::gpu {

// One job's batch: the same contract as AssembleBatch(spec, samples, seeds, dst, dst_bytes),
// except that dst is device memory of the assembler's device.
struct JobBatchRequest {
  TransformSpec spec;
  std::span<const PreparedView> samples;  // host memory; pageable, pinned or registered
  std::span<const uint64_t> seeds;        // one per sample, e.g. SampleSeed(job, epoch, id)
  void* device_dst = nullptr;             // [B, ...] images, aligned for spec.dtype
  size_t dst_bytes = 0;
};

// What one AssembleBatches call did.
struct AssembleStats {
  size_t jobs = 0;
  size_t images = 0;           // sum of the batch sizes
  size_t uploads = 0;          // samples copied host to device: the unique samples
  size_t upload_copies = 0;    // cudaMemcpyAsync calls: samples adjacent in host memory share one
  size_t upload_bytes = 0;     // bytes copied host to device
  size_t output_bytes = 0;     // bytes written to the jobs' buffers
  size_t staging_capacity = 0; // device staging bytes held after the call
};

class GpuAssembler {
 public:
  // Binds to `device` (made current on the calling thread). Unavailable without a GPU,
  // InvalidArgument for a device index out of range.
  static Result<std::unique_ptr<GpuAssembler>> Create(int device);
  ~GpuAssembler();
  GpuAssembler(const GpuAssembler&) = delete;
  GpuAssembler& operator=(const GpuAssembler&) = delete;

  // Checks every job first (the AssembleBatch checks, plus: device_dst is device memory of this
  // device, a host address is one sample of one shape); on error nothing is enqueued. Then, on
  // `stream` (never the default stream), copies each unique sample once, and launches one kernel
  // for all jobs. Returns once the work is enqueued; the outputs are ready when `stream` reaches
  // this point (synchronize it or record an event).
  // REQUIRES: the sample bytes stay valid and unchanged until then; samples in registered or
  // pinned memory are copied by DMA, asynchronously; pageable ones through CUDA's bounce buffer.
  // Calls on different streams are ordered against each other through the staging area.
  // device_sources: empty, or one span per job that is empty or holds one entry per sample; a
  // non-null entry is that sample's bytes already on this device (a resident area, or a job's
  // decode buffer), read in place and not uploaded.
  // device_keeps: empty, or shaped as device_sources; a non-null entry (only beside a device
  // source) is device memory of this device that the kernel also fills with that whole sample
  // (the shape's bytes()), as it reads it: a resident block filled without a copy of its own.
  // Where two images keep one sample, give it to one of them. A keep must not overlap any
  // source the call reads (the kernel reads and writes them at once); not checked.
  Result<AssembleStats> AssembleBatches(
      std::span<const JobBatchRequest> jobs, cudaStream_t stream,
      std::span<const std::span<const uint8_t* const>> device_sources = {},
      std::span<const std::span<uint8_t* const>> device_keeps = {});

  int device() const { return device_; }
  // Samples copied host to device over the assembler's life.
  size_t total_uploads() const { return total_uploads_; }

 private:
  struct Plan;
  explicit GpuAssembler(int device) : device_(device) {}
  Status Reserve(const Plan& plan);
  Status Enqueue(const Plan& plan, cudaStream_t stream);

  int device_;
  DeviceBuffer staging_;          // unique samples, each at a 256-byte aligned offset
  DeviceBuffer descriptors_;      // the job and image tables the kernel reads
  PinnedHostBuffer host_descriptors_;  // their source, reused once the last copy finished
  CudaEvent done_;           // after the last call's kernel: guards staging and device tables
  CudaEvent tables_copied_;  // after the last copy out of host_descriptors_
  size_t total_uploads_ = 0;
};

}  // namespace carpool::gpu

#endif  // CARPOOL_SERVER_GPU_GPU_ASSEMBLER_H_
