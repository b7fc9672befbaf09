#include "server/gpu/gpu_assembler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "server/assemble.h"
#include "server/gpu/cuda_check.h"
#include "server/gpu/device_probe.h"

namespace carpool::gpu {
namespace {

TEST(DeviceProbeTest, ListMatchesCount) {
  Result<std::vector<DeviceInfo>> devices = ListCudaDevices();
  ASSERT_TRUE(devices.ok()) << devices.status().ToString();
  EXPECT_EQ(static_cast<int>(devices->size()), CudaDeviceCount());
  for (const DeviceInfo& d : *devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.multiprocessors, 0);
    EXPECT_GT(d.memory_bytes, 0u);
  }
}

TEST(GpuAssemblerCreateTest, MissingDeviceIsACleanError) {
  const int count = CudaDeviceCount();
  Result<std::unique_ptr<GpuAssembler>> a = GpuAssembler::Create(count);
  ASSERT_FALSE(a.ok());
  if (count == 0) {
    EXPECT_EQ(a.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(a.status().message().find("no CUDA device"), std::string::npos);
  } else {
    EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find(std::to_string(count)), std::string::npos);
  }
}

// Prepared samples laid out in one host arena: pageable, pinned (cudaMallocHost) or registered.
enum class HostMemory { kPageable, kPinned, kRegistered };

struct SamplePool {
  std::vector<uint8_t> pageable;
  PinnedHostBuffer pinned;
  HostRegistration registration;
  std::vector<PreparedView> views;
};

SamplePool MakePool(const std::vector<PreparedShape>& shapes, HostMemory memory,
                    std::mt19937_64& rng) {
  SamplePool pool;
  size_t total = 0;
  for (const PreparedShape& s : shapes) total += s.bytes();
  uint8_t* base = nullptr;
  if (memory == HostMemory::kPinned) {
    Result<PinnedHostBuffer> pinned = PinnedHostBuffer::Allocate(total);
    EXPECT_TRUE(pinned.ok()) << pinned.status().ToString();
    pool.pinned = std::move(*pinned);
    base = static_cast<uint8_t*>(pool.pinned.data());
  } else {
    pool.pageable.resize(total);
    base = pool.pageable.data();
    if (memory == HostMemory::kRegistered) {
      Result<HostRegistration> reg = HostRegistration::Register(base, total);
      EXPECT_TRUE(reg.ok()) << reg.status().ToString();
      pool.registration = std::move(*reg);
    }
  }
  for (size_t i = 0; i < total; ++i) base[i] = static_cast<uint8_t>(rng());
  for (const PreparedShape& s : shapes) {
    pool.views.push_back({base, s});
    base += s.bytes();
  }
  return pool;
}

// A job as the test describes it, with the device buffer its batch goes to.
struct TestJob {
  TransformSpec spec;
  std::vector<PreparedView> samples;
  std::vector<uint64_t> seeds;
  DeviceBuffer dst;
  size_t bytes = 0;
};

class GpuAssemblerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: skipping GPU tests";
    Result<std::unique_ptr<GpuAssembler>> a = GpuAssembler::Create(0);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    assembler_ = std::move(*a);
    Result<CudaStream> s = CudaStream::Create();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    stream_ = std::move(*s);
  }

  // Allocates each job's device buffer, poisoned with `poison` so unwritten bytes show.
  void AllocateOutputs(std::vector<TestJob>& jobs, uint8_t poison) {
    for (TestJob& job : jobs) {
      Result<ImageShape> shape = BatchImageShape(job.spec, job.samples);
      ASSERT_TRUE(shape.ok()) << shape.status().ToString();
      job.bytes = shape->bytes() * job.samples.size();
      Result<DeviceBuffer> buf = DeviceBuffer::Allocate(job.bytes);
      ASSERT_TRUE(buf.ok()) << buf.status().ToString();
      job.dst = std::move(*buf);
      ASSERT_EQ(cudaMemsetAsync(job.dst.data(), poison, job.bytes, stream_.get()), cudaSuccess);
    }
  }

  static std::vector<JobBatchRequest> Requests(const std::vector<TestJob>& jobs) {
    std::vector<JobBatchRequest> reqs;
    for (const TestJob& j : jobs) {
      reqs.push_back({j.spec, j.samples, j.seeds, j.dst.data(), j.dst.bytes()});
    }
    return reqs;
  }

  // Every job's device output equals the CPU AssembleBatch of the same request, byte for byte.
  void ExpectMatchesCpu(const std::vector<TestJob>& jobs, const std::string& context) {
    ASSERT_TRUE(stream_.Synchronize().ok());
    for (size_t j = 0; j < jobs.size(); ++j) {
      const TestJob& job = jobs[j];
      std::vector<uint8_t> cpu(job.bytes);
      Result<ImageShape> shape =
          AssembleBatch(job.spec, job.samples, job.seeds, cpu.data(), cpu.size());
      ASSERT_TRUE(shape.ok()) << shape.status().ToString();
      std::vector<uint8_t> gpu(job.bytes);
      ASSERT_EQ(cudaMemcpy(gpu.data(), job.dst.data(), job.bytes, cudaMemcpyDeviceToHost),
                cudaSuccess);
      const auto diff = std::mismatch(cpu.begin(), cpu.end(), gpu.begin());
      if (diff.first != cpu.end()) {
        const size_t at = static_cast<size_t>(diff.first - cpu.begin());
        ADD_FAILURE() << context << " job " << j << " (" << job.spec.ToString() << ", "
                      << job.samples.size() << " images): first difference at byte " << at
                      << " of image " << at / shape->bytes() << ": cpu "
                      << static_cast<int>(*diff.first) << " gpu "
                      << static_cast<int>(*diff.second);
      }
    }
  }

  std::unique_ptr<GpuAssembler> assembler_;
  CudaStream stream_;
};

