#include "server/gpu/gpu_assembler.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "server/assemble.h"
#include "server/gpu/assemble_kernel.h"
#include "server/gpu/device_probe.h"

namespace carpool::gpu {
namespace {

constexpr size_t kNoUpload = static_cast<size_t>(-1);
constexpr size_t kStagingAlign = 256;  // each sample starts on a fresh 256-byte segment
constexpr size_t kGrowQuantum = size_t{1} << 20;
constexpr int kPixelsPerThread = 8;  // work per thread before another block pays off
constexpr int kMaxBlocksPerImage = 64;

size_t AlignUp(size_t n, size_t align) { return (n + align - 1) / align * align; }

Status CheckDeviceDestination(int job, const JobBatchRequest& req, int device) {
  if (req.device_dst == nullptr) {
    return Status::InvalidArgument(
        fmt::format("job {}: device_dst is null; give a device buffer of at least the batch size",
                    job));
  }
  if (reinterpret_cast<uintptr_t>(req.device_dst) % DTypeBytes(req.spec.dtype) != 0) {
    return Status::InvalidArgument(fmt::format("job {}: device_dst {} is not aligned for {}", job,
                                               req.device_dst, DTypeName(req.spec.dtype)));
  }
  cudaPointerAttributes attr{};
  if (Status s = CudaCheck(cudaPointerGetAttributes(&attr, req.device_dst),
                           fmt::format("job {}: cudaPointerGetAttributes", job));
      !s.ok()) {
    return s;
  }
  const bool on_device = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  if (!on_device || attr.device != device) {
    return Status::InvalidArgument(fmt::format(
        "job {}: device_dst {} is not device memory of CUDA device {} (memory type {}, device "
        "{}); allocate it with cudaMalloc on that device",
        job, req.device_dst, device, static_cast<int>(attr.type), attr.device));
  }
  return Status::OK();
}

}  // namespace

// The host-side result of checking a call: descriptor tables, the unique samples and the copies
// that move them.
struct GpuAssembler::Plan {
  struct Upload {
    const uint8_t* host = nullptr;
    PreparedShape shape;
    size_t offset = 0;  // in staging, set by Finish
  };
  struct Copy {  // one cudaMemcpyAsync: samples adjacent in host memory travel together
    const uint8_t* host = nullptr;
    size_t offset = 0;
    size_t bytes = 0;
  };
  std::vector<KernelJob> jobs;
  std::vector<KernelImage> images;  // src is set by Finish, or at once for device sources
  std::vector<size_t> image_upload;  // per image: its upload, or kNoUpload for a device source
  std::vector<Upload> uploads;
  std::vector<Copy> copies;
  size_t staging_bytes = 0;
  size_t upload_bytes = 0;
  size_t output_bytes = 0;
  size_t images_offset = 0;  // of the image table in the descriptor buffer
  size_t descriptor_bytes = 0;
  int blocks_per_image = 1;

  Status Add(int job, const JobBatchRequest& req, std::span<const uint8_t* const> device_sources,
             std::span<uint8_t* const> device_keeps, int device,
             std::unordered_map<const uint8_t*, size_t>& unique);
  void Finish();
};

// Lays the unique samples out in staging in host-address order, so that samples adjacent in
// host memory (neighbouring cache slots) become one copy, and points the images at them.
void GpuAssembler::Plan::Finish() {
  std::vector<size_t> order(uploads.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return uploads[a].host < uploads[b].host; });
  for (size_t i : order) {
    Upload& up = uploads[i];
    const size_t bytes = up.shape.bytes();
    up.offset = staging_bytes;
    if (!copies.empty() && copies.back().host + copies.back().bytes == up.host &&
        copies.back().offset + copies.back().bytes == up.offset) {
      copies.back().bytes += bytes;
    } else {
      copies.push_back({up.host, up.offset, bytes});
    }
    staging_bytes += AlignUp(bytes, kStagingAlign);
    upload_bytes += bytes;
  }
  // src holds the staging offset until Enqueue knows the staging base.
  for (size_t i = 0; i < images.size(); ++i) {
    if (image_upload[i] != kNoUpload) {
      images[i].src = reinterpret_cast<const uint8_t*>(uploads[image_upload[i]].offset);
    }
  }
  images_offset = AlignUp(jobs.size() * sizeof(KernelJob), 16);
  descriptor_bytes = images_offset + images.size() * sizeof(KernelImage);
}

