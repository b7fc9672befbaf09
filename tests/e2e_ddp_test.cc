// Issue 12: a data-parallel job is one job with R ranks. Its ranks run as `carpool consume
// --rank r --world-size R --job-key K` processes against a real server: together they see each
// sample exactly once per epoch (plus the counted padding), every rank gets the same number of
// batches, a rank killed with SIGKILL ends the job for the others with a clear error within the
// lease, ranks that never all join fail in time, and a DDP job shares preparations with a
// single-process job on the same data. The slices are uniform: a statistical test.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/e2e_util.h"

namespace carpool::e2e {
namespace {

void RegisterData(E2eEnv& env) {
  env.Dataset({"add", "fm", "--idx", (kFmnist / "train-images-idx3-ubyte.gz").string(),
               (kFmnist / "train-labels-idx1-ubyte.gz").string()});
  env.Dataset({"add", "d2000", "--from", "fm", "--ids", "1:2001"});
  env.Dataset({"add", "d200", "--from", "fm", "--ids", "1:201"});
}

struct RankRun {
  CliResult result;
  std::vector<Delivery> ids;
};

// Runs the R ranks of one job to completion; `extra` goes to every rank's consume.
std::vector<RankRun> RunRanks(E2eEnv& env, const std::string& key, uint32_t world,
                              const std::vector<std::string>& extra) {
  std::vector<pid_t> pids;
  for (uint32_t r = 0; r < world; ++r) {
    std::vector<std::string> args = {"--rank", std::to_string(r), "--world-size",
                                     std::to_string(world), "--job-key", key, "--json",
                                     "--ids-out", (env.dir() / (key + std::to_string(r))).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    pids.push_back(env.Consume(args, key + std::to_string(r)));
  }
  std::vector<RankRun> runs(world);
  for (uint32_t r = 0; r < world; ++r) {
    runs[r].result = env.Wait(pids[r], key + std::to_string(r));
    runs[r].ids = ReadIds(env.dir() / (key + std::to_string(r)));
  }
  return runs;
}

// Over all ranks, each epoch has every id of [1, n] once plus `padded` repeats per epoch.
void ExpectExactlyOncePerEpoch(const std::vector<RankRun>& runs, uint32_t n, uint32_t epochs,
                               uint64_t padded_per_epoch, bool drop_last, uint32_t global) {
  std::vector<std::map<uint32_t, int>> counts(epochs);
  for (const RankRun& run : runs) {
    for (const Delivery& d : run.ids) {
      ASSERT_LT(d.epoch, epochs);
      ASSERT_GE(d.sample, 1u);
      ASSERT_LE(d.sample, n);
      ++counts[d.epoch][d.sample];
    }
  }
  for (uint32_t e = 0; e < epochs; ++e) {
    uint64_t repeats = 0;
    for (const auto& [id, c] : counts[e]) repeats += static_cast<uint64_t>(c - 1);
    if (drop_last) {  // the dropped tail is missing, nothing repeats
      EXPECT_EQ(counts[e].size(), n / global * global) << "epoch " << e;
      EXPECT_EQ(repeats, 0u) << "epoch " << e;
    } else {
      EXPECT_EQ(counts[e].size(), n) << "epoch " << e << ": a sample is missing";
      EXPECT_EQ(repeats, padded_per_epoch) << "epoch " << e;
    }
  }
}

void ExpectEqualSteps(const std::vector<RankRun>& runs, double batches) {
  for (size_t r = 0; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].result.code, 0) << "rank " << r << ": " << runs[r].result.err;
    EXPECT_EQ(JsonNumber(runs[r].result.out, "batches"), batches) << "rank " << r;
    EXPECT_EQ(JsonNumber(runs[r].result.out, "samples"), JsonNumber(runs[0].result.out, "samples"))
        << "rank " << r << " got another number of samples than rank 0";
  }
}

TEST(E2eDdpTest, TwoAndFourRanksSeeEachSampleOncePerEpochInEqualSteps) {
  E2eEnv env;
  RegisterData(env);
  env.StartServer();
  // 2 ranks x 64: 2000 = 15 x 128 + 80, the last global batch 40 + 40 (no padding).
  std::vector<RankRun> two = RunRanks(env, "two", 2, {"--dataset", "d2000", "--batch-size", "64",
                                                      "--epochs", "2"});
  ExpectEqualSteps(two, 2 * 16);
  ExpectExactlyOncePerEpoch(two, 2000, 2, 0, false, 128);
  // 4 ranks x 64: 2000 = 7 x 256 + 208, the last 52 each.
  std::vector<RankRun> four = RunRanks(env, "four", 4, {"--dataset", "d2000", "--batch-size",
                                                        "64", "--epochs", "2"});
  ExpectEqualSteps(four, 2 * 8);
  ExpectExactlyOncePerEpoch(four, 2000, 2, 0, false, 256);
  // 3 ranks x 64: 2000 = 10 x 192 + 80, the last 27 each: one sample repeated per epoch.
  std::vector<RankRun> three = RunRanks(env, "three", 3, {"--dataset", "d2000", "--batch-size",
                                                          "64", "--epochs", "2"});
  ExpectEqualSteps(three, 2 * 11);
  ExpectExactlyOncePerEpoch(three, 2000, 2, 1, false, 192);
  // drop_last: 10 global batches of 192 per epoch, the 80 left over dropped.
  std::vector<RankRun> dropped = RunRanks(env, "dropped", 3, {"--dataset", "d2000", "--batch-size",
                                                              "64", "--epochs", "2", "--drop-last"});
  ExpectEqualSteps(dropped, 2 * 10);
  ExpectExactlyOncePerEpoch(dropped, 2000, 2, 0, true, 192);
  const std::string s = env.Status();
  EXPECT_EQ(JsonNumber(s, "refcount_total"), 0) << s;
  EXPECT_TRUE(JsonObjects(s, "jobs").empty()) << s;
  env.StopServer(SIGTERM);
}

TEST(E2eDdpTest, ADdpJobSharesPreparationsWithASingleProcessJob) {
  E2eEnv env;
  RegisterData(env);
  env.StartServer();
  pid_t solo = env.Consume({"--dataset", "d2000", "--batch-size", "100", "--epochs", "2",
                            "--step-ms", "2", "--json"},
                           "solo");
  std::vector<RankRun> ddp = RunRanks(env, "pair", 2, {"--dataset", "d2000", "--batch-size", "50",
                                                       "--epochs", "2", "--step-ms", "2"});
  ExpectEqualSteps(ddp, 2 * 20);
  ExpectExactlyOncePerEpoch(ddp, 2000, 2, 0, false, 100);
  ASSERT_EQ(env.Wait(solo, "solo").code, 0);
  const std::string s = env.Status();
  std::printf("ddp + solo: preparations %.0f, deliveries %.0f\n", JsonNumber(s, "preparations"),
              JsonNumber(s, "deliveries"));
  EXPECT_EQ(JsonNumber(s, "deliveries"), 2 * 2000 + 2 * 2000);
  EXPECT_LT(JsonNumber(s, "preparations"), 0.75 * JsonNumber(s, "deliveries")) << s;
  env.StopServer(SIGTERM);
}

TEST(E2eDdpTest, AKilledRankEndsTheJobForTheOthersWithinTheLease) {
  E2eEnv env;
  RegisterData(env);
  env.StartServer({"--lease", "1s"});
  std::vector<pid_t> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(env.Consume({"--dataset", "d2000", "--batch-size", "16", "--epochs", "20",
                                 "--step-ms", "10", "--rank", std::to_string(r), "--world-size",
                                 "3", "--job-key", "victim"},
                                "victim" + std::to_string(r)));
  }
  // Kill rank 1 only once all three joined: killed before, it is a rank that never joined, which
  // the rank-join timeout (60 s) reports instead (TSan takes seconds to start a client).
  ASSERT_TRUE(env.WaitForJobs(3, std::chrono::seconds(30))) << env.ServerLog();
  ASSERT_EQ(kill(ranks[1], SIGKILL), 0);
  const auto killed = std::chrono::steady_clock::now();
  for (int r : {0, 2}) {
    CliResult res;
    ASSERT_TRUE(env.WaitFor(ranks[r], "victim" + std::to_string(r), std::chrono::seconds(10), &res))
        << "rank " << r << " hangs after rank 1 was killed";
    const double after =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
    EXPECT_NE(res.code, 0);
    EXPECT_NE(res.err.find("rank 1 of data-parallel job \"victim\" left"), std::string::npos)
        << res.err;
    EXPECT_LT(after, 4.0) << "the error came " << after << " s after the kill (lease 1 s)";
  }
  CliResult dead;
  ASSERT_TRUE(env.WaitFor(ranks[1], "victim1", std::chrono::seconds(5), &dead));
  // The job's references are gone once its last rank left.
  std::string s;
  for (int i = 0; i < 50; ++i) {
    s = env.Status();
    if (JsonObjects(s, "jobs").empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(JsonObjects(s, "jobs").empty()) << s;
  EXPECT_EQ(JsonNumber(s, "refcount_total"), 0) << s;
  env.StopServer(SIGTERM);
}

TEST(E2eDdpTest, RanksThatDoNotAllJoinFailWithAClearError) {
  E2eEnv env;
  RegisterData(env);
  // 1 s, or 15 s under TSan: rank 1 of "odd" below must reach the server within it.
  env.StartServer({"--rank-join-timeout", std::to_string(kSanitizerSlowdown) + "s"});
  pid_t lonely = env.Consume({"--dataset", "d200", "--rank", "0", "--world-size", "2",
                              "--job-key", "half"},
                             "lonely");
  CliResult r;
  ASSERT_TRUE(env.WaitFor(lonely, "lonely", std::chrono::seconds(10) * kSanitizerSlowdown, &r))
      << "rank 0 hangs";
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("only 1 of the 2 ranks of data-parallel job \"half\" joined"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("missing: 1"), std::string::npos) << r.err;
  // A rank that asks for another batch size than its job's first rank is refused by name.
  pid_t a = env.Consume({"--dataset", "d200", "--batch-size", "8", "--rank", "0",
                         "--world-size", "2", "--job-key", "odd"},
                        "odd0");
  // Rank 0 must be the job's first rank (TSan takes seconds to start a client).
  ASSERT_TRUE(env.WaitForJobs(1, std::chrono::seconds(30), "odd")) << env.ServerLog();
  CliResult b = env.Run({"consume", "--state-dir", env.state().string(), "--dataset", "d200",
                         "--batch-size", "16", "--rank", "1", "--world-size", "2", "--job-key",
                         "odd"},
                        "odd1");
  EXPECT_NE(b.code, 0);
  EXPECT_NE(b.err.find("batch_size 16 (the job's first rank said 8)"), std::string::npos) << b.err;
  CliResult a_result;
  ASSERT_TRUE(env.WaitFor(a, "odd0", std::chrono::seconds(10) * kSanitizerSlowdown, &a_result));
  EXPECT_NE(a_result.code, 0);  // its partner never came
  env.StopServer(SIGTERM);
}

// Which rank a sample goes to is uniform: over E epochs of a 2-rank job on 200 samples, each
// sample's count on rank 0 is Binomial(E, 1/2), so sum((k - E/2)^2 / (E/4)) over the samples is
// about chi-square with 200 degrees of freedom (the slices of one epoch are only weakly dependent).
TEST(E2eDdpTest, RankSlicesAreUniform) {
  E2eEnv env;
  RegisterData(env);
  env.StartServer();
  const uint32_t epochs = 60;
  std::vector<RankRun> runs = RunRanks(env, "stat", 2, {"--dataset", "d200", "--batch-size", "10",
                                                        "--epochs", std::to_string(epochs)});
  ExpectEqualSteps(runs, epochs * 10);
  ExpectExactlyOncePerEpoch(runs, 200, epochs, 0, false, 20);
  std::map<uint32_t, int> on_rank0;
  for (const Delivery& d : runs[0].ids) ++on_rank0[d.sample];
  double chi2 = 0;
  for (uint32_t id = 1; id <= 200; ++id) {
    const double k = on_rank0[id], mean = epochs / 2.0, var = epochs / 4.0;
    chi2 += (k - mean) * (k - mean) / var;
  }
  std::printf("rank slices: chi-square %.1f over 200 samples (df 200)\n", chi2);
  // P(chi2_200 > 290) ~ 3e-5, P(< 130) ~ 1e-5: a rank bias or a fixed split both fall outside.
  EXPECT_LT(chi2, 290);
  EXPECT_GT(chi2, 130);
  env.StopServer(SIGTERM);
}

}  // namespace
}  // namespace carpool::e2e

