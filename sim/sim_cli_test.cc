// Runs the real `carpool sim` binary ($CARPOOL_BIN_DIR/carpool) and checks its JSON summary.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

namespace carpool {
namespace {

struct Output {
  int exit_code;
  std::string text;
};

Output RunCarpool(const std::string& args) {
  const char* dir = std::getenv("CARPOOL_BIN_DIR");
  std::string cmd = std::string(dir ? dir : ".") + "/carpool " + args + " 2>&1";
  Output out{-1, ""};
  std::FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.text.append(buf, n);
  const int status = pclose(pipe);
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// The number at `pointer` ("/rounds", "/pair/mean_bound") in the JSON summary; NaN and a
// failure when the text is not JSON or has no number there.
double Field(const std::string& json, const std::string& pointer) {
  const nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  const nlohmann::json::json_pointer at(pointer);
  if (doc.is_discarded() || !doc.contains(at) || !doc.at(at).is_number()) {
    ADD_FAILURE() << "no number at " << pointer << " in " << json;
    return std::nan("");
  }
  return doc.at(at).get<double>();
}

TEST(SimCliTest, IdenticalJobsHaveSharingRatioTwo) {
  Output o = RunCarpool("sim --job a=0:1000 --job b=0:1000 --json");
  ASSERT_EQ(o.exit_code, 0) << o.text;
  EXPECT_EQ(Field(o.text, "/sharing_ratio"), 2.0);
  EXPECT_EQ(Field(o.text, "/assignments"), 2000);
  EXPECT_EQ(Field(o.text, "/distinct_round_samples"), 1000);
  EXPECT_EQ(Field(o.text, "/pair/shared_fraction"), 1.0);
  EXPECT_EQ(Field(o.text, "/pair/mean_bound"), 1.0);
}

// The shared fraction must agree with the mean bound within z = 3.29 of its own standard deviation
// (two-sided 1e-3), for several seeds.
TEST(SimCliTest, HalfOverlapSharesAtTheMeanBound) {
  for (int seed = 1; seed <= 3; ++seed) {
    Output o =
        RunCarpool("sim --job a=0:1000 --job b=500:1500 --json --seed " + std::to_string(seed));
    ASSERT_EQ(o.exit_code, 0) << o.text;
    const double fraction = Field(o.text, "/pair/shared_fraction");
    const double bound = Field(o.text, "/pair/mean_bound");
    const double sd = Field(o.text, "/pair/bound_sd");
    EXPECT_GT(bound, 0.4);
    EXPECT_LT(bound, 0.6);
    EXPECT_GT(sd, 0);
    EXPECT_LE(std::fabs(fraction - bound), 3.29 * sd) << o.text;
    EXPECT_NEAR(Field(o.text, "/sharing_ratio"), 2000.0 / (2000 - 1000 * fraction), 1e-9);
  }
}

TEST(SimCliTest, BadSpecIsOneClearLine) {
  Output o = RunCarpool("sim --job a=5:1");
  EXPECT_NE(o.exit_code, 0);
  EXPECT_NE(o.text.find("\"a=5:1\""), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("5:1"), std::string::npos);
  EXPECT_EQ(o.text.find('\n'), o.text.size() - 1) << o.text;
}

// Cache mode (--cache): the scheduler and cache index in simulated ticks.
TEST(SimCliTest, NoCacheIsTheNoSharingBaseline) {
  Output o = RunCarpool("sim --job a=0:1000 --job b=0:1000x0.5 --epochs 2 --cache 0 --json");
  ASSERT_EQ(o.exit_code, 0) << o.text;
  EXPECT_EQ(Field(o.text, "/deliveries"), 4000);
  EXPECT_EQ(Field(o.text, "/preparations"), 4000);
  EXPECT_EQ(Field(o.text, "/belady_preparations"), 4000);
  EXPECT_EQ(Field(o.text, "/hits"), 0);
}

TEST(SimCliTest, CacheModeCountsPreparationsAgainstBelady) {
  for (const char* policy : {"refcnt", "next-use", "lru"}) {
    Output o =
        RunCarpool(std::string("sim --job a=0:2000x2 --job b=0:2000@100x0.5 --epochs 2 --cache 200 "
                               "--lookahead 64 --json --policy ") +
                   policy);
    ASSERT_EQ(o.exit_code, 0) << o.text;
    const double deliveries = Field(o.text, "/deliveries");
    const double preparations = Field(o.text, "/preparations");
    EXPECT_EQ(deliveries, 8000) << "two jobs, two epochs of 2000 ids";
    EXPECT_EQ(Field(o.text, "/hits") + preparations, deliveries);
    EXPECT_LE(Field(o.text, "/belady_preparations"), preparations) << policy;
    EXPECT_GE(preparations, 2000) << "each id is prepared at least once";
    EXPECT_LT(preparations, deliveries) << "a 10% cache shares something";
    EXPECT_NE(o.text.find(std::string("\"policy\":\"") + policy + "\""), std::string::npos);
  }
}

// A trial stopped after its first epoch (/1) leaves while the others run --epochs, with and
// without a cache.
TEST(SimCliTest, AJobsOwnEpochsEndItEarly) {
  Output rounds = RunCarpool("sim --job a=0:1000 --job b=0:1000/1 --epochs 3 --json");
  ASSERT_EQ(rounds.exit_code, 0) << rounds.text;
  EXPECT_EQ(Field(rounds.text, "/assignments"), 4000) << "3 epochs of a, 1 of b";
  EXPECT_EQ(Field(rounds.text, "/jobs/1/epochs"), 1);
  Output cached = RunCarpool("sim --job a=0:1000 --job b=0:1000/1 --epochs 3 --cache 100 --json");
  ASSERT_EQ(cached.exit_code, 0) << cached.text;
  EXPECT_EQ(Field(cached.text, "/deliveries"), 4000);
  EXPECT_EQ(Field(cached.text, "/jobs/1/epochs"), 1);
  EXPECT_EQ(Field(cached.text, "/jobs/0/epochs"), 3);
}

TEST(SimCliTest, SpeedAboveOneNeedsCacheMode) {
  Output plain = RunCarpool("sim --job a=0:100x2 --json");
  EXPECT_NE(plain.exit_code, 0);
  EXPECT_NE(plain.text.find("SPEED \"2\""), std::string::npos) << plain.text;
  Output cached = RunCarpool("sim --job a=0:100x2 --cache 10 --json");
  ASSERT_EQ(cached.exit_code, 0) << cached.text;
  EXPECT_EQ(Field(cached.text, "/ticks"), 50) << "two deliveries per tick";
  Output bad = RunCarpool("sim --job a=0:100 --cache 10 --policy fifo");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.text.find("\"fifo\""), std::string::npos) << bad.text;
}

// The timing flags reach the simulation and the summary: four jobs of one dataset that drift
// apart on a server that keeps up with one of them collapse without pacing and share with it.
TEST(SimCliTest, CacheModeReportsTimingAndPacing) {
  const std::string jobs =
      "sim --job a=0:1000 --job b=0:1000 --job c=0:1000 --job d=0:1000 --epochs 2 --cache 50 "
      "--jitter 0.5 --jitter-period 50 --prep-capacity 1.2 --batch 32 --json --pacing ";
  double ratio[2] = {0, 0};
  for (int on = 0; on < 2; ++on) {
    Output o = RunCarpool(jobs + (on ? "on" : "off"));
    ASSERT_EQ(o.exit_code, 0) << o.text;
    const nlohmann::json doc = nlohmann::json::parse(o.text);
    EXPECT_EQ(doc["pacing"], on ? "on" : "off");
    EXPECT_EQ(doc["jitter"].get<double>(), 0.5);
    EXPECT_EQ(doc["jitter_period"].get<int>(), 50);
    EXPECT_EQ(doc["prep_capacity"].get<double>(), 1.2);
    EXPECT_EQ(doc["batch"].get<int>(), 32);
    EXPECT_TRUE(doc["lookahead_derived"].get<bool>());
    EXPECT_GE(Field(o.text, "/lookahead"), 64) << "the derived L is at least 64";
    EXPECT_GE(Field(o.text, "/window"), 32) << "at least one batch";
    EXPECT_EQ(Field(o.text, "/deliveries"), 8000);
    ratio[on] = Field(o.text, "/preparations_per_delivery");
    EXPECT_DOUBLE_EQ(ratio[on], Field(o.text, "/preparations") / 8000);
    EXPECT_LE(Field(o.text, "/belady_preparations"), Field(o.text, "/preparations"));
    double held = 0;
    for (const auto& j : doc["jobs"]) {
      held += j["held_ticks"].get<double>();
      EXPECT_GT(j["finish_tick"].get<double>(), 0);
    }
    EXPECT_EQ(held > 0, on == 1) << o.text;
  }
  EXPECT_GT(ratio[0], 0.45) << "pacing off";
  EXPECT_LE(ratio[1], 0.35) << "pacing on";
}

TEST(SimCliTest, BadTimingFlagsAreOneClearLine) {
  const std::pair<const char*, const char*> cases[] = {
      {"--jitter nan", "use 0 for exact speeds"},
      {"--jitter=-1", "use 0 for exact speeds"},
      {"--prep-capacity=-2", "use 0 for unlimited"},
      {"--prep-capacity nan", "use 0 for unlimited"},
      {"--jitter-period 0", "use 1"},
      {"--pacing maybe", "use on or off"},
  };
  for (const auto& [flag, fix] : cases) {
    Output o = RunCarpool(std::string("sim --job a=0:100 ") + flag);
    EXPECT_NE(o.exit_code, 0) << flag;
    std::string value = flag;  // the message names the flag and its value: "--jitter -1"
    std::replace(value.begin(), value.end(), '=', ' ');
    if (value.find("maybe") != std::string::npos) value = "--pacing \"maybe\"";
    EXPECT_NE(o.text.find(value), std::string::npos) << o.text;
    EXPECT_NE(o.text.find(fix), std::string::npos) << o.text;
    EXPECT_EQ(o.text.find('\n'), o.text.size() - 1) << o.text;
  }
}

// A sweep across 3 nodes: every epoch of every job is covered once over the nodes, and the nodes
// still share (identical jobs: every delivery shared by both, as on one node).
TEST(SimCliTest, NodesCoverEveryEpochOnceAndStillShare) {
  Output out = RunCarpool("sim --job a=0:3000 --job b=0:3000 --nodes 3 --epochs 2 --json");
  ASSERT_EQ(out.exit_code, 0) << out.text;
  const nlohmann::json doc = nlohmann::json::parse(out.text);
  EXPECT_TRUE(doc["every_epoch_exactly_once"].get<bool>()) << out.text;
  ASSERT_EQ(doc["per_node"].size(), 3u);
  double parts = 0;
  for (const auto& n : doc["per_node"]) parts += n["assignments"].get<double>() / 4;  // 2 jobs x 2
  EXPECT_EQ(parts, 3000) << "the nodes' parts are not a partition of the dataset";
  EXPECT_NEAR(Field(out.text, "/sharing_ratio"), 2.0, 1e-9);
  for (const auto& j : doc["jobs"]) {
    ASSERT_EQ(j["epochs"].size(), 2u);
    for (const auto& e : j["epochs"]) {
      EXPECT_EQ(e["samples"].get<int>(), 3000);
      EXPECT_EQ(e["repeated"].get<int>(), 0);
    }
  }
  Output cached = RunCarpool("sim --job a=0:100 --nodes 2 --cache 10");
  EXPECT_NE(cached.exit_code, 0);
  EXPECT_NE(cached.text.find("--nodes"), std::string::npos) << cached.text;
}

}  // namespace
}  // namespace carpool