TransformSpec RandomSpec(std::mt19937_64& rng, int channels, int max_crop) {
  TransformSpec spec;
  const int crop = static_cast<int>(rng() % 3);
  spec.crop = crop == 0 ? CropMode::kNone : crop == 1 ? CropMode::kRandom : CropMode::kCenter;
  if (spec.crop != CropMode::kNone) spec.crop_size = 1 + static_cast<int>(rng() % max_crop);
  spec.flip = rng() % 2 == 1;
  std::uniform_real_distribution<float> mean(-1.0f, 2.0f);
  std::uniform_real_distribution<float> log_std(-13.0f, 1.0f);  // std 2e-6 .. 2.7: half overflows
  spec.normalize = (channels == 1 || channels == 3) && rng() % 3 != 0;
  if (spec.normalize) {
    spec.normalize_channels = channels;
    for (int c = 0; c < channels; ++c) {
      spec.mean[c] = mean(rng);
      spec.std[c] = std::exp(log_std(rng));
    }
  }
  const int dtype = static_cast<int>(rng() % 3);
  spec.dtype = dtype == 0 ? DType::kFloat16 : dtype == 1 ? DType::kFloat32 : DType::kUint8;
  if (spec.normalize && spec.dtype == DType::kUint8) spec.dtype = DType::kFloat16;
  spec.layout = rng() % 2 == 0 ? Layout::kNCHW : Layout::kNHWC;
  return spec;
}

