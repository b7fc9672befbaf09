// carpool_jpeg_decode_bench: JPEG decode throughput on this machine, in one run: nvJPEG's
// hardware backend (the JPEG engines), its GPU-hybrid backend, and libjpeg-turbo on the CPU
// (one thread, and every core), on synthetic 500x375 quality-90 photos like the bench set's.
//   carpool_jpeg_decode_bench [--images N] [--batch B] [--rounds R] [--threads K] [--seconds S]
//                             [--backend hardware|gpu-hybrid] [--variants V,V,... [--gap S]]
// --threads K (K >= 2) adds rows of 1, 2, 4, ... up to K threads, each thread with its own
// decoder (--backend, default hardware where the GPU has engines) and stream, running the
// server's path at once for S seconds (default 10): whether concurrent builds overlap their
// decodes, alone or beside another process's training. Each such row gives its start and end
// (Unix seconds) to line it up with what runs beside it. --variants runs only nvJPEG (no resize)
// in each variant ("hardware+pools+prealloc", "gpu-hybrid+nv12": backend, memory pools, buffers
// pre-allocated, output format) for S seconds, G seconds apart (--gap, default 3).
#include <turbojpeg.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <latch>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "server/gpu/batch_decoder.h"
#include "server/gpu/cuda_check.h"
#include "server/gpu/device_probe.h"
#include "server/gpu/jpeg_bench_rows.h"
#include "server/gpu/jpeg_decoder.h"

namespace carpool::gpu {
namespace {

using Clock = std::chrono::steady_clock;

double CpuRate(const std::vector<std::vector<uint8_t>>& jpegs, int w, int h, unsigned threads) {
  const auto begin = Clock::now();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      tjhandle tj = tjInitDecompress();
      std::vector<uint8_t> rgb(size_t(w) * h * 3);
      for (size_t i = t; i < jpegs.size(); i += threads) {
        tjDecompress2(tj, jpegs[i].data(), jpegs[i].size(), rgb.data(), w, 0, h, TJPF_RGB, 0);
      }
      tjDestroy(tj);
    });
  }
  for (auto& th : pool) th.join();
  return double(jpegs.size()) / std::chrono::duration<double>(Clock::now() - begin).count();
}

// Targets for `batch` of the held JPEGs from `first` (wrapping around), decoded side by side
// into `out`.
std::vector<DecodeTarget> BatchTargets(const std::vector<std::span<const uint8_t>>& held,
                                       size_t first, size_t batch, const PreparedShape& shape,
                                       const DeviceBuffer& out) {
  std::vector<DecodeTarget> targets;
  for (size_t i = 0; i < batch; ++i) {
    targets.push_back({i, held[(first + i) % held.size()], shape,
                       static_cast<uint8_t*>(out.data()) + i * shape.bytes()});
  }
  return targets;
}

// The server's path: BatchDecoder (header parse, nvJPEG, the exact resize to 224x224) on batches
// of JPEGs in pinned memory, as the registered cache holds them; its phases' wall time.
int ServerPath(const std::vector<std::vector<uint8_t>>& jpegs, size_t batch, size_t rounds,
               cudaStream_t stream) {
  Result<std::unique_ptr<JpegDecoder>> d = JpegDecoder::Create(uint32_t(batch));
  Result<PrepareSpec> spec = ParsePrepareSpec("resize=256,crop=224,decode=gpu");
  if (!d.ok() || !spec.ok()) return 1;
  BatchDecoder decoder(std::move(*d), uint64_t{512} << 20);
  std::vector<std::span<const uint8_t>> held;
  Result<PinnedHostBuffer> pinned = Pin(jpegs, &held);
  const PreparedShape shape{224, 224, 3};
  Result<DeviceBuffer> out = DeviceBuffer::Allocate(shape.bytes() * batch);
  if (!pinned.ok() || !out.ok()) return 1;
  double best = 0;
  DecodeCounts phases;
  for (size_t r = 0; r < rounds; ++r) {
    DecodeCounts counts;
    const auto begin = Clock::now();
    for (size_t first = 0; first + batch <= held.size(); first += batch) {
      const std::vector<DecodeTarget> targets = BatchTargets(held, first, batch, shape, *out);
      std::vector<std::pair<size_t, Status>> failed;
      if (Status s = decoder.Decode(*spec, targets, stream, &failed, &counts); !s.ok()) {
        std::printf("BatchDecoder failed: %s\n", s.ToString().c_str());
        return 1;
      }
    }
    const double secs = std::chrono::duration<double>(Clock::now() - begin).count();
    const double rate = double(held.size() / batch * batch) / secs;
    if (rate > best) {
      best = rate;
      phases = counts;
    }
  }
  std::printf("server path (BatchDecoder %s, decode + exact resize to 224x224): %.0f img/s; "
              "seconds in header parse %.3f, decode call %.3f, resize %.3f, CPU side %.3f, "
              "stream wait %.3f\n",
              decoder.backend().c_str(), best, phases.inspect_s, phases.decode_s,
              phases.resize_s, phases.cpu_s, phases.wait_s);
  return 0;
}

