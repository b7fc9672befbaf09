// Tar shards end to end (issue 11 item 5): `carpool dataset gen --tar` writes the folder
// generator's JPEGs as shards, `dataset add --tar` registers them from a brace pattern, and a real
// `carpool server` serves them: `carpool consume` gets every sample exactly once per epoch with its
// label, and a client job's pixels equal the same image decoded from the folder copy.
#include <fmt/core.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <map>
#include <set>

#include "carpool/client.h"
#include "datasets/catalog.h"
#include "tests/e2e_reference.h"
#include "tests/e2e_util.h"

namespace carpool::e2e {
namespace {

constexpr int kCount = 30, kClasses = 3;

// The generator's image index of a tar member "img_NNNNNNNN.jpg".
int ImageIndex(const SampleRecord& r) { return std::stoi(r.member.substr(4, 8)); }

TEST(E2eTarTest, ServesShardsOncePerEpochWithLabelsAndTheFolderPixels) {
  E2eEnv env;
  const fs::path shards = env.dir() / "shards", folder = env.dir() / "folder";
  const std::vector<std::string> common = {"--count", std::to_string(kCount), "--size", "80x60",
                                           "--classes", std::to_string(kClasses), "-q"};
  std::vector<std::string> gen_tar = {"dataset", "gen", shards.string(), "--tar", "--shard-size",
                                      "12"};
  gen_tar.insert(gen_tar.end(), common.begin(), common.end());
  CliResult gen = env.Run(gen_tar, "gen-tar");
  ASSERT_EQ(gen.code, 0) << gen.err;
  const std::string pattern = (shards / "train-{000000..000002}.tar").string();
  EXPECT_NE(gen.out.find(pattern), std::string::npos) << gen.out;
  std::vector<std::string> gen_dir = {"dataset", "gen", folder.string()};
  gen_dir.insert(gen_dir.end(), common.begin(), common.end());
  gen = env.Run(gen_dir, "gen-dir");
  ASSERT_EQ(gen.code, 0) << gen.err;

  const std::string prepare = "resize=40,crop=40";
  env.Dataset({"add", "tars", "--tar", pattern, "--prepare", prepare});
  Result<std::unique_ptr<Catalog>> catalog = Catalog::Open(env.state());
  ASSERT_TRUE(catalog.ok());
  Result<DatasetInfo> info = (*catalog)->GetDataset("tars");
  ASSERT_TRUE(info.ok());
  ASSERT_EQ(info->ids.cardinality(), uint64_t{kCount});
  Result<std::vector<SampleRecord>> records = (*catalog)->GetSamples(info->ids);
  ASSERT_TRUE(records.ok());
  std::map<uint32_t, SampleRecord> by_id;
  for (const SampleRecord& r : *records) {
    ASSERT_EQ(r.source, "tar");
    EXPECT_EQ(r.label, ImageIndex(r) % kClasses) << r.member;
    by_id[r.id] = r;
  }
  // A derived set of the shards: the first shard's 12 members by id.
  env.Dataset({"add", "first", "--from", "tars", "--ids",
               fmt::format("{}:{}", info->ids.minimum(), info->ids.minimum() + 12)});

  env.StartServer();
  const fs::path ids = env.dir() / "ids.csv";
  pid_t job = env.Consume({"--dataset", "tars", "--batch-size", "7", "--epochs", "2", "--json",
                           "--ids-out", ids.string()},
                          "consume");
  CliResult done = env.Wait(job, "consume");
  ASSERT_EQ(done.code, 0) << done.err;
  std::vector<std::set<uint32_t>> per_epoch(2);
  std::vector<Delivery> got = ReadIds(ids);
  ASSERT_EQ(got.size(), 2u * kCount);
  for (const Delivery& d : got) {
    ASSERT_LT(d.epoch, 2u);
    ASSERT_TRUE(by_id.count(d.sample)) << d.sample;
    EXPECT_EQ(d.label, by_id[d.sample].label) << d.sample;
    EXPECT_TRUE(per_epoch[d.epoch].insert(d.sample).second) << "repeat of " << d.sample;
  }
  EXPECT_EQ(per_epoch[0].size(), size_t{kCount});
  EXPECT_EQ(per_epoch[1].size(), size_t{kCount});

  // The derived set's job sees only the first shard's samples.
  job = env.Consume({"--dataset", "first", "--batch-size", "5", "--epochs", "1", "--json",
                     "--ids-out", (env.dir() / "first.csv").string()},
                    "first");
  done = env.Wait(job, "first");
  ASSERT_EQ(done.code, 0) << done.err;
  std::vector<Delivery> first = ReadIds(env.dir() / "first.csv");
  ASSERT_EQ(first.size(), 12u);
  for (const Delivery& d : first) EXPECT_LT(ImageIndex(by_id[d.sample]), 12);

  // Pixels: the member decodes exactly as the folder's copy of the same image.
  Result<std::unique_ptr<Client>> client = Client::Connect(env.socket().string());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  const std::string transform = "random_crop(32)|flip";
  Result<std::unique_ptr<Job>> pixels_job = (*client)->CreateJob(
      {.dataset = "tars", .batch_size = 6, .epochs = 1, .transform = transform, .seed = 5});
  ASSERT_TRUE(pixels_job.ok()) << pixels_job.status().ToString();
  size_t checked = 0;
  for (;;) {
    Result<std::optional<Batch>> batch = (*pixels_job)->Next();
    ASSERT_TRUE(batch.ok()) << batch.status().ToString();
    if (!batch->has_value()) break;
    const Batch& b = **batch;
    const size_t per = 32 * 32 * 3;
    const auto* data = static_cast<const uint8_t*>(b.images().data);
    for (uint32_t i = 0; i < b.size(); ++i) {
      const SampleRecord& r = by_id[b.sample_ids()[i]];
      const int index = ImageIndex(r);
      const fs::path file = folder / fmt::format("class_{:03}", index % kClasses) /
                            fmt::format("img_{:08}.jpg", index);
      Result<std::vector<uint8_t>> want =
          ReferenceImage(file.string(), prepare, transform, 5, b.epoch(), r.id);
      ASSERT_TRUE(want.ok()) << want.status().ToString();
      ASSERT_EQ(std::memcmp(data + i * per, want->data(), per), 0) << r.member;
      ++checked;
    }
  }
  EXPECT_EQ(checked, size_t{kCount});
  env.StopServer(SIGTERM);
}

}  // namespace
}  // namespace carpool::e2e
