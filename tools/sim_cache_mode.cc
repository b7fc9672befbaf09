#include "tools/sim_cache_mode.h"

#include <fmt/core.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "server/scheduler_sim.h"

namespace carpool::tools {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

int Fail(const Status& s) {
  fmt::print(stderr, "carpool sim: {}\n", s.message());
  return 1;
}

double Ratio(uint64_t num, uint64_t den) {
  return den == 0 ? 0.0 : static_cast<double>(num) / static_cast<double>(den);
}

void PrintText(const SchedulerSimResult& r, const CacheModeOptions& o) {
  fmt::print("cache {} samples, policy {}, lookahead {}, prefetch {}\n", o.cache,
             cache::EvictionPolicyName(o.policy), o.lookahead, o.prefetch);
  fmt::print("ticks                       {}\n", r.ticks);
  fmt::print("rounds                      {}\n", r.rounds);
  fmt::print("deliveries                  {}\n", r.deliveries);
  fmt::print("hits                        {}\n", r.hits);
  fmt::print("preparations                {}  ({:.4f} per delivery)\n", r.preparations,
             Ratio(r.preparations, r.deliveries));
  fmt::print("belady preparations         {}  ({:.4f} per delivery)\n", r.belady_preparations,
             Ratio(r.belady_preparations, r.deliveries));
  fmt::print("evictions                   {}\n", r.evictions);
  fmt::print("sharing ratio               {:.4f}  (deliveries / preparations)\n",
             Ratio(r.deliveries, r.preparations));
  fmt::print("drawn in shared rounds      {:.4f}  (of deliveries)\n",
             Ratio(r.shared_deliveries, r.deliveries));
  for (const SchedulerSimResult::Job& j : r.jobs) {
    fmt::print("job {:<23} {} deliveries, {} preparations, {} epochs, done at tick {}\n", j.name,
               j.deliveries, j.preparations, j.epochs, j.finish_tick);
  }
}

void PrintJson(const SchedulerSimResult& r, const CacheModeOptions& o) {
  using Json = nlohmann::ordered_json;
  Json jobs = Json::array();
  for (const SchedulerSimResult::Job& j : r.jobs) {
    jobs.push_back({{"name", j.name},
                    {"deliveries", j.deliveries},
                    {"preparations", j.preparations},
                    {"epochs", j.epochs},
                    {"finish_tick", j.finish_tick}});
  }
  const Json summary = {{"mode", "cache"},
                        {"cache", o.cache},
                        {"policy", std::string(cache::EvictionPolicyName(o.policy))},
                        {"lookahead", o.lookahead},
                        {"prefetch", o.prefetch},
                        {"ticks", r.ticks},
                        {"rounds", r.rounds},
                        {"deliveries", r.deliveries},
                        {"hits", r.hits},
                        {"preparations", r.preparations},
                        {"evictions", r.evictions},
                        {"belady_preparations", r.belady_preparations},
                        {"sharing_ratio", Ratio(r.deliveries, r.preparations)},
                        {"shared_round_fraction", Ratio(r.shared_deliveries, r.deliveries)},
                        {"jobs", std::move(jobs)}};
  fmt::print("{}\n", summary.dump());
}

}  // namespace

int RunCacheMode(const std::vector<SimJob>& jobs, const CacheModeOptions& options) {
  if (options.epochs == 0 || options.epochs > UINT32_MAX) {
    return Fail(Status::InvalidArgument(
        fmt::format("--epochs {} must be between 1 and {}", options.epochs, UINT32_MAX)));
  }
  std::vector<SimJobSpec> specs;
  for (const SimJob& j : jobs) {
    specs.push_back(SimJobSpec{j.name, j.dataset, static_cast<double>(j.start), j.speed,
                               static_cast<uint32_t>(options.epochs)});
  }
  std::unique_ptr<std::FILE, FileCloser> trace;
  if (!options.trace_path.empty()) {
    trace.reset(std::fopen(options.trace_path.c_str(), "w"));
    if (trace == nullptr) {
      return Fail(Status::IOError(fmt::format(
          "cannot write --trace \"{}\": {}; check that its directory exists and is writable",
          options.trace_path, std::strerror(errno))));
    }
    fmt::print(trace.get(), "tick,job,epoch,sample,hit\n");
  }
  SchedulerSimOptions o;
  o.cache_samples = options.cache;
  o.policy = options.policy;
  o.lookahead = options.lookahead;
  o.prefetch = options.prefetch;
  o.seed = options.seed;
  std::FILE* out = trace.get();
  Result<SchedulerSimResult> r = RunSchedulerSim(specs, o, [&](const SimDelivery& d) {
    if (out != nullptr) {
      fmt::print(out, "{},{},{},{},{}\n", d.tick, specs[d.job].name, d.epoch, d.sample,
                 d.hit ? 1 : 0);
    }
  });
  if (!r.ok()) return Fail(r.status());
  if (out != nullptr && (std::fflush(out) != 0 || std::ferror(out))) {
    return Fail(Status::IOError(fmt::format("writing --trace \"{}\" failed: {}", options.trace_path,
                                            std::strerror(errno))));
  }
  if (options.json) {
    PrintJson(*r, options);
  } else {
    PrintText(*r, options);
  }
  return 0;
}

}  // namespace carpool::tools
