#include "server/gpu/jpeg_bench_rows.h"

#include <fmt/format.h>
#include <turbojpeg.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>

namespace carpool::gpu {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

std::vector<uint8_t> NoisyPhotoJpeg(int w, int h, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0, 18);
  std::vector<uint8_t> rgb(size_t(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const float base[3] = {255.f * x / w, 255.f * y / h, 128.f};
      for (int c = 0; c < 3; ++c) {
        rgb[(size_t(y) * w + x) * 3 + c] =
            static_cast<uint8_t>(std::clamp(base[c] + noise(rng), 0.f, 255.f));
      }
    }
  }
  tjhandle tj = tjInitCompress();
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  tjCompress2(tj, rgb.data(), w, 0, h, TJPF_RGB, &jpeg, &size, TJSAMP_420, 90, 0);
  std::vector<uint8_t> out(jpeg, jpeg + size);
  tjFree(jpeg);
  tjDestroy(tj);
  return out;
}

// The JPEGs copied into pinned memory, as the registered cache holds them; `held` views them.
Result<PinnedHostBuffer> Pin(const std::vector<std::vector<uint8_t>>& jpegs,
                             std::vector<std::span<const uint8_t>>* held) {
  size_t total = 0;
  for (const auto& j : jpegs) total += j.size();
  Result<PinnedHostBuffer> pinned = PinnedHostBuffer::Allocate(total);
  if (!pinned.ok()) return pinned;
  auto* at = static_cast<uint8_t*>(pinned->data());
  for (const auto& j : jpegs) {
    std::memcpy(at, j.data(), j.size());
    held->emplace_back(at, j.size());
    at += j.size();
  }
  return pinned;
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Result<Variant> ParseVariant(const std::string& text) {
  Variant v;
  v.name = text;
  size_t at = 0;
  bool first = true;
  while (at <= text.size()) {
    const size_t plus = std::min(text.find('+', at), text.size());
    const std::string part = text.substr(at, plus - at);
    if (first && part == "hardware") v.options.prefer = JpegBackend::kHardware;
    else if (first && part == "gpu-hybrid") v.options.prefer = JpegBackend::kGpuHybrid;
    else if (!first && part == "pools") v.options.memory_pools = true;
    else if (!first && part == "device")
      v.options.device_input = true;
    else if (!first && part == "prealloc") {
      v.options.preallocate_width = 1;  // as nvImageCodec does: the pool, not a size
      v.options.preallocate_height = 1;
    } else if (!first && part == "yuv") v.output = JpegOutput::kYuvPlanar;
    else if (!first && part == "nv12") v.output = JpegOutput::kNv12;
    else {
      return Status::InvalidArgument(
          "variant '" + text +
          "': give hardware or gpu-hybrid, then any of +pools, +prealloc, "
          "+device, +yuv, +nv12");
    }
    first = false;
    at = plus + 1;
  }
  if (v.options.preallocate_width > 0 && v.options.prefer != JpegBackend::kHardware) {
    return Status::InvalidArgument("variant '" + text +
                                   "': +prealloc is nvJPEG's hardware decoder's; drop it for "
                                   "gpu-hybrid");
  }
  return v;
}

// nvJPEG alone (no resize) in one variant for `seconds`, one batch at a time: its rate, the mean
// call per batch and its Unix start and end, to line it up with a training process beside it.
Result<std::string> VariantRow(const std::vector<std::vector<uint8_t>>& jpegs, int w, int h,
                               size_t batch, double seconds, const Variant& v) {
  if (batch == 0 || jpegs.size() < batch || !(seconds > 0)) {
    return Status::InvalidArgument(fmt::format(
        "variant {}: {} JPEGs for batches of {} over {} s; give at least one batch of JPEGs and "
        "a positive time",
        v.name, jpegs.size(), batch, seconds));
  }
  std::vector<std::span<const uint8_t>> held;
  Result<PinnedHostBuffer> pinned = Pin(jpegs, &held);
  Result<std::unique_ptr<JpegDecoder>> d = JpegDecoder::Create(uint32_t(batch), v.options);
  Result<CudaStream> stream = CudaStream::Create();
  const size_t per_image = size_t(w) * h * 3;
  Result<DeviceBuffer> out = DeviceBuffer::Allocate(per_image * batch);
  for (const Status& s : {pinned.status(), d.status(), stream.status(), out.status()}) {
    if (!s.ok()) return Status(s.code(), fmt::format("variant {}: set-up: {}", v.name, s.ToString()));
  }
  std::vector<JpegPlanes> planes(batch);
  for (size_t i = 0; i < batch; ++i) {
    uint8_t* base = static_cast<uint8_t*>(out->data()) + i * per_image;
    const uint32_t y = uint32_t(w), c = uint32_t((w + 1) / 2);
    planes[i].data[0] = base;
    planes[i].data[1] = base + size_t(w) * h;
    planes[i].data[2] = base + size_t(w) * h * 2;
    planes[i].pitch[0] = v.output == JpegOutput::kRgbInterleaved ? y * 3 : y;
    planes[i].pitch[1] = v.output == JpegOutput::kNv12 ? (y + 1) / 2 * 2 : c;
    planes[i].pitch[2] = c;
  }
  size_t images = 0;
  double call_s = 0;
  const double unix_begin = UnixSeconds();
  const auto begin = Clock::now();
  for (size_t first = 0; std::chrono::duration<double>(Clock::now() - begin).count() < seconds;
       first = (first + batch) % (held.size() / batch * batch)) {
    const std::span<const std::span<const uint8_t>> part(held.data() + first, batch);
    const auto call = Clock::now();
    if (Status s = (*d)->DecodePlanes(part, planes, v.output, stream->get()); !s.ok()) {
      return Status::Internal(fmt::format("variant {}: {}", v.name, s.ToString()));
    }
    if (Status s = stream->Synchronize(); !s.ok()) return s;
    call_s += std::chrono::duration<double>(Clock::now() - call).count();
    images += batch;
  }
  const double secs = std::chrono::duration<double>(Clock::now() - begin).count();
  return fmt::format(
      "variant {} ({}{}, output {}): {:.0f} img/s; decode call {:.2f} ms a batch of "
      "{}; from {:.1f} to {:.1f}",
      v.name, JpegBackendName((*d)->backend()),
      (*d)->device_input() ? ", JPEGs from device memory" : "", JpegOutputName(v.output),
      double(images) / secs, 1e3 * call_s / double(images / batch), batch, unix_begin,
      UnixSeconds());
}

}  // namespace carpool::gpu
