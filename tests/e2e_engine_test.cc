// Engine accounting end to end: a shape one job's transform cannot take is skipped for that job
// only; evicted samples are prepared again ahead of their batches; every batch index of an epoch
// is delivered and every skipped sample counted, even when a whole batch is skipped.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <string>
#include <vector>

#include "tests/e2e_util.h"

namespace carpool::e2e {
namespace {

// `carpool dataset gen DIR --count N --size S`; fails the test on error.
void Gen(E2eEnv& env, const fs::path& dir, int count, const std::string& size) {
  CliResult gen = env.Run({"dataset", "gen", dir.string(), "--count", std::to_string(count),
                           "--size", size, "--classes", "2", "--threads", "1", "-q"},
                          "gen");
  ASSERT_EQ(gen.code, 0) << gen.err;
}

// Runs `carpool consume ARGS --json` to completion and returns its JSON line.
std::string ConsumeJson(E2eEnv& env, std::vector<std::string> args, const std::string& name) {
  args.push_back("--json");
  CliResult r = env.Wait(env.Consume(std::move(args), name), name);
  EXPECT_EQ(r.code, 0) << r.err;
  return r.out;
}

TEST(E2eEngineTest, ShapeOneTransformCannotTakeIsSkippedForThatJobOnly) {
  E2eEnv env;
  // Prepared with a resize and no crop: 64x48 images become 53x40, 48x64 ones 40x53.
  const fs::path images = env.dir() / "images";
  Gen(env, images / "wide", 10, "64x48");
  Gen(env, images / "tall", 10, "48x64");
  env.Dataset({"add", "mixed", "--dir", images.string(), "--prepare", "resize=40"});
  env.StartServer();
  // Job A (no transform) takes only the shape of the dataset's first sample.
  const std::string a = ConsumeJson(env, {"--dataset", "mixed", "--batch-size", "4"}, "a");
  EXPECT_EQ(JsonNumber(a, "samples"), 10) << a;
  EXPECT_EQ(JsonNumber(a, "skipped"), 10) << a;
  // Job B crops 32x32 out of either shape: it gets every sample, whatever job A skipped.
  const std::string b = ConsumeJson(
      env, {"--dataset", "mixed", "--batch-size", "4", "--transform", "random_crop(32)"}, "b");
  EXPECT_EQ(JsonNumber(b, "samples"), 20) << b;
  EXPECT_EQ(JsonNumber(b, "skipped"), 0) << b;
  const std::string s = env.Status();
  EXPECT_EQ(JsonNumber(s, "bad_samples"), 0) << s;
  env.StopServer(SIGTERM);
}

}  // namespace
}  // namespace carpool::e2e