// K threads at once, each with its own BatchDecoder, stream and outputs, decoding batches of the
// same pinned JPEGs for `seconds`; the aggregate rate and the mean decode call per batch.
int ConcurrentServerPath(const std::vector<std::vector<uint8_t>>& jpegs, size_t batch,
                         size_t threads, double seconds, JpegBackend backend) {
  Result<PrepareSpec> spec = ParsePrepareSpec("resize=256,crop=224,decode=gpu");
  std::vector<std::span<const uint8_t>> held;
  Result<PinnedHostBuffer> pinned = Pin(jpegs, &held);
  if (!spec.ok() || !pinned.ok()) return 1;
  const PreparedShape shape{224, 224, 3};
  std::vector<size_t> done(threads, 0);
  std::vector<double> decode_s(threads, 0);
  std::vector<int> failed_threads(threads, 0);
  // The clock starts once every thread has its decoder, stream and buffers.
  std::latch set_up(static_cast<std::ptrdiff_t>(threads)), go(1);
  Clock::time_point begin;
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      Result<std::unique_ptr<JpegDecoder>> d = JpegDecoder::Create(uint32_t(batch), backend);
      Result<CudaStream> stream = CudaStream::Create();
      Result<DeviceBuffer> out = DeviceBuffer::Allocate(shape.bytes() * batch);
      set_up.count_down();
      go.wait();
      if (!d.ok() || !stream.ok() || !out.ok()) {
        failed_threads[t] = 1;
        return;
      }
      BatchDecoder decoder(std::move(*d), uint64_t{512} << 20);
      DecodeCounts counts;
      for (size_t first = t * batch % held.size();
           std::chrono::duration<double>(Clock::now() - begin).count() < seconds;
           first = (first + batch) % (held.size() / batch * batch)) {
        const std::vector<DecodeTarget> targets = BatchTargets(held, first, batch, shape, *out);
        std::vector<std::pair<size_t, Status>> failed;
        if (!decoder.Decode(*spec, targets, stream->get(), &failed, &counts).ok() ||
            !stream->Synchronize().ok()) {
          failed_threads[t] = 1;
          return;
        }
        done[t] += batch;
      }
      decode_s[t] = counts.decode_s;
    });
  }
  set_up.wait();
  begin = Clock::now();
  const double unix_begin = UnixSeconds();
  go.count_down();
  for (auto& th : pool) th.join();
  const double secs = std::chrono::duration<double>(Clock::now() - begin).count();
  size_t images = 0;
  double call_s = 0;
  for (size_t t = 0; t < threads; ++t) {
    if (failed_threads[t]) {
      std::printf("server path, %zu threads: thread %zu failed\n", threads, t);
      return 1;
    }
    images += done[t];
    call_s += decode_s[t];
  }
  std::printf(
      "server path (%s), %zu threads at once for %.1f s: %.0f img/s in all; decode call %.2f ms "
      "a batch of %zu; from %.1f to %.1f\n",
      JpegBackendName(backend), threads, secs, double(images) / secs,
      1e3 * call_s / double(images / batch), batch, unix_begin, UnixSeconds());
  return 0;
}