Status GpuAssembler::Plan::Add(int job, const JobBatchRequest& req,
                               std::span<const uint8_t* const> device_sources,
                               std::span<uint8_t* const> device_keeps, int device,
                               std::unordered_map<const uint8_t*, size_t>& unique) {
  if (req.seeds.size() != req.samples.size()) {
    return Status::InvalidArgument(fmt::format("job {}: batch has {} samples but {} seeds", job,
                                               req.samples.size(), req.seeds.size()));
  }
  Result<ImageShape> shape = BatchImageShape(req.spec, req.samples);
  if (!shape.ok()) {
    return Status(shape.status().code(), fmt::format("job {}: {}", job, shape.status().message()));
  }
  if (Status s = CheckDeviceDestination(job, req, device); !s.ok()) return s;
  const size_t image_bytes = shape->bytes();
  if (req.dst_bytes < image_bytes * req.samples.size()) {
    return Status::InvalidArgument(
        fmt::format("job {}: device_dst holds {} bytes; {} images of {} bytes need {}", job,
                    req.dst_bytes, req.samples.size(), image_bytes,
                    image_bytes * req.samples.size()));
  }

  KernelJob kj{};
  for (size_t c = 0; c < req.spec.mean.size(); ++c) {
    kj.mean[c] = req.spec.mean[c];
    kj.std[c] = req.spec.std[c];
  }
  kj.channels = shape->channels;
  kj.out_height = shape->height;
  kj.out_width = shape->width;
  kj.dtype = static_cast<uint8_t>(req.spec.dtype);
  kj.layout = static_cast<uint8_t>(req.spec.layout);
  kj.normalize = req.spec.normalize ? 1 : 0;
  jobs.push_back(kj);

  // An image's work: its output pixels, or, where it keeps its sample, the sample's 16-byte
  // words if more (the batch's samples share one shape).
  size_t work = static_cast<size_t>(shape->height) * shape->width;
  if (std::any_of(device_keeps.begin(), device_keeps.end(), [](auto* k) { return k != nullptr; })) {
    work = std::max(work, (req.samples.front().shape.bytes() + 15) / 16);
  }
  const size_t per_block = size_t{kKernelThreads} * kPixelsPerThread;
  blocks_per_image = std::max(blocks_per_image, static_cast<int>(std::min<size_t>(
                                                    (work + per_block - 1) / per_block,
                                                    kMaxBlocksPerImage)));

  if (!device_sources.empty() && device_sources.size() != req.samples.size()) {
    return Status::InvalidArgument(fmt::format("job {}: {} device sources for {} samples", job,
                                               device_sources.size(), req.samples.size()));
  }
  if (!device_keeps.empty() && device_keeps.size() != req.samples.size()) {
    return Status::InvalidArgument(fmt::format("job {}: {} device keeps for {} samples", job,
                                               device_keeps.size(), req.samples.size()));
  }
  auto* dst = static_cast<std::byte*>(req.device_dst);
  for (size_t i = 0; i < req.samples.size(); ++i) {
    const PreparedView& view = req.samples[i];
    const CropWindow w = DrawCropWindow(req.spec, view.shape, req.seeds[i]);
    KernelImage image{.src = nullptr,
                      .dst = dst + i * image_bytes,
                      .src_width = view.shape.width,
                      .y = w.y,
                      .x = w.x,
                      .flip = w.flip ? 1 : 0,
                      .job = job,
                      .reserved = 0,
                      .keep = nullptr,
                      .keep_bytes = 0};
    uint8_t* keep = device_keeps.empty() ? nullptr : device_keeps[i];
    if (keep != nullptr && (device_sources.empty() || device_sources[i] == nullptr)) {
      return Status::InvalidArgument(fmt::format(
          "job {} sample {}: a device keep {} without a device source; a sample is kept only "
          "from device memory",
          job, i, static_cast<const void*>(keep)));
    }
    if (!device_sources.empty() && device_sources[i] != nullptr) {
      image.src = device_sources[i];
      image.keep = keep;
      image.keep_bytes = keep == nullptr ? 0 : view.shape.bytes();
      images.push_back(image);
      image_upload.push_back(kNoUpload);
      continue;
    }
    auto [it, inserted] = unique.try_emplace(view.data, uploads.size());
    if (inserted) {
      uploads.push_back({view.data, view.shape, 0});
    } else if (uploads[it->second].shape != view.shape) {
      const PreparedShape& seen = uploads[it->second].shape;
      return Status::InvalidArgument(fmt::format(
          "job {} sample {}: host address {} was given as {}x{}x{} and as {}x{}x{}; one address "
          "must be one prepared sample",
          job, i, static_cast<const void*>(view.data), seen.height, seen.width, seen.channels,
          view.shape.height, view.shape.width, view.shape.channels));
    }
    images.push_back(image);
    image_upload.push_back(it->second);
  }
  output_bytes += image_bytes * req.samples.size();
  return Status::OK();
}