namespace carpool::e2e {
namespace {

// Two "nodes" on one machine: two servers with their own state dirs, a 4-rank job with 2 ranks
// per node (consume --node k --nodes 2). Each node serves only its hash part, the two parts
// together are every sample once per epoch, and both nodes' ranks take the same number of steps.
TEST(E2eDdpTest, TwoNodesServeDisjointPartsWithEqualSteps) {
  E2eEnv node0, node1;
  for (E2eEnv* env : {&node0, &node1}) {
    RegisterData(*env);
    env->StartServer({"--partition-seed", "42"});
  }
  std::vector<std::vector<RankRun>> runs;
  for (uint32_t k = 0; k < 2; ++k) {
    E2eEnv& env = k == 0 ? node0 : node1;
    runs.push_back(RunRanks(env, "multi", 2, {"--dataset", "d2000", "--batch-size", "32",
                                              "--epochs", "2", "--node", std::to_string(k),
                                              "--nodes", "2"}));
  }
  // Equal steps on every rank of both nodes: the larger part's ceil(part / 64) batches.
  const double steps = JsonNumber(runs[0][0].result.out, "batches");
  for (uint32_t k = 0; k < 2; ++k) ExpectEqualSteps(runs[k], steps);
  std::map<uint32_t, std::map<uint32_t, int>> per_epoch;  // epoch -> sample -> count
  std::vector<std::set<uint32_t>> part(2);
  for (uint32_t k = 0; k < 2; ++k) {
    for (const RankRun& run : runs[k]) {
      for (const Delivery& d : run.ids) {
        ++per_epoch[d.epoch][d.sample];
        part[k].insert(d.sample);
      }
    }
  }
  for (uint32_t s : part[0]) EXPECT_FALSE(part[1].count(s)) << "sample " << s << " on both nodes";
  ASSERT_EQ(per_epoch.size(), 2u);
  for (const auto& [epoch, counts] : per_epoch) {
    EXPECT_EQ(counts.size(), 2000u) << "epoch " << epoch << ": not every sample";
  }
  const double batches = std::max(std::ceil(part[0].size() / 64.0), std::ceil(part[1].size() / 64.0));
  EXPECT_EQ(steps, 2 * batches) << "parts " << part[0].size() << " and " << part[1].size();
  std::printf("two nodes: parts %zu and %zu, %.0f steps per rank\n", part[0].size(),
              part[1].size(), steps);
  node0.StopServer(SIGTERM);
  node1.StopServer(SIGTERM);
}

}  // namespace
}  // namespace carpool::e2e