TEST_F(GpuAssemblerTest, MatchesCpuOnRandomBatches) {
  std::mt19937_64 rng(20260511);
  for (int trial = 0; trial < 48; ++trial) {
    // Samples of channel counts 1..4; per count a few sizes, so cropping jobs see mixed sizes.
    std::vector<PreparedShape> shapes;
    for (int i = 0; i < 40; ++i) {
      const int c = 1 + static_cast<int>(rng() % 4);
      const int size_class = static_cast<int>(rng() % 3);
      shapes.push_back({12 + 9 * size_class, 16 + 7 * size_class, c});
    }
    const HostMemory memory = static_cast<HostMemory>(trial % 3);
    SamplePool pool = MakePool(shapes, memory, rng);

    std::vector<TestJob> jobs(1 + rng() % 4);
    for (TestJob& job : jobs) {
      const PreparedView& first = pool.views[rng() % pool.views.size()];
      job.spec = RandomSpec(rng, first.shape.channels, 12);
      // A batch of samples the spec accepts together: same channels, and same size unless cropped.
      const size_t batch = 1 + rng() % 9;
      while (job.samples.size() < batch) {
        const PreparedView& v = pool.views[rng() % pool.views.size()];
        const bool fits = v.shape.channels == first.shape.channels &&
                          (job.spec.crop != CropMode::kNone || v.shape == first.shape);
        if (fits) {
          job.samples.push_back(v);
          job.seeds.push_back(rng());
        }
      }
    }
    AllocateOutputs(jobs, static_cast<uint8_t>(rng()));
    std::set<const uint8_t*> unique;
    size_t images = 0;
    for (const TestJob& j : jobs) {
      for (const PreparedView& v : j.samples) unique.insert(v.data);
      images += j.samples.size();
    }
    const size_t uploads_before = assembler_->total_uploads();
    const std::vector<JobBatchRequest> reqs = Requests(jobs);
    Result<AssembleStats> stats = assembler_->AssembleBatches(reqs, stream_.get());
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(stats->images, images);
    EXPECT_EQ(stats->uploads, unique.size());
    EXPECT_EQ(assembler_->total_uploads() - uploads_before, unique.size());
    ExpectMatchesCpu(jobs, "trial " + std::to_string(trial));
  }
}