Result<std::unique_ptr<GpuAssembler>> GpuAssembler::Create(int device) {
  const int count = CudaDeviceCount();
  if (count == 0) {
    return Status::Unavailable(
        "no CUDA device: cannot assemble batches on a GPU; use the CPU batch path");
  }
  if (device < 0 || device >= count) {
    return Status::InvalidArgument(
        fmt::format("CUDA device {} does not exist; this machine has {} (0..{})", device, count,
                    count - 1));
  }
  if (Status s = CudaCheck(cudaSetDevice(device), fmt::format("cudaSetDevice({})", device));
      !s.ok()) {
    return s;
  }
  std::unique_ptr<GpuAssembler> assembler(new GpuAssembler(device));
  Result<CudaEvent> done = CudaEvent::Create();
  if (!done.ok()) return done.status();
  Result<CudaEvent> copied = CudaEvent::Create();
  if (!copied.ok()) return copied.status();
  assembler->done_ = std::move(*done);
  assembler->tables_copied_ = std::move(*copied);
  return assembler;
}

GpuAssembler::~GpuAssembler() {
  // The buffers may still be in use by the last kernel; freeing waits, but say so explicitly.
  if (done_) CudaCheckNoThrow(cudaEventSynchronize(done_.get()), "cudaEventSynchronize");
}

Status GpuAssembler::Reserve(const Plan& plan) {
  const bool grow_staging = staging_.bytes() < plan.staging_bytes;
  const bool grow_tables = descriptors_.bytes() < plan.descriptor_bytes;
  if (!grow_staging && !grow_tables) return Status::OK();
  // The last call's copies and kernel may still read the buffers being replaced.
  if (Status s = done_.Synchronize(); !s.ok()) return s;
  if (grow_staging) {
    staging_.Reset();
    Result<DeviceBuffer> buf = DeviceBuffer::Allocate(AlignUp(plan.staging_bytes, kGrowQuantum));
    if (!buf.ok()) return buf.status();
    staging_ = std::move(*buf);
  }
  if (grow_tables) {
    const size_t bytes = AlignUp(plan.descriptor_bytes, size_t{64} << 10);
    descriptors_.Reset();
    host_descriptors_.Reset();
    Result<DeviceBuffer> dev = DeviceBuffer::Allocate(bytes);
    if (!dev.ok()) return dev.status();
    Result<PinnedHostBuffer> host = PinnedHostBuffer::Allocate(bytes);
    if (!host.ok()) return host.status();
    descriptors_ = std::move(*dev);
    host_descriptors_ = std::move(*host);
  }
  return Status::OK();
}

