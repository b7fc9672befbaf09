// Issue 5, must show: a job's images equal decoding the source file directly with the same
// transform and seed, byte-exact for uint8. The job runs through the C++ client against a real
// `carpool server`; the reference is computed in-process (e2e_reference.cc).
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <map>

#include "carpool/client.h"
#include "datasets/catalog.h"
#include "tests/e2e_reference.h"
#include "tests/e2e_util.h"

namespace carpool::e2e {
namespace {

// 24 generated 80x60 JPEGs registered as `name` with `prepare`; their records by catalog id.
void RegisterJpegs(E2eEnv& env, const std::string& name, const std::string& prepare,
                   std::map<uint32_t, SampleRecord>* by_id) {
  const fs::path images = env.dir() / "images";
  CliResult gen = env.Run({"dataset", "gen", images.string(), "--count", "24", "--size", "80x60",
                           "--classes", "3", "--threads", "1", "-q"},
                          "gen");
  ASSERT_EQ(gen.code, 0) << gen.err;
  env.Dataset({"add", name, "--dir", images.string(), "--prepare", prepare});
  Result<std::unique_ptr<Catalog>> catalog = Catalog::Open(env.state());
  ASSERT_TRUE(catalog.ok());
  Result<DatasetInfo> info = (*catalog)->GetDataset(name);
  ASSERT_TRUE(info.ok());
  Result<std::vector<SampleRecord>> records = (*catalog)->GetSamples(info->ids);
  ASSERT_TRUE(records.ok());
  for (const SampleRecord& r : *records) (*by_id)[r.id] = r;
}

TEST(E2eImagesTest, BatchesEqualTheSourceDecodedWithTheSameTransformAndSeed) {
  E2eEnv env;
  const std::string prepare = "resize=40,crop=40";
  std::map<uint32_t, SampleRecord> by_id;
  ASSERT_NO_FATAL_FAILURE(RegisterJpegs(env, "jpegs", prepare, &by_id));

  env.StartServer();
  Result<std::unique_ptr<Client>> client = Client::Connect(env.socket().string());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  // Two jobs with different seeds share the prepared samples but not their crops and flips.
  for (uint64_t seed : {7u, 8u}) {
    const std::string transform = "random_crop(32)|flip";
    Result<std::unique_ptr<Job>> job = (*client)->CreateJob(
        {.dataset = "jpegs", .batch_size = 5, .epochs = 2, .transform = transform, .seed = seed});
    ASSERT_TRUE(job.ok()) << job.status().ToString();
    EXPECT_EQ((*job)->sample_shape(), (std::vector<int64_t>{32, 32, 3}));
    size_t checked = 0, flipped_or_moved = 0;
    for (;;) {
      Result<std::optional<Batch>> batch = (*job)->Next();
      ASSERT_TRUE(batch.ok()) << batch.status().ToString();
      if (!batch->has_value()) break;
      const Batch& b = **batch;
      ASSERT_EQ(b.images().dtype, DType::kUint8);
      const size_t per = 32 * 32 * 3;
      ASSERT_EQ(b.images().bytes, b.size() * per);
      const auto* pixels = static_cast<const uint8_t*>(b.images().data);
      for (uint32_t i = 0; i < b.size(); ++i) {
        const uint32_t id = b.sample_ids()[i];
        ASSERT_TRUE(by_id.count(id));
        EXPECT_EQ(b.labels()[i], by_id[id].label);
        Result<std::vector<uint8_t>> want =
            ReferenceImage(by_id[id].path, prepare, transform, seed, b.epoch(), id);
        ASSERT_TRUE(want.ok()) << want.status().ToString();
        ASSERT_EQ(std::memcmp(pixels + i * per, want->data(), per), 0)
            << "sample " << id << " epoch " << b.epoch() << " seed " << seed;
        // Guard against a vacuous pass: the crop must actually depend on the seed.
        Result<std::vector<uint8_t>> other =
            ReferenceImage(by_id[id].path, prepare, transform, seed + 100, b.epoch(), id);
        ASSERT_TRUE(other.ok());
        flipped_or_moved += *other != *want;
        ++checked;
      }
    }
    EXPECT_EQ(checked, 2 * by_id.size());
    EXPECT_GT(flipped_or_moved, checked / 2);
  }
  const std::string s = env.Status();
  std::printf("issue-5 scenario images: preparations %.0f, deliveries %.0f, sharing ratio %.2f\n",
              JsonNumber(s, "preparations"), JsonNumber(s, "deliveries"),
              JsonNumber(s, "sharing_ratio"));
  EXPECT_EQ(JsonNumber(s, "preparations"), 24) << s;
  env.StopServer(SIGTERM);
}

// Issue 23: a dataset registered with decode=gpu, read by a CPU job on a server without GPUs. The
// server keeps its JPEGs encoded in the cache (the encoded tier) and the job's batches are the
// decode=gpu pixels (fast-upsampled decode, exact box filter), which differ from the CPU spec's.
TEST(E2eImagesTest, ADecodeGpuDatasetGivesCpuJobsTheGpuPixels) {
  E2eEnv env;
  const std::string prepare = "resize=40,crop=40,decode=gpu";
  std::map<uint32_t, SampleRecord> by_id;
  ASSERT_NO_FATAL_FAILURE(RegisterJpegs(env, "gpujpegs", prepare, &by_id));

  env.StartServer({"--gpus", "none"});
  Result<std::unique_ptr<Client>> client = Client::Connect(env.socket().string());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  const std::string transform = "random_crop(32)|flip";
  const uint64_t seed = 9;
  Result<std::unique_ptr<Job>> job = (*client)->CreateJob(
      {.dataset = "gpujpegs", .batch_size = 5, .epochs = 2, .transform = transform, .seed = seed});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  size_t checked = 0, unlike_cpu_spec = 0;
  const size_t per = 32 * 32 * 3;
  for (;;) {
    Result<std::optional<Batch>> batch = (*job)->Next();
    ASSERT_TRUE(batch.ok()) << batch.status().ToString();
    if (!batch->has_value()) break;
    const Batch& b = **batch;
    ASSERT_EQ(b.images().bytes, b.size() * per);
    const auto* pixels = static_cast<const uint8_t*>(b.images().data);
    for (uint32_t i = 0; i < b.size(); ++i) {
      const uint32_t id = b.sample_ids()[i];
      ASSERT_TRUE(by_id.count(id));
      Result<std::vector<uint8_t>> want =
          ReferenceImage(by_id[id].path, prepare, transform, seed, b.epoch(), id);
      ASSERT_TRUE(want.ok()) << want.status().ToString();
      ASSERT_EQ(std::memcmp(pixels + i * per, want->data(), per), 0)
          << "sample " << id << " epoch " << b.epoch();
      Result<std::vector<uint8_t>> cpu =
          ReferenceImage(by_id[id].path, "resize=40,crop=40", transform, seed, b.epoch(), id);
      ASSERT_TRUE(cpu.ok());
      unlike_cpu_spec += *cpu != *want;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * by_id.size());
  EXPECT_GT(unlike_cpu_spec, 0u) << "decode=gpu must be another prepared sample";
  const std::string s = env.Status();
  EXPECT_EQ(JsonNumber(s, "preparations"), 24) << s;  // each JPEG read into the cache once
  EXPECT_EQ(JsonNumber(s, "gpu_decode_cpu_fallbacks"), 0) << s;  // all stayed encoded
  env.StopServer(SIGTERM);
}

}  // namespace
}  // namespace carpool::e2e
