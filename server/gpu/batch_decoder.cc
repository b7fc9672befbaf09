#include "server/gpu/batch_decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>

namespace carpool::gpu {
namespace {

constexpr uint64_t kAlign = 256;
uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Adds the seconds from its construction to its end to *into.
class PhaseTimer {
 public:
  explicit PhaseTimer(double* into) : into_(into), start_(std::chrono::steady_clock::now()) {}
  ~PhaseTimer() {
    *into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  double* into_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

BatchDecoder::BatchDecoder(std::unique_ptr<JpegDecoder> decoder, uint64_t scratch_bytes,
                           bool cpu_fallback)
    : decoder_(std::move(decoder)),
      scratch_cap_(std::max<uint64_t>(scratch_bytes, 1)),
      cpu_fallback_(cpu_fallback) {}

std::string BatchDecoder::backend() const {
  return decoder_ ? JpegBackendName(decoder_->backend()) : "cpu";
}

Status BatchDecoder::EnsureScratch(uint64_t bytes) {
  if (scratch_.bytes() >= bytes) return Status::OK();
  scratch_.Reset();
  // Grown in steps of a quarter of the cap, so that a growing batch does not reallocate often.
  const uint64_t step = std::max<uint64_t>(scratch_cap_ / 4, kAlign);
  Result<DeviceBuffer> buf = DeviceBuffer::Allocate((bytes + step - 1) / step * step);
  if (!buf.ok()) {
    return Status::ResourceExhausted(fmt::format(
        "GPU decode: no device memory for {} bytes of decoded images ({}); lower "
        "--gpu-decode-memory or --gpu-cache-size",
        bytes, buf.status().message()));
  }
  scratch_ = std::move(*buf);
  return Status::OK();
}

Status BatchDecoder::Resize(std::span<const ResizeImage> images, cudaStream_t stream) {
  if (images.empty()) return Status::OK();
  const size_t bytes = images.size() * sizeof(ResizeImage);
  if (staging_.bytes() < bytes) {
    staging_.Reset();
    descriptors_.Reset();
    Result<PinnedHostBuffer> host = PinnedHostBuffer::Allocate(AlignUp(bytes));
    if (!host.ok()) return host.status();
    staging_ = std::move(*host);
    Result<DeviceBuffer> device = DeviceBuffer::Allocate(AlignUp(bytes));
    if (!device.ok()) return device.status();
    descriptors_ = std::move(*device);
  }
  std::copy(images.begin(), images.end(), static_cast<ResizeImage*>(staging_.data()));
  if (Status s = CudaCheck(cudaMemcpyAsync(descriptors_.data(), staging_.data(), bytes,
                                           cudaMemcpyHostToDevice, stream),
                           "cudaMemcpyAsync(resize descriptors)");
      !s.ok()) {
    return s;
  }
  int max_pixels = 0;
  for (const ResizeImage& im : images) {
    max_pixels = std::max(max_pixels, im.geometry.out_width * im.geometry.out_height);
  }
  return CudaCheck(LaunchExactResize(static_cast<const ResizeImage*>(descriptors_.data()),
                                     static_cast<int>(images.size()), max_pixels, stream),
                   "exact resize kernel launch");
}

Status BatchDecoder::DecodeOnGpu(const PrepareSpec& spec,
                                 std::span<const DecodeTarget* const> batch,
                                 std::span<const JpegFacts> facts, cudaStream_t stream,
                                 std::vector<const DecodeTarget*>* cpu, DecodeCounts* counts) {
  const size_t n = batch.size();
  std::vector<uint64_t> offsets(n);
  std::vector<uint32_t> pitches(n);
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    pitches[i] = facts[i].width * 3;
    offsets[i] = total;
    total += AlignUp(uint64_t{pitches[i]} * facts[i].height);
  }
  if (Status s = EnsureScratch(total); !s.ok()) return s;
  auto* base = static_cast<uint8_t*>(scratch_.data());
  std::vector<std::span<const uint8_t>> streams(n);
  std::vector<uint8_t*> outs(n);
  for (size_t i = 0; i < n; ++i) {
    streams[i] = batch[i]->encoded;
    outs[i] = base + offsets[i];
  }
  std::vector<bool> decoded(n, true);
  std::optional<PhaseTimer> timer(std::in_place, &counts->decode_s);
  if (!decoder_->DecodeBatch(streams, outs, pitches, stream).ok()) {
    // One bad stream fails its whole batch: find it by decoding one at a time.
    for (size_t i = 0; i < n; ++i) {
      decoded[i] = decoder_->DecodeBatch({&streams[i], 1}, {&outs[i], 1}, {&pitches[i], 1}, stream)
                       .ok();
    }
  }
  timer.emplace(&counts->resize_s);
  std::vector<ResizeImage> images;
  images.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const DecodeTarget& t = *batch[i];
    Result<ResizeCropGeometry> g = decoded[i] ? ResizeCropFor(spec, static_cast<int>(facts[i].width),
                                                              static_cast<int>(facts[i].height))
                                              : Result<ResizeCropGeometry>(Status::Corruption(""));
    if (!g.ok() || g->out_width != t.shape.width || g->out_height != t.shape.height ||
        t.shape.channels != 3) {
      cpu->push_back(&t);  // the CPU decodes it, or says why it cannot
      continue;
    }
    images.push_back(ResizeImage{*g, outs[i], t.dst, pitches[i], 3});
    ++counts->gpu;
  }
  return Resize(images, stream);
}

Status BatchDecoder::Decode(const PrepareSpec& spec, std::span<const DecodeTarget> targets,
                            cudaStream_t stream, std::vector<std::pair<size_t, Status>>* failed,
                            DecodeCounts* counts) {
  std::vector<const DecodeTarget*> gpu, cpu;
  std::vector<JpegFacts> facts;
  std::optional<PhaseTimer> timer(std::in_place, &counts->inspect_s);
  for (const DecodeTarget& t : targets) {
    counts->bytes += t.encoded.size();
    if (decoder_) {
      JpegFacts f = decoder_->Inspect(t.encoded);
      if (f.supported) {
        gpu.push_back(&t);
        facts.push_back(std::move(f));
        continue;
      }
    }
    cpu.push_back(&t);
  }
  timer.reset();
  // Decode batches bounded by nvJPEG's batch and by the scratch cap (at least one image each).
  for (size_t at = 0; at < gpu.size();) {
    uint64_t bytes = 0;
    size_t end = at;
    while (end < gpu.size() && end - at < decoder_->max_batch()) {
      const uint64_t b = AlignUp(uint64_t{facts[end].width} * 3 * facts[end].height);
      if (end > at && bytes + b > scratch_cap_) break;
      bytes += b;
      ++end;
    }
    if (Status s = DecodeOnGpu(spec, std::span(gpu).subspan(at, end - at),
                               std::span(facts).subspan(at, end - at), stream, &cpu, counts);
        !s.ok()) {
      return s;
    }
    at = end;
    if (at == gpu.size()) break;
    // The scratch and the descriptor table are reused by the next decode batch.
    PhaseTimer wait(&counts->wait_s);
    if (Status s = CudaCheck(cudaStreamSynchronize(stream), "cudaStreamSynchronize(decode)");
        !s.ok()) {
      return s;
    }
  }
  timer.emplace(&counts->cpu_s);
  std::vector<PreparedImage> host;  // alive until the copies below have completed
  host.reserve(cpu.size());
  for (const DecodeTarget* t : cpu) {
    if (!cpu_fallback_) {
      failed->emplace_back(t->index,
                           Status::Unavailable("left to the server: nvJPEG does not decode it"));
      ++counts->failed;
      continue;
    }
    Result<PreparedImage> image = PrepareGpuPixelsOnCpu(spec, t->encoded);
    if (image.ok() && !(image->shape == t->shape)) {
      image = Status::Corruption(fmt::format(
          "decodes to {}x{}x{}, but its header gave {}x{}x{}", image->shape.height,
          image->shape.width, image->shape.channels, t->shape.height, t->shape.width,
          t->shape.channels));
    }
    if (!image.ok()) {
      failed->emplace_back(t->index, image.status());
      ++counts->failed;
      continue;
    }
    host.push_back(std::move(*image));
    if (Status s = CudaCheck(cudaMemcpyAsync(t->dst, host.back().pixels.data(),
                                             host.back().pixels.size(), cudaMemcpyHostToDevice,
                                             stream),
                             "cudaMemcpyAsync(CPU-decoded sample)");
        !s.ok()) {
      return s;
    }
    ++counts->cpu;
  }
  if (host.empty()) return Status::OK();  // the caller's later work is ordered after ours
  timer.emplace(&counts->wait_s);
  return CudaCheck(cudaStreamSynchronize(stream), "cudaStreamSynchronize(decode)");
}

}  // namespace carpool::gpu
