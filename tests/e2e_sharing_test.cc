// Issue 5, must show: three `carpool consume` jobs on Fashion-MNIST and two derived, overlapping
// datasets, with different batch sizes, one starting late and one 3x slower, each receive exactly
// their dataset once per epoch with the catalog's labels, while the server prepares far fewer
// samples than it delivers. Also: a server that dies gives clients a clear error, not a hang.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <thread>

#include "datasets/catalog.h"
#include "tests/e2e_util.h"

namespace carpool::e2e {
namespace {

// Registers fm (all of Fashion-MNIST train), all (3000 ids), a (2000) and b (2000); a and b
// overlap in 1000 ids and both lie inside all.
void RegisterFashionMnist(E2eEnv& env) {
  env.Dataset({"add", "fm", "--idx", (kFmnist / "train-images-idx3-ubyte.gz").string(),
               (kFmnist / "train-labels-idx1-ubyte.gz").string()});
  env.Dataset({"add", "all", "--from", "fm", "--ids", "1:3001"});
  env.Dataset({"add", "a", "--from", "all", "--ids", "1:2001"});
  env.Dataset({"add", "b", "--from", "all", "--ids", "1001:3001"});
}

TEST(E2eSharingTest, ThreeJobsGetTheirEpochsWhileSharingPreparation) {
  E2eEnv env;
  RegisterFashionMnist(env);
  env.StartServer({"--lease", "2s"});
  const std::string baseline = env.Status();
  ASSERT_EQ(JsonNumber(baseline, "refcount_total"), 0) << baseline;

  const auto start = std::chrono::steady_clock::now();
  pid_t fast = env.Consume({"--dataset", "all", "--batch-size", "64", "--epochs", "2",
                            "--step-ms", "4", "--json", "--ids-out", (env.dir() / "all.csv").string()},
                           "all");
  pid_t slow = env.Consume({"--dataset", "a", "--batch-size", "50", "--epochs", "2", "--step-ms",
                            "12", "--json", "--ids-out", (env.dir() / "a.csv").string()},
                           "a");
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // the third job starts late
  pid_t late = env.Consume({"--dataset", "b", "--batch-size", "32", "--epochs", "2", "--step-ms",
                            "4", "--json", "--ids-out", (env.dir() / "b.csv").string()},
                           "b");
  for (auto [pid, name] : {std::pair{fast, "all"}, {slow, "a"}, {late, "b"}}) {
    CliResult r = env.Wait(pid, name);
    ASSERT_EQ(r.code, 0) << name << ": " << r.err;
    EXPECT_EQ(JsonNumber(r.out, "skipped"), 0) << r.out;
    std::printf("job %s: %s", name, r.out.c_str());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CheckEpochs(env, "all", "all.csv", 2);
  CheckEpochs(env, "a", "a.csv", 2);
  CheckEpochs(env, "b", "b.csv", 2);

  const std::string s = env.Status();
  const double preparations = JsonNumber(s, "preparations");
  const double deliveries = JsonNumber(s, "deliveries");
  std::printf("issue-5 scenario three-jobs: preparations %.0f, deliveries %.0f, sharing ratio %.2f, "
              "hits %.0f, misses %.0f, evictions %.0f, %.2f s\n",
              preparations, deliveries, JsonNumber(s, "sharing_ratio"), JsonNumber(s, "hits"),
              JsonNumber(s, "misses"), JsonNumber(s, "evictions"), seconds);
  EXPECT_EQ(deliveries, 2 * (3000 + 2000 + 2000));
  EXPECT_GE(preparations, 3000);  // every distinct sample at least once
  EXPECT_LT(preparations, deliveries / 2) << s;
  // Nothing is left held: the accounting is back to the baseline.
  EXPECT_EQ(JsonNumber(s, "refcount_total"), 0) << s;
  EXPECT_EQ(JsonNumber(s, "pins"), 0) << s;
  EXPECT_EQ(JsonNumber(s, "bytes_pinned"), 0) << s;
  EXPECT_TRUE(JsonObjects(s, "jobs").empty()) << s;
  env.StopServer(SIGTERM);
}

TEST(E2eSharingTest, NoCacheBaselinePreparesEveryDelivery) {
  E2eEnv env;
  RegisterFashionMnist(env);
  env.StartServer({"--cache-size", "0"});
  pid_t j1 = env.Consume({"--dataset", "a", "--batch-size", "64", "--json"}, "j1");
  pid_t j2 = env.Consume({"--dataset", "b", "--batch-size", "50", "--json"}, "j2");
  ASSERT_EQ(env.Wait(j1, "j1").code, 0);
  ASSERT_EQ(env.Wait(j2, "j2").code, 0);
  const std::string s = env.Status();
  std::printf("issue-5 scenario no-cache: preparations %.0f, deliveries %.0f, sharing ratio %.2f\n",
              JsonNumber(s, "preparations"), JsonNumber(s, "deliveries"),
              JsonNumber(s, "sharing_ratio"));
  EXPECT_EQ(JsonNumber(s, "deliveries"), 4000);
  EXPECT_EQ(JsonNumber(s, "preparations"), 4000) << s;
  env.StopServer(SIGTERM);
}

TEST(E2eSharingTest, ServerDeathGivesClientsAClearErrorNotAHang) {
  E2eEnv env;
  RegisterFashionMnist(env);
  env.StartServer({"--lease", "1s"});
  pid_t job = env.Consume({"--dataset", "all", "--epochs", "50", "--step-ms", "5"}, "job");
  // The job must be running when the server dies (TSan takes seconds to start a client).
  ASSERT_TRUE(env.WaitForJobs(1, std::chrono::seconds(30))) << env.ServerLog();
  env.StopServer(SIGKILL);
  // The crashed server leaves its cache segment behind; the job's batch segment, a memfd named
  // nowhere in /dev/shm, lives on only in the job's mapping.
  const std::vector<std::string> left = env.Segments();
  ASSERT_EQ(left.size(), 1u) << "expected the cache segment alone to be left";
  EXPECT_EQ(left[0].find("-job-"), std::string::npos) << left[0];
  CliResult r;
  ASSERT_TRUE(env.WaitFor(job, "job", std::chrono::seconds(15), &r)) << "client hangs";
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("unavailable"), std::string::npos) << r.err;
  std::printf("client after server kill: %s", r.err.c_str());

  // No server: status and a new job fail at once with a clear message.
  CliResult status = env.Run({"status", "--state-dir", env.state().string()}, "status");
  EXPECT_NE(status.code, 0);
  EXPECT_NE(status.err.find("unavailable"), std::string::npos) << status.err;

  // A restarted server replaces the cache segment, then serves again (the catalog is kept).
  env.StartServer();
  EXPECT_EQ(env.Segments().size(), 1u) << "only the fresh cache segment should exist";
  pid_t again = env.Consume({"--dataset", "a", "--json"}, "again");
  CliResult ok = env.Wait(again, "again");
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(JsonNumber(ok.out, "samples"), 2000) << ok.out;
  env.StopServer(SIGTERM);
  EXPECT_TRUE(env.Segments().empty()) << "a clean stop unlinks every segment";
}

}  // namespace
}  // namespace carpool::e2e
