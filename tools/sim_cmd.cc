// `carpool sim`: the sampler without I/O. Builds the jobs from --job specs (id ranges, or datasets
// of the catalog), runs sim/sim.h's loop and prints the summary, optionally a CSV trace.
// With a cache option (--cache, --policy, --lookahead, --prefetch, --jitter, --jitter-period,
// --prep-capacity, --batch, --pacing, --tick-trace) it runs the scheduler and cache instead
// (tools/sim_cache_mode.h).
#include <fmt/core.h>

#include <boost/program_options.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "datasets/catalog.h"
#include "datasets/state_dir.h"
#include "sim/sim.h"
#include "sim/sim_spec.h"
#include "tools/command.h"
#include "tools/options.h"
#include "tools/sim_cache_mode.h"
#include "tools/sim_nodes_mode.h"
#include "sampler/node_partition.h"

namespace carpool::tools {
namespace {

namespace po = boost::program_options;

constexpr std::string_view kUsage = R"(usage: carpool sim --job NAME=SPEC [--job ...] [options]

Runs the dependent sampler alone (no I/O): each job joins at its START round, takes part in a
round with probability SPEED, runs E epochs and leaves.

With a cache (any of the cache-mode options below) it runs the server's scheduler and cache
index in simulated ticks instead: a job joins at tick START and consumes SPEED samples per tick
(any SPEED > 0; fractions accumulate); the scheduler keeps each job up to L decided samples ahead,
running rounds when a queue falls below the prefetch depth; every delivery is a cache lookup, and
a miss is a preparation. The summary adds preparations, hits, evictions and belady_preparations
(the offline optimum on the same deliveries). --cache 0 is the no-sharing baseline: every
delivery is a preparation. To model a server that falls behind: --jitter varies each job's
speed (a new factor every --jitter-period ticks), --prep-capacity limits the preparations per
tick (a miss beyond it waits, and idle capacity prepares ahead), and --pacing on (the default)
lets the scheduler hold a job that leads its sharers by more than the cache can keep for them.

With --nodes K every job spans K nodes, one server each (docs/ddp.md): node k runs the jobs on
their parts of the datasets (hash partition, --partition-seed) with its own coins. The summary
gives each node's sharing, the sharing over all nodes, and each job's per-epoch coverage over the
nodes: every sample once per epoch (none missing, none repeated).

  SPEC := LO:HI[%FRACTION][@START][xSPEED][/EPOCHS]
        | dataset:REGISTERED_NAME[@START][xSPEED][/EPOCHS]
    LO:HI       sample ids [LO, HI)
    %FRACTION   keep a seeded random FRACTION in (0, 1] of them
    @START      join at round START (default 0); with a cache, at tick START
    xSPEED      take part in each round with probability SPEED in (0, 1] (default 1);
                with a cache, consume SPEED samples per tick (default 1)
    /EPOCHS     this job's epochs, instead of --epochs (a sweep's trial stopped early)

options:
)";

int Fail(const Status& s) {
  fmt::print(stderr, "carpool sim: {}\n", s.message());
  return 1;
}

// Resolves every spec to a SimJob. The catalog is opened only if some spec names a dataset.
// `max_speed`: 1 for participation probabilities, infinity for deliveries per tick (cache mode).
Result<std::vector<SimJob>> BuildJobs(const std::vector<std::string>& args, uint64_t seed,
                                      const std::string& state_dir_flag, double max_speed) {
  std::vector<SimJob> jobs;
  std::unique_ptr<Catalog> catalog;
  for (size_t i = 0; i < args.size(); ++i) {
    Result<JobSpec> spec = ParseJobSpec(args[i], max_speed);
    if (!spec.ok()) return spec.status();
    SimJob job{spec->name, Roaring(), spec->start, spec->speed, spec->epochs};
    if (spec->dataset.empty()) {
      Result<Roaring> ids = RangeIds(*spec, SplitMix64(seed + 1 + i));
      if (!ids.ok()) return ids.status();
      job.dataset = std::move(*ids);
    } else {
      if (catalog == nullptr) {
        Result<std::filesystem::path> dir = ResolveStateDir(state_dir_flag);
        if (!dir.ok()) return dir.status();
        Result<std::unique_ptr<Catalog>> opened = Catalog::Open(*dir);
        if (!opened.ok()) return opened.status();
        catalog = std::move(*opened);
      }
      Result<DatasetInfo> info = catalog->GetDataset(spec->dataset);
      if (!info.ok()) return info.status();
      job.dataset = std::move(info->ids);
    }
    jobs.push_back(std::move(job));
  }
  return jobs;
}