TEST_F(GpuAssemblerTest, SharedSamplesCrossPcieOnce) {
  std::mt19937_64 rng(7);
  SamplePool pool = MakePool(std::vector<PreparedShape>(32, {40, 40, 3}),
                             HostMemory::kRegistered, rng);
  Result<TransformSpec> spec =
      ParseTransformSpec("random_crop(32)|flip|normalize(imagenet)|float16|nchw");
  ASSERT_TRUE(spec.ok());
  std::vector<TestJob> jobs(4);
  for (size_t j = 0; j < jobs.size(); ++j) {
    jobs[j].spec = *spec;
    jobs[j].samples = pool.views;
    jobs[j].samples.push_back(pool.views[3]);  // a sample twice in one batch: still one upload
    for (size_t i = 0; i < jobs[j].samples.size(); ++i) {
      jobs[j].seeds.push_back(SampleSeed(100 + j, 0, static_cast<uint32_t>(i)));
    }
  }
  AllocateOutputs(jobs, 0xA5);
  Result<AssembleStats> stats = assembler_->AssembleBatches(Requests(jobs), stream_.get());
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->images, 4u * 33u);
  EXPECT_EQ(stats->uploads, 32u);
  EXPECT_EQ(stats->upload_copies, 32u);  // 4800-byte samples: not 256-aligned, never merged
  EXPECT_EQ(stats->upload_bytes, 32u * 40 * 40 * 3);
  ExpectMatchesCpu(jobs, "shared");
  // Per-job randomness survives sharing: two jobs' batches of the same samples differ.
  std::vector<uint8_t> a(jobs[0].bytes), b(jobs[1].bytes);
  ASSERT_EQ(cudaMemcpy(a.data(), jobs[0].dst.data(), a.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(b.data(), jobs[1].dst.data(), b.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_NE(a, b);
}

TEST_F(GpuAssemblerTest, SamplesAdjacentInHostMemoryTravelInOneCopy) {
  std::mt19937_64 rng(5);
  // 16x16x3 = 768 bytes, a multiple of the staging alignment, so neighbours stay neighbours.
  SamplePool pool =
      MakePool(std::vector<PreparedShape>(8, {16, 16, 3}), HostMemory::kPinned, rng);
  Result<TransformSpec> spec = ParseTransformSpec("random_crop(12)|flip|float32|nhwc");
  ASSERT_TRUE(spec.ok());
  const std::vector<std::vector<int>> batches = {{7, 2, 5, 0, 1, 3, 4, 6}, {5, 0, 7, 1, 2, 4}};
  const std::vector<size_t> expected_copies = {1, 3};  // all; then 0-2, 4-5, 7
  for (size_t b = 0; b < batches.size(); ++b) {
    std::vector<TestJob> jobs(1);
    jobs[0].spec = *spec;
    for (int i : batches[b]) {
      jobs[0].samples.push_back(pool.views[i]);
      jobs[0].seeds.push_back(rng());
    }
    AllocateOutputs(jobs, 0x5A);
    Result<AssembleStats> stats = assembler_->AssembleBatches(Requests(jobs), stream_.get());
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(stats->uploads, batches[b].size());
    EXPECT_EQ(stats->upload_copies, expected_copies[b]);
    ExpectMatchesCpu(jobs, "adjacent batch " + std::to_string(b));
  }
}

TEST_F(GpuAssemblerTest, CallsOnTwoStreamsDoNotOverwriteEachOthersStaging) {
  std::mt19937_64 rng(11);
  Result<CudaStream> other = CudaStream::Create();
  ASSERT_TRUE(other.ok());
  Result<TransformSpec> spec = ParseTransformSpec("center_crop(200)|float32|nhwc");
  ASSERT_TRUE(spec.ok());
  SamplePool pool_a = MakePool(std::vector<PreparedShape>(16, {256, 256, 3}),
                               HostMemory::kPinned, rng);
  SamplePool pool_b = MakePool(std::vector<PreparedShape>(16, {256, 256, 3}),
                               HostMemory::kPinned, rng);
  std::vector<TestJob> a(1), b(1);
  a[0] = {*spec, pool_a.views, std::vector<uint64_t>(16, 1), {}, 0};
  b[0] = {*spec, pool_b.views, std::vector<uint64_t>(16, 2), {}, 0};
  AllocateOutputs(a, 0x11);
  AllocateOutputs(b, 0x22);
  ASSERT_TRUE(stream_.Synchronize().ok());
  ASSERT_TRUE(assembler_->AssembleBatches(Requests(a), stream_.get()).ok());
  ASSERT_TRUE(assembler_->AssembleBatches(Requests(b), other->get()).ok());
  ASSERT_TRUE(other->Synchronize().ok());
  ExpectMatchesCpu(a, "first stream");
  ExpectMatchesCpu(b, "second stream");
}

// The server's path for a job's decoded pixels: the kernel reads them in place (a device source)
// and fills their resident blocks (keeps) as it reads. The batch is the CPU's, byte for byte, and
// each block the sample's bytes, for aligned blocks (16-byte words) and misaligned ones (bytes).
TEST_F(GpuAssemblerTest, KeptSamplesFillTheirBlocksAsTheKernelReadsThem) {
  std::mt19937_64 rng(13);
  // 100x90x3 = 27,000 bytes: not a multiple of 16, so the aligned blocks copy a byte tail too;
  // an 80x80 crop takes 4 blocks an image, so the copy is split across blocks and loops.
  const PreparedShape shape{100, 90, 3};
  const size_t bytes = shape.bytes();
  constexpr size_t kSpan = 32768;  // room per sample, in the device sources and the blocks
  SamplePool pool = MakePool(std::vector<PreparedShape>(6, shape), HostMemory::kPinned, rng);
  Result<DeviceBuffer> on_device = DeviceBuffer::Allocate(6 * kSpan);
  Result<DeviceBuffer> blocks = DeviceBuffer::Allocate(6 * kSpan + 64);
  ASSERT_TRUE(on_device.ok() && blocks.ok());
  auto* src_base = static_cast<uint8_t*>(on_device->data());
  auto* block_base = static_cast<uint8_t*>(blocks->data());
  // Known bytes around each source (an overrun would copy 0xA5) and in every block (0x77).
  ASSERT_EQ(cudaMemsetAsync(src_base, 0xA5, on_device->bytes(), stream_.get()), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(block_base, 0x77, blocks->bytes(), stream_.get()), cudaSuccess);
  for (size_t i = 0; i < 6; ++i) {
    ASSERT_EQ(cudaMemcpyAsync(src_base + i * kSpan, pool.views[i].data, bytes,
                              cudaMemcpyHostToDevice, stream_.get()),
              cudaSuccess);
  }
  Result<TransformSpec> spec = ParseTransformSpec("random_crop(80)|flip|float32|nchw");
  ASSERT_TRUE(spec.ok());
  // Samples 0-4 read from the device, 5 uploaded from the host; 0 and 3 twice, kept once.
  const std::vector<int> order = {0, 1, 2, 3, 4, 5, 0, 3};
  std::vector<TestJob> jobs(1);
  jobs[0].spec = *spec;
  std::vector<const uint8_t*> sources;
  std::vector<uint8_t*> keeps;
  std::vector<uint8_t> expected(blocks->bytes(), 0x77);
  for (size_t k = 0; k < order.size(); ++k) {
    const int i = order[k];
    jobs[0].samples.push_back(pool.views[i]);
    jobs[0].seeds.push_back(rng());
    const bool device = i != 5;
    sources.push_back(device ? src_base + i * kSpan : nullptr);
    const bool first = std::find(order.begin(), order.begin() + k, i) == order.begin() + k;
    // Odd samples go to blocks one byte off a 16-byte boundary: the byte path.
    const size_t at = i * kSpan + (i % 2 == 1 ? 1 : 0);
    keeps.push_back(device && first ? block_base + at : nullptr);
    if (device && first) std::copy(pool.views[i].data, pool.views[i].data + bytes, &expected[at]);
  }
  AllocateOutputs(jobs, 0x3C);
  const std::vector<JobBatchRequest> reqs = Requests(jobs);
  const std::span<const uint8_t* const> job_sources(sources);
  const std::span<uint8_t* const> job_keeps(keeps);
  Result<AssembleStats> stats =
      assembler_->AssembleBatches(reqs, stream_.get(), {&job_sources, 1}, {&job_keeps, 1});
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->uploads, 1u);  // only sample 5
  ExpectMatchesCpu(jobs, "kept");
  // Every byte of the blocks: the kept samples where they belong, nothing written elsewhere.
  std::vector<uint8_t> all(blocks->bytes());
  ASSERT_EQ(cudaMemcpy(all.data(), block_base, all.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  const auto diff = std::mismatch(expected.begin(), expected.end(), all.begin());
  EXPECT_EQ(diff.first, expected.end())
      << "blocks differ at byte " << (diff.first - expected.begin()) << " (sample slot "
      << (diff.first - expected.begin()) / kSpan << "): want " << static_cast<int>(*diff.first)
      << " got " << static_cast<int>(*diff.second);

  // A keep needs a device source; nothing is enqueued otherwise.
  std::vector<uint8_t*> stray(order.size(), nullptr);
  stray[5] = block_base;
  const std::span<uint8_t* const> stray_keeps(stray);
  const size_t before = assembler_->total_uploads();
  Result<AssembleStats> bad =
      assembler_->AssembleBatches(reqs, stream_.get(), {&job_sources, 1}, {&stray_keeps, 1});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("without a device source"), std::string::npos)
      << bad.status().message();
  EXPECT_EQ(assembler_->total_uploads(), before);
  const std::vector<uint8_t*> short_keeps(3, nullptr);
  const std::span<uint8_t* const> few(short_keeps);
  Result<AssembleStats> count =
      assembler_->AssembleBatches(reqs, stream_.get(), {&job_sources, 1}, {&few, 1});
  ASSERT_FALSE(count.ok());
  EXPECT_NE(count.status().message().find("3 device keeps for 8 samples"), std::string::npos)
      << count.status().message();
}

TEST_F(GpuAssemblerTest, RejectsBadRequestsBeforeAnyWork) {
  std::mt19937_64 rng(3);
  SamplePool pool = MakePool({{20, 20, 3}, {20, 24, 3}, {20, 20, 1}}, HostMemory::kPageable, rng);
  Result<DeviceBuffer> dst = DeviceBuffer::Allocate(1 << 16);
  ASSERT_TRUE(dst.ok());
  std::vector<uint8_t> host_dst(1 << 16);
  const TransformSpec plain;  // identity: uint8 nhwc
  Result<TransformSpec> crop = ParseTransformSpec("center_crop(16)|float32");
  Result<TransformSpec> too_big = ParseTransformSpec("random_crop(21)");
  Result<TransformSpec> norm = ParseTransformSpec("center_crop(8)|normalize(imagenet)");
  ASSERT_TRUE(crop.ok() && too_big.ok() && norm.ok());
  const std::vector<PreparedView>& v = pool.views;
  const std::vector<uint64_t> seeds = {1, 2, 3};
  const PreparedView aliased{v[0].data, {18, 18, 3}};  // v[0]'s address with another shape

  struct Case {
    std::string name;
    JobBatchRequest req;
    std::string expect;  // a piece of the message
  };
  const std::vector<Case> cases = {
      {"seed count", {plain, {&v[0], 1}, {seeds.data(), 2}, dst->data(), dst->bytes()}, "seeds"},
      {"mixed sizes", {plain, {&v[0], 2}, {seeds.data(), 2}, dst->data(), dst->bytes()},
       "one shape"},
      {"crop too big", {*too_big, {&v[0], 1}, {seeds.data(), 1}, dst->data(), dst->bytes()},
       "larger than"},
      {"normalize channels", {*norm, {&v[2], 1}, {seeds.data(), 1}, dst->data(), dst->bytes()},
       "channels"},
      {"empty batch", {plain, {}, {}, dst->data(), dst->bytes()}, "no samples"},
      {"small dst", {*crop, {&v[0], 2}, {seeds.data(), 2}, dst->data(), 16 * 16 * 3 * 4},
       "need"},
      {"null dst", {plain, {&v[0], 1}, {seeds.data(), 1}, nullptr, 0}, "null"},
      {"host dst", {plain, {&v[0], 1}, {seeds.data(), 1}, host_dst.data(), host_dst.size()},
       "not device memory"},
      {"misaligned", {*crop, {&v[0], 1}, {seeds.data(), 1},
                      static_cast<uint8_t*>(dst->data()) + 2, 4096}, "aligned"},
      {"aliased address", {*crop, {&aliased, 1}, {seeds.data(), 1}, dst->data(), dst->bytes()},
       "one address"},
  };
  for (const Case& c : cases) {
    // A good job first: the bad second job must stop the whole call before any upload.
    const JobBatchRequest good{*crop, {&v[0], 1}, {seeds.data(), 1}, dst->data(), 4096};
    const std::vector<JobBatchRequest> reqs = {good, c.req};
    const size_t before = assembler_->total_uploads();
    Result<AssembleStats> r = assembler_->AssembleBatches(reqs, stream_.get());
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos)
        << c.name << ": " << r.status().message();
    EXPECT_NE(r.status().message().find("job 1"), std::string::npos) << r.status().message();
    EXPECT_EQ(assembler_->total_uploads(), before) << c.name;
  }
  const JobBatchRequest ok{plain, {&v[0], 1}, {seeds.data(), 1}, dst->data(), dst->bytes()};
  Result<AssembleStats> on_default = assembler_->AssembleBatches({&ok, 1}, nullptr);
  ASSERT_FALSE(on_default.ok());
  EXPECT_NE(on_default.status().message().find("default stream"), std::string::npos);
}

}  // namespace
}  // namespace carpool::gpu
