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

// The samples in one host arena, `gap` bytes apart: adjacent like a freshly filled cache segment
// (gap 0) or scattered slots (gap > 0). The same seed gives the same pixels whatever the gap.
struct Arena {
  std::vector<uint8_t> bytes;
  HostRegistration registration;
  std::vector<PreparedView> views;
};

Arena MakeArena(int n, const PreparedShape& shape, size_t gap, bool registered) {
  Arena a;
  const size_t stride = shape.bytes() + gap;
  a.bytes.resize(stride * n);
  std::mt19937_64 rng(42);
  for (int i = 0; i < n; ++i) {
    uint8_t* p = a.bytes.data() + i * stride;
    for (size_t k = 0; k < shape.bytes(); ++k) p[k] = static_cast<uint8_t>(rng());
    a.views.push_back({p, shape});
  }
  if (registered) a.registration = Take(HostRegistration::Register(a.bytes.data(), a.bytes.size()));
  return a;
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
  const size_t all_in = sample_bytes * opt.batch;

  const Arena adjacent = MakeArena(opt.batch, in, 0, true);
  const Arena apart = MakeArena(opt.batch, in, 4096, true);
  const Arena pageable = MakeArena(opt.batch, in, 4096, false);
  std::vector<std::vector<uint64_t>> seeds(opt.jobs);
  for (int j = 0; j < opt.jobs; ++j) {
    for (int i = 0; i < opt.batch; ++i) {
      seeds[j].push_back(SampleSeed(1000 + j, 0, static_cast<uint32_t>(i)));
    }
  }

  std::unique_ptr<GpuAssembler> assembler = Take(GpuAssembler::Create(0));
  CudaStream stream = Take(CudaStream::Create());
  DeviceBuffer out = Take(DeviceBuffer::Allocate(all_out));
  auto requests = [&](const Arena& arena) {
    std::vector<JobBatchRequest> reqs;
    for (int j = 0; j < opt.jobs; ++j) {
      reqs.push_back({spec, arena.views, seeds[j],
                      static_cast<uint8_t*>(out.data()) + j * batch_bytes, batch_bytes});
    }
    return reqs;
  };
  const std::vector<JobBatchRequest> on_adjacent = requests(adjacent);
  const std::vector<JobBatchRequest> on_apart = requests(apart);
  const std::vector<JobBatchRequest> on_pageable = requests(pageable);

  // Correctness first: every job's GPU batch equals the CPU batch, byte for byte.
  std::vector<uint8_t> cpu(all_out);
  auto cpu_batches = [&] {
    for (int j = 0; j < opt.jobs; ++j) {
      Check(AssembleBatch(spec, adjacent.views, seeds[j], cpu.data() + j * batch_bytes,
                          batch_bytes)
                .status());
    }
  };
  cpu_batches();
  std::vector<uint8_t> gpu(all_out);
  AssembleStats stats[2];
  bool identical = true;
  for (int k = 0; k < 2; ++k) {
    stats[k] = Take(assembler->AssembleBatches(k == 0 ? on_adjacent : on_apart, stream.get()));
    Check(stream.Synchronize());
    Check(CudaCheck(cudaMemcpy(gpu.data(), out.data(), all_out, cudaMemcpyDeviceToHost),
                    "cudaMemcpy(output)"));
    identical = identical && std::memcmp(cpu.data(), gpu.data(), all_out) == 0;
  }

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
  DeviceBuffer staging = Take(DeviceBuffer::Allocate(all_in));
  auto h2d_only = [&](bool one_copy) {
    return [&, one_copy] {
      auto* dst = static_cast<uint8_t*>(staging.data());
      for (int c = 0; c < opt.calls; ++c) {
        for (int i = 0; i < (one_copy ? 1 : opt.batch); ++i) {
          const uint8_t* src = one_copy ? adjacent.views[0].data : apart.views[i].data;
          const size_t bytes = one_copy ? all_in : sample_bytes;
          Check(CudaCheck(cudaMemcpyAsync(dst + i * sample_bytes, src, bytes,
                                          cudaMemcpyHostToDevice, stream.get()),
                          "cudaMemcpyAsync"));
        }
      }
      Check(stream.Synchronize());
    };
  };
  // The resident-area upload path of the server (server/gpu/gpu_service.cc): the same scattered
  // samples in one cudaMemcpyBatchAsync.
  auto h2d_batched = [&] {
    auto* dst = static_cast<uint8_t*>(staging.data());
    std::vector<void*> dsts(opt.batch);
    std::vector<const void*> srcs(opt.batch);
    std::vector<size_t> sizes(opt.batch, sample_bytes);
    for (int i = 0; i < opt.batch; ++i) {
      dsts[i] = dst + i * sample_bytes;
      srcs[i] = apart.views[i].data;
    }
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t first = 0;
    for (int c = 0; c < opt.calls; ++c) {
      Check(CudaCheck(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(),
                                           &attr, &first, 1, stream.get()),
                      "cudaMemcpyBatchAsync"));
    }
    Check(stream.Synchronize());
  };
  // Warm up each GPU path once (module load, staging growth), then time.
  gpu_calls(on_apart, true)();
  gpu_calls(on_pageable, false)();
  h2d_only(false)();
  const double t_cpu = MedianSeconds(std::min(opt.repeats, 5), 1, cpu_batches);
  const double t_adjacent = MedianSeconds(opt.repeats, opt.calls, gpu_calls(on_adjacent, false));
  const double t_apart = MedianSeconds(opt.repeats, opt.calls, gpu_calls(on_apart, false));
  const double t_per_job = MedianSeconds(opt.repeats, opt.calls, gpu_calls(on_apart, true));
  const double t_pageable = MedianSeconds(opt.repeats, opt.calls, gpu_calls(on_pageable, false));
  const double t_h2d_many = MedianSeconds(opt.repeats, opt.calls, h2d_only(false));
  const double t_h2d_one = MedianSeconds(opt.repeats, opt.calls, h2d_only(true));
  h2d_batched();
  const double t_h2d_batched = MedianSeconds(opt.repeats, opt.calls, h2d_batched);

  const DeviceInfo& d = devices[0];
  fmt::print("device 0: {} (sm_{}{}, {} SMs, {:.0f} GiB)\n", d.name, d.compute_major,
             d.compute_minor, d.multiprocessors, d.memory_bytes / double(1 << 30));
  fmt::print("{} jobs x {} samples of 256x256x3 -> {} ({} KiB/image), {:.1f} MB out per {}-job "
             "batch; median of {} repeats of {} calls\n",
             opt.jobs, opt.batch, kTransform, image_bytes / 1024, all_out / 1e6, opt.jobs,
             opt.repeats, opt.calls);
  fmt::print("GPU output identical to CPU AssembleBatch: {}\n\n", identical ? "yes" : "NO");
  fmt::print("| path | ms / {}-job batch | batches/s | output GB/s | samples up | copies | vs CPU "
             "|\n|---|---|---|---|---|---|---|\n",
             opt.jobs);
  auto row = [&](std::string_view name, double t, size_t uploads, size_t copies) {
    fmt::print("| {} | {:.3f} | {:.1f} | {:.2f} | {} | {} | {:.1f}x |\n", name, t * 1e3, 1 / t,
               all_out / t / 1e9, uploads, copies, t_cpu / t);
  };
  const size_t up = stats[1].uploads;
  row("CPU AssembleBatch, 1 thread", t_cpu, 0, 0);
  row("GPU, one call, registered, samples adjacent", t_adjacent, up, stats[0].upload_copies);
  row("GPU, one call, registered, samples apart", t_apart, up, stats[1].upload_copies);
  row("GPU, one call per job, registered, apart", t_per_job, up * opt.jobs,
      stats[1].upload_copies * opt.jobs);
  row("GPU, one call, pageable, apart", t_pageable, up, stats[1].upload_copies);
  fmt::print("\nH2D alone of the {} samples (registered): {} copies {:.3f} ms ({:.1f} GB/s); one "
             "copy {:.3f} ms ({:.1f} GB/s)\n",
             opt.batch, opt.batch, t_h2d_many * 1e3, all_in / t_h2d_many / 1e9, t_h2d_one * 1e3,
             all_in / t_h2d_one / 1e9);
  fmt::print("the same {} copies in one cudaMemcpyBatchAsync (the server's upload path): {:.3f} ms "
             "({:.1f} GB/s), {:.2f} of one copy's bandwidth\n",
             opt.batch, t_h2d_batched * 1e3, all_in / t_h2d_batched / 1e9,
             t_h2d_one / t_h2d_batched);
  fmt::print("uploads per {}-job batch: {} in one call vs {} with one call per job: {:.2f}x fewer "
             "({:.1f} MB vs {:.1f} MB over PCIe); time {:.2f}x\n",
             opt.jobs, up, up * opt.jobs, double(opt.jobs), stats[1].upload_bytes / 1e6,
             stats[1].upload_bytes * opt.jobs / 1e6, t_per_job / t_apart);
  return identical ? 0 : 1;
}

}  // namespace
}  // namespace carpool::gpu

int main(int argc, char** argv) {
  return carpool::gpu::Run(carpool::gpu::ParseOptions(argc, argv));
}
