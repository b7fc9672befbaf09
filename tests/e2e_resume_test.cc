// Issue 10 item 4, mid-epoch resume end to end: `carpool consume --checkpoint` jobs killed with
// SIGKILL at random points (and the server with them, now and then), each restarted with
// `--resume` from its last checkpoint, see every sample of every epoch exactly once.
#include <gtest/gtest.h>
#include <signal.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "carpool/client.h"
#include "tests/e2e_util.h"

namespace carpool::e2e {
namespace {

// The samples taken so far by the position in `file` (0 when there is none yet).
uint64_t SamplesAt(const fs::path& file) {
  const std::string bytes = Slurp(file);
  if (bytes.empty()) return 0;
  Result<JobPosition> p = JobPosition::Parse(bytes);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? p->samples : 0;
}

size_t Lines(const fs::path& file) {
  const std::string text = Slurp(file);
  return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

void Register(E2eEnv& env) {
  env.Dataset({"add", "fm", "--idx", (kFmnist / "train-images-idx3-ubyte.gz").string(),
               (kFmnist / "train-labels-idx1-ubyte.gz").string()});
  env.Dataset({"add", "part", "--from", "fm", "--ids", "101:701"});  // 600 samples
}

TEST(E2eResumeTest, HundredKillAndResumePointsIncludingServerRestartsLoseAndRepeatNothing) {
  E2eEnv env;
  Register(env);
  env.StartServer({"--lease", "1s"});
  std::mt19937 rng(20261126);
  constexpr int kTrainings = 10, kKillsPerTraining = 10;
  constexpr uint32_t kEpochs = 2, kSize = 600;
  int kills = 0, server_restarts = 0, run = 0;
  for (int t = 0; t < kTrainings; ++t) {
    const fs::path checkpoint = env.dir() / fmt::format("t{}.pos", t);
    std::vector<Delivery> kept;  // the deliveries each run made before its last checkpoint
    uint64_t samples_before = 0;
    for (int life = 0; life <= kKillsPerTraining; ++life, ++run) {
      const std::string name = fmt::format("t{}-{}", t, life);
      const fs::path ids = env.dir() / (name + ".csv");
      std::vector<std::string> args = {"--dataset", "part", "--batch-size", "20", "--epochs",
                                       std::to_string(kEpochs), "--seed", std::to_string(t),
                                       "--step-ms", "1", "--ids-out", ids.string(),
                                       "--checkpoint", checkpoint.string()};
      if (fs::exists(checkpoint)) args.insert(args.end(), {"--resume", checkpoint.string()});
      pid_t job = env.Consume(args, name);
      const bool last = life == kKillsPerTraining;
      if (!last) {
        // Dies after a random number of samples of this life (0..~1 epoch), mid-stream.
        const size_t at = rng() % (kSize + 1);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        CliResult ended;
        bool exited = false;
        while (Lines(ids) < at && std::chrono::steady_clock::now() < deadline &&
               !(exited = env.WaitFor(job, name, std::chrono::milliseconds(0), &ended))) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        if (!exited) {
          ::kill(job, SIGKILL);
          (void)env.Wait(job, name);
        }
        ++kills;
        if (rng() % 4 == 0) {  // the server dies too, and comes back
          env.StopServer(SIGKILL);
          env.StartServer({"--lease", "1s"});
          ++server_restarts;
        }
      } else {
        CliResult r = env.Wait(job, name);
        ASSERT_EQ(r.code, 0) << r.err;
      }
      const uint64_t samples_now = SamplesAt(checkpoint);
      const std::vector<Delivery> got = ReadIds(ids);
      const uint64_t checkpointed = samples_now - samples_before;
      // Lines past the checkpoint: written, then killed before the checkpoint. The last life
      // checkpoints every batch it writes.
      ASSERT_GE(got.size(), checkpointed) << name;
      if (last) {
        ASSERT_EQ(got.size(), checkpointed) << name;
      }
      kept.insert(kept.end(), got.begin(), got.begin() + static_cast<std::ptrdiff_t>(checkpointed));
      samples_before = samples_now;
    }
    std::map<uint32_t, std::multiset<uint32_t>> by_epoch;
    for (const Delivery& d : kept) by_epoch[d.epoch].insert(d.sample);
    ASSERT_EQ(by_epoch.size(), kEpochs) << "training " << t;
    for (const auto& [epoch, ids] : by_epoch) {
      EXPECT_EQ(ids.size(), kSize) << "training " << t << " epoch " << epoch;
      EXPECT_EQ(std::set<uint32_t>(ids.begin(), ids.end()).size(), kSize)
          << "training " << t << " epoch " << epoch << ": a sample repeated";
      EXPECT_EQ(*ids.begin(), 101u);
      EXPECT_EQ(*ids.rbegin(), 700u);
    }
  }
  std::printf("resume: %d trainings, %d kill -9 points (%d with a server restart), %d runs\n",
              kTrainings, kills, server_restarts, run);
  EXPECT_EQ(kills, kTrainings * kKillsPerTraining);
  EXPECT_GT(server_restarts, 0);
  env.StopServer(SIGTERM);
}

TEST(E2eResumeTest, ACheckpointTakenAfterTheLastBatchEndsAtOnce) {
  E2eEnv env;
  Register(env);
  env.StartServer();
  const fs::path checkpoint = env.dir() / "done.pos";
  CliResult first = env.Wait(env.Consume({"--dataset", "part", "--batch-size", "100", "--checkpoint",
                                          checkpoint.string(), "--json"},
                                         "first"),
                             "first");
  ASSERT_EQ(first.code, 0) << first.err;
  CliResult again = env.Wait(env.Consume({"--dataset", "part", "--batch-size", "100", "--resume",
                                          checkpoint.string(), "--json"},
                                         "again"),
                             "again");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(JsonNumber(again.out, "samples"), 0) << again.out;
  EXPECT_EQ(JsonNumber(again.out, "start_epoch"), 1) << again.out;
  env.StopServer(SIGTERM);
}

TEST(E2eResumeTest, APositionThisJobCannotTakeIsAClearError) {
  E2eEnv env;
  Register(env);
  env.Dataset({"add", "other", "--from", "fm", "--ids", "1001:1101"});
  env.StartServer();
  const fs::path checkpoint = env.dir() / "part.pos";
  pid_t job = env.Consume({"--dataset", "part", "--batch-size", "20", "--epochs", "3",
                           "--step-ms", "5", "--checkpoint", checkpoint.string()},
                          "part");
  while (SamplesAt(checkpoint) < 100) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::kill(job, SIGKILL);
  (void)env.Wait(job, "part");
  // Another dataset.
  CliResult other = env.Run({"consume", "--dataset", "other", "--resume", checkpoint.string(),
                             "--state-dir", env.state().string()},
                            "other");
  EXPECT_EQ(other.code, 1);
  EXPECT_NE(other.err.find("the checkpoint's position is in dataset \"part\""), std::string::npos)
      << other.err;
  // A torn file.
  const std::string bytes = Slurp(checkpoint);
  std::ofstream(env.dir() / "torn.pos", std::ios::binary) << bytes.substr(0, bytes.size() - 3);
  CliResult torn = env.Run({"consume", "--dataset", "part", "--resume",
                            (env.dir() / "torn.pos").string(), "--state-dir",
                            env.state().string()},
                           "torn");
  EXPECT_EQ(torn.code, 1);
  EXPECT_NE(torn.err.find("not a carpool job position"), std::string::npos) << torn.err;
  CliResult missing = env.Run({"consume", "--dataset", "part", "--resume",
                               (env.dir() / "nope.pos").string(), "--state-dir",
                               env.state().string()},
                              "missing");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.err.find("cannot read --resume"), std::string::npos) << missing.err;
  // A data-parallel job cannot resume yet: said so, with the way out.
  CliResult ddp = env.Run({"consume", "--dataset", "part", "--resume", checkpoint.string(),
                           "--world-size", "2", "--rank", "0", "--job-key", "k", "--state-dir",
                           env.state().string()},
                          "ddp");
  EXPECT_EQ(ddp.code, 1);
  EXPECT_NE(ddp.err.find("resuming a data-parallel job"), std::string::npos) << ddp.err;
  env.StopServer(SIGTERM);
}

TEST(E2eResumeTest, AJobWhoseServerDiesGetsUnavailableThenResumesOnTheNewOne) {
  E2eEnv env;
  Register(env);
  env.StartServer();
  const fs::path checkpoint = env.dir() / "j.pos";
  const fs::path ids1 = env.dir() / "j1.csv";
  pid_t job = env.Consume({"--dataset", "part", "--batch-size", "20", "--step-ms", "5",
                           "--ids-out", ids1.string(), "--checkpoint", checkpoint.string()},
                          "j1");
  while (SamplesAt(checkpoint) < 200) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto killed = std::chrono::steady_clock::now();
  env.StopServer(SIGKILL);
  CliResult r = env.Wait(job, "j1");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("unavailable"), std::string::npos) << r.err;
  EXPECT_LT(seconds, 12.0) << "the job hung after its server died";
  const uint64_t taken = SamplesAt(checkpoint);
  env.StartServer();
  const fs::path ids2 = env.dir() / "j2.csv";
  CliResult rest = env.Wait(env.Consume({"--dataset", "part", "--batch-size", "20", "--ids-out",
                                         ids2.string(), "--resume", checkpoint.string()},
                                        "j2"),
                            "j2");
  ASSERT_EQ(rest.code, 0) << rest.err;
  std::vector<Delivery> all = ReadIds(ids1);
  all.resize(taken);
  for (const Delivery& d : ReadIds(ids2)) all.push_back(d);
  std::set<uint32_t> distinct;
  for (const Delivery& d : all) distinct.insert(d.sample);
  EXPECT_EQ(all.size(), 600u);
  EXPECT_EQ(distinct.size(), 600u);
  env.StopServer(SIGTERM);
}

}  // namespace
}  // namespace carpool::e2e
