// Issue 20, must show: four jobs in sync with the cache at 10% of the prepared set still share
// preparation. Its own binary, run serially (tests/CMakeLists.txt): a test running beside it on
// the same 2 cores starves the clients, which then count as client-bound and lift the pacing.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tests/e2e_util.h"

namespace carpool::e2e {
namespace {

// Registers `images` generated JPEGs of `size` as dataset "imgs", prepared to side x side; returns
// the prepared set's bytes, so a test can state its cache as a fraction of it.
uint64_t AddImages(E2eEnv& env, int images, const char* size, int side) {
  env.GenImages(env.dir() / "images", images, size);
  if (::testing::Test::HasFatalFailure()) return 0;
  env.Dataset({"add", "imgs", "--dir", (env.dir() / "images").string(), "--prepare",
               fmt::format("resize={},crop={}", side, side)});
  return uint64_t(images) * side * side * 3;
}

// Issue 20: the data outgrows the cache. Four identical jobs started together over 2,000 JPEGs,
// with the cache at 10% of the prepared set, must still share: at most 0.35 preparations per
// delivery (the bound is 0.25; independent loaders make 1.0, and the server made 0.94-1.17
// before the pacing). Each job still gets every sample exactly once per epoch.
TEST(E2ePacingTest, FourJobsShareWithTheCacheAtTenPercentOfTheSet) {
  E2eEnv env;
  constexpr int kImages = 2000;
  // Prepared samples of 128x128x3 = 49,152 bytes, from 320x240 JPEGs: preparation must be the
  // bound, as in the issue. With 96x72 images the four clients were the bound on 2 cores, the
  // laggers counted as client-bound and the pacing lifted (0.46-0.51 per delivery): right by its
  // rule, since preparation had slack, but not what this test is about.
  uint64_t prepared_set = 0;
  ASSERT_NO_FATAL_FAILURE(prepared_set = AddImages(env, kImages, "320x240", 128));
  env.StartServer({"--cache-size", std::to_string(prepared_set / 10), "--workers", "2"});
  std::vector<pid_t> jobs;
  for (int i = 0; i < 4; ++i) {
    const std::string name = fmt::format("j{}", i);
    jobs.push_back(env.Consume({"--dataset", "imgs", "--batch-size", "16", "--epochs", "2",
                                "--json", "--ids-out", (env.dir() / (name + ".csv")).string()},
                               name));
  }
  for (int i = 0; i < 4; ++i) {
    const std::string name = fmt::format("j{}", i);
    CliResult r = env.Wait(jobs[i], name);
    ASSERT_EQ(r.code, 0) << name << ": " << r.err;
    EXPECT_EQ(JsonNumber(r.out, "skipped"), 0) << r.out;
  }
  for (int i = 0; i < 4; ++i) CheckEpochs(env, "imgs", fmt::format("j{}.csv", i), 2);
  const std::string s = env.Status();
  const double preparations = JsonNumber(s, "preparations");
  const double deliveries = JsonNumber(s, "deliveries");
  std::printf("issue-20 sync4 at a 10%% cache: preparations %.0f, deliveries %.0f, %.3f per "
              "delivery, evictions %.0f, pacing holds %.0f, lifts %.0f\n",
              preparations, deliveries, preparations / deliveries, JsonNumber(s, "evictions"),
              JsonNumber(s, "holds"), JsonNumber(s, "lifts"));
  EXPECT_EQ(deliveries, 4 * 2 * kImages);
  EXPECT_LE(preparations / deliveries, 0.35) << s;
  EXPECT_EQ(JsonNumber(s, "refcount_total"), 0) << s;
  EXPECT_EQ(JsonNumber(s, "pins"), 0) << s;
  env.StopServer(SIGTERM);
}

// A lagger's owed samples that the cache evicts are prepared again by the workers, not one by one
// in the assembler of the batch that finds them gone. The leader runs an epoch ahead with pacing
// off, so nearly all of the lagger's samples are decided, cached for the leader and evicted
// before the lagger reaches them. Before the fix every such sample was a transient preparation
// (the GPU node's slow scenario ran at half its limit with 15 of 16 workers idle).
TEST(E2ePacingTest, EvictedOwedSamplesGoBackToTheWorkers) {
  E2eEnv env;
  constexpr int kImages = 600;
  uint64_t prepared_set = 0;
  ASSERT_NO_FATAL_FAILURE(prepared_set = AddImages(env, kImages, "96x72", 64));
  env.StartServer(
      {"--cache-size", std::to_string(prepared_set / 5), "--workers", "2", "--pacing", "off"});
  const pid_t leader = env.Consume({"--dataset", "imgs", "--batch-size", "16", "--json",
                                    "--ids-out", (env.dir() / "leader.csv").string()},
                                   "leader");
  const pid_t lagger = env.Consume({"--dataset", "imgs", "--batch-size", "16", "--step-ms", "40",
                                    "--json", "--ids-out", (env.dir() / "lagger.csv").string()},
                                   "lagger");
  for (auto [pid, name] : {std::pair{leader, "leader"}, std::pair{lagger, "lagger"}}) {
    CliResult r = env.Wait(pid, name);
    ASSERT_EQ(r.code, 0) << name << ": " << r.err;
  }
  CheckEpochs(env, "imgs", "leader.csv", 1);
  CheckEpochs(env, "imgs", "lagger.csv", 1);
  const std::string s = env.Status();
  const double transient = JsonNumber(s, "transient_preparations");
  std::printf(
      "lagger behind a free leader, cache at 20%%: preparations %.0f (%.0f transient), "
      "deliveries %.0f, evictions %.0f\n",
      JsonNumber(s, "preparations"), transient, JsonNumber(s, "deliveries"),
      JsonNumber(s, "evictions"));
  EXPECT_EQ(JsonNumber(s, "deliveries"), 2 * kImages);
  EXPECT_GE(JsonNumber(s, "evictions"), kImages / 2) << "the scenario must evict owed samples";
  // Only a sample evicted a second time before its batch takes it stays with the assembler.
  EXPECT_LE(transient, kImages / 20) << s;
  EXPECT_EQ(JsonNumber(s, "refcount_total"), 0) << s;
  EXPECT_EQ(JsonNumber(s, "pins"), 0) << s;
  env.StopServer(SIGTERM);
}

}  // namespace
}  // namespace carpool::e2e