Status GpuAssembler::Enqueue(const Plan& plan, cudaStream_t stream) {
  // Staging and tables are reused: the device waits for the last call's kernel, the host only
  // for the last copy out of the pinned table before rewriting it.
  if (Status s = CudaCheck(cudaStreamWaitEvent(stream, done_.get(), 0), "cudaStreamWaitEvent");
      !s.ok()) {
    return s;
  }
  if (Status s = tables_copied_.Synchronize(); !s.ok()) return s;
  auto* host = static_cast<std::byte*>(host_descriptors_.data());
  auto* staging = static_cast<uint8_t*>(staging_.data());
  std::memcpy(host, plan.jobs.data(), plan.jobs.size() * sizeof(KernelJob));
  auto* host_images = reinterpret_cast<KernelImage*>(host + plan.images_offset);
  std::memcpy(host_images, plan.images.data(), plan.images.size() * sizeof(KernelImage));
  for (size_t i = 0; i < plan.images.size(); ++i) {  // staging offsets become addresses
    if (plan.image_upload[i] != kNoUpload) {
      host_images[i].src = staging + reinterpret_cast<uintptr_t>(plan.images[i].src);
    }
  }
  if (Status s = CudaCheck(cudaMemcpyAsync(descriptors_.data(), host, plan.descriptor_bytes,
                                           cudaMemcpyHostToDevice, stream),
                           "cudaMemcpyAsync(descriptor tables)");
      !s.ok()) {
    return s;
  }
  if (Status s = tables_copied_.Record(stream); !s.ok()) return s;
  for (const Plan::Copy& copy : plan.copies) {
    if (Status s = CudaCheck(cudaMemcpyAsync(staging + copy.offset, copy.host, copy.bytes,
                                             cudaMemcpyHostToDevice, stream),
                             "cudaMemcpyAsync(samples to staging)");
        !s.ok()) {
      return s;
    }
  }
  total_uploads_ += plan.uploads.size();
  auto* tables = static_cast<std::byte*>(descriptors_.data());
  if (Status s = CudaCheck(
          LaunchAssembleKernel(reinterpret_cast<const KernelJob*>(tables),
                               reinterpret_cast<const KernelImage*>(tables + plan.images_offset),
                               static_cast<int>(plan.images.size()), plan.blocks_per_image,
                               stream),
          "AssembleKernel launch");
      !s.ok()) {
    return s;
  }
  return done_.Record(stream);
}

Result<AssembleStats> GpuAssembler::AssembleBatches(
    std::span<const JobBatchRequest> jobs, cudaStream_t stream,
    std::span<const std::span<const uint8_t* const>> device_sources,
    std::span<const std::span<uint8_t* const>> device_keeps) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    return Status::InvalidArgument(
        "AssembleBatches needs a created stream, not the default stream; use CudaStream::Create");
  }
  if (Status s = CudaCheck(cudaSetDevice(device_), fmt::format("cudaSetDevice({})", device_));
      !s.ok()) {
    return s;
  }
  AssembleStats stats;
  stats.jobs = jobs.size();
  if (jobs.empty()) {
    stats.staging_capacity = staging_.bytes();
    return stats;
  }
  Plan plan;
  std::unordered_map<const uint8_t*, size_t> unique;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const std::span<const uint8_t* const> sources =
        j < device_sources.size() ? device_sources[j] : std::span<const uint8_t* const>();
    const std::span<uint8_t* const> keeps =
        j < device_keeps.size() ? device_keeps[j] : std::span<uint8_t* const>();
    if (Status s = plan.Add(static_cast<int>(j), jobs[j], sources, keeps, device_, unique);
        !s.ok()) {
      return s;
    }
  }
  plan.Finish();
  if (Status s = Reserve(plan); !s.ok()) return s;
  if (Status s = Enqueue(plan, stream); !s.ok()) return s;

  stats.images = plan.images.size();
  stats.uploads = plan.uploads.size();
  stats.upload_copies = plan.copies.size();
  stats.upload_bytes = plan.upload_bytes;
  stats.output_bytes = plan.output_bytes;
  stats.staging_capacity = staging_.bytes();
  return stats;
}

}  // namespace carpool::gpu