void PrintText(const SimSummary& s) {
  fmt::print("rounds                      {}\n", s.rounds);
  fmt::print("assignments                 {}\n", s.assignments);
  fmt::print("distinct (round, sample)    {}\n", s.distinct);
  fmt::print("sharing ratio               {:.4f}\n", s.sharing_ratio);
  for (const SimSummary::Job& j : s.jobs) {
    fmt::print("job {:<23} {} assignments, {} epochs\n", j.name, j.assignments, j.epochs);
  }
  if (s.has_pair) {
    fmt::print(
        "pair {},{}: shared in {} of {} rounds both took part in: fraction {:.4f}; "
        "mean bound |R1∩R2|/max(|R1|,|R2|) {:.4f} (sd of the fraction at the bound "
        "{:.4f})\n",
        s.jobs[0].name, s.jobs[1].name, s.pair_shared, s.pair_rounds, s.shared_fraction,
        s.mean_bound, s.bound_sd);
  }
}

void PrintJson(const SimSummary& s) {
  using Json = nlohmann::ordered_json;
  Json jobs = Json::array();
  for (const SimSummary::Job& j : s.jobs) {
    jobs.push_back({{"name", j.name}, {"assignments", j.assignments}, {"epochs", j.epochs}});
  }
  Json pair = nullptr;
  if (s.has_pair) {
    pair = {{"jobs", {s.jobs[0].name, s.jobs[1].name}},
            {"rounds_both", s.pair_rounds},
            {"shared_rounds", s.pair_shared},
            {"shared_fraction", s.shared_fraction},
            {"mean_bound", s.mean_bound},
            {"bound_sd", s.bound_sd}};
  }
  const Json summary = {{"rounds", s.rounds},
                        {"assignments", s.assignments},
                        {"distinct_round_samples", s.distinct},
                        {"sharing_ratio", s.sharing_ratio},
                        {"jobs", std::move(jobs)},
                        {"pair", std::move(pair)}};
  fmt::print("{}\n", summary.dump());
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

int Sim(int argc, char** argv) {
  std::vector<std::string> job_args;
  uint64_t epochs = 1, seed = 1;
  std::string trace_path, state_dir, policy = "next-use", pacing = "on", follow = "on";
  CacheModeOptions cache_mode;
  uint32_t nodes = 1;
  uint64_t partition_seed = kDefaultPartitionSeed;
  po::options_description opts;
  opts.add_options()("help,h", "show this help")("job", po::value(&job_args)->composing(),
                                                 "NAME=SPEC (repeat for each job)")(
      "epochs", po::value(&epochs)->default_value(1), "epochs per job (E)")(
      "seed", po::value(&seed)->default_value(1), "seed of the sampler, coins and fractions")(
      "trace", po::value(&trace_path), "write round,job,epoch,sample CSV to FILE")(
      "json", "print the summary as one JSON object")("state-dir", po::value(&state_dir),
                                                      "catalog directory for dataset: specs")(
      "nodes", po::value(&nodes), "every job spans this many nodes, one server each (default 1)")(
      "partition-seed", po::value(&partition_seed),
      "with --nodes: the cross-node partition's seed (default: the server's)");
  opts.add_options()("cache", po::value(&cache_mode.cache),
                     "cache mode: cache capacity in samples (0: no cache)")(
      "policy", po::value(&policy), "cache mode: eviction policy refcnt|next-use|lru (next-use)")(
      "lookahead", po::value(&cache_mode.lookahead),
      "cache mode: look-ahead L in samples; 0: derived from the cache and the jobs (0)")(
      "prefetch", po::value(&cache_mode.prefetch),
      "cache mode: prefetch depth in samples that triggers rounds (4)")(
      "jitter", po::value(&cache_mode.jitter),
      "cache mode: a job's speed is multiplied by max(0, 1 + SIGMA N(0,1)), a new factor every "
      "--jitter-period ticks, drawn from --seed (0: exact speeds)")(
      "jitter-period", po::value(&cache_mode.jitter_period),
      "cache mode: ticks each speed factor lasts: a job slowed for a while (1)")(
      "prep-capacity", po::value(&cache_mode.prep_capacity),
      "cache mode: preparations per tick; a miss beyond it waits, leftovers prepare ahead (0: "
      "unlimited)")("batch", po::value(&cache_mode.batch),
                    "cache mode: samples per batch, taken and pinned together (0: a job's "
                    "deliveries of one tick)")(
      "pacing", po::value(&pacing), "cache mode: on | off, the scheduler's coupled pacing (on)")(
      "follow", po::value(&follow),
      "cache mode: on | off, a new job's first epoch follows a running job's order (on)")(
      "tick-trace", po::value(&cache_mode.tick_trace_path),
      "cache mode: write tick,job,delivered,held,starved,queued,owed,credit CSV to FILE");
  po::variables_map vm;
  if (auto rc = ParseCommandLine(argc, argv, "carpool sim", kUsage, opts, &vm)) return *rc;
  if (job_args.empty()) {
    fmt::print(stderr,
               "carpool sim: no --job given; e.g. 'carpool sim --job a=0:1000 --job "
               "b=500:1500'\n");
    return 2;
  }
  bool with_cache = false;
  for (const char* flag : {"cache", "policy", "lookahead", "prefetch", "jitter", "jitter-period",
                           "prep-capacity", "batch", "pacing", "follow", "tick-trace"}) {
    with_cache |= vm.count(flag) != 0;
  }
  Result<std::vector<SimJob>> jobs = BuildJobs(
      job_args, seed, state_dir, with_cache ? std::numeric_limits<double>::infinity() : 1.0);
  if (!jobs.ok()) return Fail(jobs.status());
  if (nodes == 0) return Fail(Status::InvalidArgument("--nodes must be at least 1"));
  if (nodes > 1) {
    if (with_cache || !trace_path.empty()) {
      return Fail(Status::InvalidArgument(
          "--nodes runs the sampler per node; it takes no cache options and no --trace"));
    }
    return RunNodesMode(*jobs, {.nodes = nodes,
                                .partition_seed = partition_seed,
                                .epochs = epochs,
                                .seed = seed,
                                .json = vm.count("json") != 0});
  }
  if (with_cache) {
    Result<cache::EvictionPolicy> p = cache::ParseEvictionPolicy(policy);
    if (!p.ok()) return Fail(p.status());
    if (Status s = SetOnOff("pacing", pacing, &cache_mode.pacing); !s.ok()) return Fail(s);
    if (Status s = SetOnOff("follow", follow, &cache_mode.follow); !s.ok()) return Fail(s);
    cache_mode.policy = *p;
    cache_mode.epochs = epochs;
    cache_mode.seed = seed;
    cache_mode.trace_path = trace_path;
    cache_mode.json = vm.count("json") != 0;
    return RunCacheMode(*jobs, cache_mode);
  }
  Result<std::unique_ptr<Simulation>> sim =
      Simulation::Create(std::move(*jobs), {.epochs = epochs, .seed = seed});
  if (!sim.ok()) return Fail(sim.status());
  std::unique_ptr<std::FILE, FileCloser> trace;
  if (!trace_path.empty()) {
    trace.reset(std::fopen(trace_path.c_str(), "w"));
    if (trace == nullptr) {
      return Fail(
          Status::IOError(fmt::format("cannot write --trace \"{}\": {}; check that its "
                                      "directory exists and is writable",
                                      trace_path, std::strerror(errno))));
    }
    fmt::print(trace.get(), "round,job,epoch,sample\n");
  }
  Simulation& s = **sim;
  SimStats stats(s);
  const SimSummary summary = RunToEnd(s, stats, [&](const RoundRecord& r) {
    if (trace == nullptr) return;
    for (const Assignment& a : r.assignments) {
      for (JobId j : a.jobs) {
        fmt::print(trace.get(), "{},{},{},{}\n", r.round, s.jobs()[j].name, r.epoch[j], a.sample);
      }
    }
  });
  if (trace != nullptr && (std::fflush(trace.get()) != 0 || std::ferror(trace.get()))) {
    return Fail(Status::IOError(
        fmt::format("writing --trace \"{}\" failed: {}", trace_path, std::strerror(errno))));
  }
  if (vm.count("json")) {
    PrintJson(summary);
  } else {
    PrintText(summary);
  }
  return 0;
}

const CommandRegistrar kRegistrar("sim",
                                  "run the dependent sampler alone on synthetic or "
                                  "registered datasets",
                                  Sim);

}  // namespace
}  // namespace carpool::tools