int Run(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each row as it comes, beside another process too
  size_t images = 2048, batch = 256, rounds = 3, threads = 1;
  double seconds = 10, gap = 3;
  std::vector<Variant> variants;
  JpegBackend backend = JpegBackend::kHardware;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const size_t value = std::strtoull(argv[i + 1], nullptr, 10);
    if (flag == "--images") images = value;
    else if (flag == "--batch") batch = value;
    else if (flag == "--rounds") rounds = value;
    else if (flag == "--threads") threads = value;
    else if (flag == "--seconds") seconds = std::strtod(argv[i + 1], nullptr);
    else if (flag == "--gap") gap = std::strtod(argv[i + 1], nullptr);
    else if (flag == "--variants") {
      const std::string list = argv[i + 1];
      for (size_t at = 0; at < list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        Result<Variant> parsed = ParseVariant(list.substr(at, comma - at));
        if (!parsed.ok()) {
          std::fprintf(stderr, "--variants: %s\n", parsed.status().message().c_str());
          return 2;
        }
        variants.push_back(*parsed);
        at = comma + 1;
      }
    }
    else if (flag == "--backend") {
      const std::string name = argv[i + 1];
      if (name != "hardware" && name != "gpu-hybrid") {
        std::fprintf(stderr, "--backend %s: use hardware or gpu-hybrid\n", name.c_str());
        return 2;
      }
      backend = name == "hardware" ? JpegBackend::kHardware : JpegBackend::kGpuHybrid;
    }
  }
  if (batch == 0 || images < batch) {
    std::fprintf(stderr, "--images %zu must be at least --batch %zu, and the batch at least 1\n",
                 images, batch);
    return 2;
  }
  const int w = 500, h = 375;
  std::vector<std::vector<uint8_t>> jpegs;
  size_t encoded_bytes = 0;
  for (size_t i = 0; i < images; ++i) {
    jpegs.push_back(NoisyPhotoJpeg(w, h, uint32_t(i)));
    encoded_bytes += jpegs.back().size();
  }
  std::printf("%zu JPEGs 500x375 q90 4:2:0, mean %.1f KiB; batch %zu, best of %zu rounds\n", images,
              double(encoded_bytes) / images / 1024, batch, rounds);
  if (!variants.empty()) {  // only the variants, one after another with a pause between
    if (CudaDeviceCount() == 0) {
      std::printf("no CUDA device: GPU rows skipped\n");
      return 0;
    }
    for (const Variant& v : variants) {
      std::this_thread::sleep_for(std::chrono::duration<double>(gap));
      Result<std::string> row = VariantRow(jpegs, w, h, batch, seconds, v);
      std::printf("%s\n", row.ok() ? row->c_str() : row.status().ToString().c_str());
      if (!row.ok()) return 1;
    }
    return 0;
  }
  const double cpu1 = CpuRate(jpegs, w, h, 1);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const double cpun = CpuRate(jpegs, w, h, cores);
  std::printf("libjpeg-turbo, 1 thread: %.0f img/s; %u threads: %.0f img/s\n", cpu1, cores, cpun);
  if (CudaDeviceCount() == 0) {
    std::printf("no CUDA device: GPU rows skipped\n");
    return 0;
  }
  Result<DeviceBuffer> out = DeviceBuffer::Allocate(size_t(w) * h * 3 * batch);
  Result<CudaStream> stream = CudaStream::Create();
  if (!out.ok() || !stream.ok()) {
    std::fprintf(stderr, "CUDA setup failed\n");
    return 1;
  }
  for (JpegBackend prefer : {JpegBackend::kHardware, JpegBackend::kGpuHybrid}) {
    Result<std::unique_ptr<JpegDecoder>> d = JpegDecoder::Create(uint32_t(batch), prefer);
    if (!d.ok()) {
      std::printf("nvJPEG (%s): %s\n", JpegBackendName(prefer), d.status().ToString().c_str());
      return 1;
    }
    if ((*d)->backend() != prefer) {
      std::printf("nvJPEG: no %s backend on this GPU\n", JpegBackendName(prefer));
      continue;
    }
    std::vector<uint8_t*> dst(batch);
    std::vector<uint32_t> pitch(batch, uint32_t(w * 3));
    for (size_t i = 0; i < batch; ++i) dst[i] = static_cast<uint8_t*>(out->data()) + i * w * h * 3;
    double best = 0;
    for (size_t r = 0; r < rounds; ++r) {
      const auto begin = Clock::now();
      for (size_t at = 0; at + batch <= jpegs.size(); at += batch) {
        std::vector<std::span<const uint8_t>> part(jpegs.begin() + long(at),
                                                   jpegs.begin() + long(at + batch));
        if (Status s = (*d)->DecodeBatch(part, dst, pitch, stream->get()); !s.ok()) {
          std::printf("decode failed: %s\n", s.ToString().c_str());
          return 1;
        }
      }
      if (Status s = stream->Synchronize(); !s.ok()) return 1;
      const double secs = std::chrono::duration<double>(Clock::now() - begin).count();
      best = std::max(best, double(jpegs.size() / batch * batch) / secs);
    }
    std::printf("nvJPEG %s: %.0f img/s (%.2fx libjpeg-turbo on %u threads)\n",
                JpegBackendName(prefer), best, best / cpun, cores);
  }
  if (int rc = ServerPath(jpegs, batch, rounds, stream->get()); rc != 0) return rc;
  for (size_t k = 1; threads >= 2 && k <= threads; k *= 2) {
    if (int rc = ConcurrentServerPath(jpegs, batch, k, seconds, backend); rc != 0) return rc;
  }
  return 0;
}

}  // namespace
}  // namespace carpool::gpu

int main(int argc, char** argv) { return carpool::gpu::Run(argc, argv); }
