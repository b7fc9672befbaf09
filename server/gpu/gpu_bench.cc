// GPU batch assembly against the CPU AssembleBatch (one thread), measured in the same run:
// J jobs, each a batch of B prepared 256x256x3 samples, all jobs over the same samples, with
// random_crop(224)|flip|normalize(imagenet)|float16|nchw. Prints a table and the ratio of
// sample uploads saved by assembling the jobs' batches in one call.
// Usage: carpool_gpu_bench [--jobs J] [--batch B] [--calls N] [--repeats R]
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "server/assemble.h"
#include "server/gpu/cuda_check.h"
#include "server/gpu/device_probe.h"
#include "server/gpu/gpu_assembler.h"

namespace carpool::gpu {
namespace {

constexpr std::string_view kTransform = "random_crop(224)|flip|normalize(imagenet)|float16|nchw";

struct Options {
  int jobs = 4;
  int batch = 256;
  int calls = 10;    // GPU calls enqueued back to back per timed repeat
  int repeats = 7;   // timed repeats; the median is reported
};

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// The median over `repeats` of the seconds `body` takes divided by `per`.
double MedianSeconds(int repeats, int per, const std::function<void()>& body) {
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    body();
    times.push_back(Seconds(std::chrono::steady_clock::now() - start) / per);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

[[noreturn]] void Die(const std::string& what) {
  fmt::print(stderr, "carpool_gpu_bench: {}\n", what);
  std::exit(1);
}

void Check(const Status& s) {
  if (!s.ok()) Die(s.ToString());
}

template <typename T>
T Take(Result<T> r) {
  if (!r.ok()) Die(r.status().ToString());
  return std::move(*r);
}

Options ParseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (value <= 0) Die(fmt::format("{} needs a positive number, got \"{}\"", flag, argv[i + 1]));
    if (flag == "--jobs") o.jobs = value;
    else if (flag == "--batch") o.batch = value;
    else if (flag == "--calls") o.calls = value;
    else if (flag == "--repeats") o.repeats = value;
    else Die(fmt::format("unknown flag {}; known: --jobs --batch --calls --repeats", flag));
  }
  return o;
}

int Run(const Options& opt) {
  std::vector<DeviceInfo> devices = Take(ListCudaDevices());
  if (devices.empty()) {
    fmt::print("no CUDA device: nothing to measure (the CPU batch path serves this machine)\n");
    return 0;
  }
  const TransformSpec spec = Take(ParseTransformSpec(kTransform));
  const PreparedShape in{256, 256, 3};
  const size_t sample_bytes = in.bytes();
  const size_t image_bytes = Take(TransformedShape(spec, in)).bytes();
  const size_t batch_bytes = image_bytes * opt.batch;
  const size_t all_out = batch_bytes * opt.jobs;

  // The samples, in one host arena registered with CUDA, as the cache segment would be.
  std::vector<uint8_t> arena(sample_bytes * opt.batch);
  std::mt19937_64 rng(42);
  for (auto& b : arena) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> pageable = arena;  // the same bytes, not registered
  HostRegistration reg = Take(HostRegistration::Register(arena.data(), arena.size()));
  std::vector<PreparedView> views, pageable_views;
  for (int i = 0; i < opt.batch; ++i) {
    views.push_back({arena.data() + i * sample_bytes, in});
    pageable_views.push_back({pageable.data() + i * sample_bytes, in});
  }
  std::vector<std::vector<uint64_t>> seeds(opt.jobs);
  for (int j = 0; j < opt.jobs; ++j) {
    for (int i = 0; i < opt.batch; ++i) {
      seeds[j].push_back(SampleSeed(1000 + j, 0, static_cast<uint32_t>(i)));
    }
  }

  std::unique_ptr<GpuAssembler> assembler = Take(GpuAssembler::Create(0));
  CudaStream stream = Take(CudaStream::Create());
  DeviceBuffer out = Take(DeviceBuffer::Allocate(all_out));
  auto requests = [&](const std::vector<PreparedView>& v) {
    std::vector<JobBatchRequest> reqs;
    for (int j = 0; j < opt.jobs; ++j) {
      reqs.push_back({spec, v, seeds[j], static_cast<uint8_t*>(out.data()) + j * batch_bytes,
                      batch_bytes});
    }
    return reqs;
  };
  const std::vector<JobBatchRequest> shared = requests(views);
  const std::vector<JobBatchRequest> shared_pageable = requests(pageable_views);

  // Correctness first: every job's GPU batch equals the CPU batch, byte for byte.
  std::vector<uint8_t> cpu(all_out);
  const AssembleStats stats = Take(assembler->AssembleBatches(shared, stream.get()));
  Check(stream.Synchronize());
  std::vector<uint8_t> gpu(all_out);
  Check(CudaCheck(cudaMemcpy(gpu.data(), out.data(), all_out, cudaMemcpyDeviceToHost),
                  "cudaMemcpy(output)"));
  auto cpu_batches = [&] {
    for (int j = 0; j < opt.jobs; ++j) {
      Check(AssembleBatch(spec, views, seeds[j], cpu.data() + j * batch_bytes, batch_bytes)
                .status());
    }
  };
  cpu_batches();
  const bool identical = std::memcmp(cpu.data(), gpu.data(), all_out) == 0;

  auto gpu_calls = [&](const std::vector<JobBatchRequest>& reqs, bool one_call_per_job) {
    return [&, batches = &reqs, one_call_per_job] {
      for (int c = 0; c < opt.calls; ++c) {
        if (one_call_per_job) {
          for (const JobBatchRequest& r : *batches) {
            Check(assembler->AssembleBatches({&r, 1}, stream.get()).status());
          }
        } else {
          Check(assembler->AssembleBatches(*batches, stream.get()).status());
        }
      }
      Check(stream.Synchronize());
    };
  };
  DeviceBuffer staging = Take(DeviceBuffer::Allocate(arena.size()));
  auto h2d_only = [&] {
    for (int c = 0; c < opt.calls; ++c) {
      for (int i = 0; i < opt.batch; ++i) {
        Check(CudaCheck(cudaMemcpyAsync(static_cast<uint8_t*>(staging.data()) + i * sample_bytes,
                                        views[i].data, sample_bytes, cudaMemcpyHostToDevice,
                                        stream.get()),
                        "cudaMemcpyAsync"));
      }
    }
    Check(stream.Synchronize());
  };
  // Warm up each GPU path once (module load, staging growth), then time.
  gpu_calls(shared, true)();
  gpu_calls(shared_pageable, false)();
  h2d_only();
  const double t_cpu = MedianSeconds(std::min(opt.repeats, 5), 1, cpu_batches);
  const double t_shared = MedianSeconds(opt.repeats, opt.calls, gpu_calls(shared, false));
  const double t_per_job = MedianSeconds(opt.repeats, opt.calls, gpu_calls(shared, true));
  const double t_pageable =
      MedianSeconds(opt.repeats, opt.calls, gpu_calls(shared_pageable, false));
  const double t_h2d = MedianSeconds(opt.repeats, opt.calls, h2d_only);

  const DeviceInfo& d = devices[0];
  fmt::print("device 0: {} (sm_{}{}, {} SMs, {:.0f} GiB)\n", d.name, d.compute_major,
             d.compute_minor, d.multiprocessors, d.memory_bytes / double(1 << 30));
  fmt::print("{} jobs x {} samples of 256x256x3 -> {} ({} KiB/image), {:.1f} MB per {}-job "
             "batch; median of {} repeats of {} calls\n",
             opt.jobs, opt.batch, kTransform, image_bytes / 1024, all_out / 1e6, opt.jobs,
             opt.repeats, opt.calls);
  fmt::print("GPU output identical to CPU AssembleBatch: {}\n\n", identical ? "yes" : "NO");
  fmt::print("| path | ms / {}-job batch | batches/s | output GB/s | sample uploads | vs CPU |\n",
             opt.jobs);
  fmt::print("|---|---|---|---|---|---|\n");
  auto row = [&](std::string_view name, double t, size_t uploads) {
    fmt::print("| {} | {:.3f} | {:.1f} | {:.2f} | {} | {:.1f}x |\n", name, t * 1e3, 1 / t,
               all_out / t / 1e9, uploads, t_cpu / t);
  };
  row("CPU AssembleBatch, 1 thread", t_cpu, 0);
  row("GPU, one call, registered samples", t_shared, stats.uploads);
  row("GPU, one call per job, registered", t_per_job, stats.uploads * opt.jobs);
  row("GPU, one call, pageable samples", t_pageable, stats.uploads);
  fmt::print("\nH2D copy alone of the {} unique samples (registered): {:.3f} ms, {:.1f} GB/s\n",
             opt.batch, t_h2d * 1e3, arena.size() / t_h2d / 1e9);
  fmt::print("uploads per {}-job batch: {} in one call vs {} one call per job: {:.2f}x fewer "
             "({:.1f} MB vs {:.1f} MB over PCIe); time {:.2f}x\n",
             opt.jobs, stats.uploads, stats.uploads * opt.jobs,
             double(opt.jobs), stats.upload_bytes / 1e6, stats.upload_bytes * opt.jobs / 1e6,
             t_per_job / t_shared);
  return identical ? 0 : 1;
}

}  // namespace
}  // namespace carpool::gpu

int main(int argc, char** argv) {
  return carpool::gpu::Run(carpool::gpu::ParseOptions(argc, argv));
}
