#include "tools/sim_cache_mode.h"

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "sim/scheduler_sim.h"

namespace carpool::tools {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

int Fail(const Status& s) {
  fmt::print(stderr, "carpool sim: {}\n", s.message());
  return 1;
}

// Opens a CSV trace named by `flag` and writes its header; a null file when `path` is empty.
Result<File> OpenTrace(const char* flag, const std::string& path, const char* header) {
  if (path.empty()) return File();
  File f(std::fopen(path.c_str(), "w"));
  if (f == nullptr) {
    return Status::IOError(
        fmt::format("cannot write {} \"{}\": {}; check that its directory exists and is writable",
                    flag, path, std::strerror(errno)));
  }
  fmt::print(f.get(), "{}\n", header);
  return f;
}

Status CloseTrace(const char* flag, const std::string& path, std::FILE* f) {
  if (f == nullptr || (std::fflush(f) == 0 && !std::ferror(f))) return Status::OK();
  return Status::IOError(
      fmt::format("writing {} \"{}\" failed: {}", flag, path, std::strerror(errno)));
}

double Ratio(uint64_t num, uint64_t den) {
  return den == 0 ? 0.0 : static_cast<double>(num) / static_cast<double>(den);
}

const char* OnOff(bool on) { return on ? "on" : "off"; }

// The scheduler's prefetch depth: --prefetch, raised to one batch (SchedulerSimOptions).
uint64_t TriggerDepth(const CacheModeOptions& o) { return std::max(o.prefetch, o.batch); }

void PrintText(const SchedulerSimResult& r, const CacheModeOptions& o) {
  fmt::print("cache {} samples, policy {}, lookahead {}{}, prefetch {}\n", o.cache,
             cache::EvictionPolicyName(o.policy), r.lookahead, o.lookahead == 0 ? " (derived)" : "",
             TriggerDepth(o));
  const std::string capacity =
      o.prep_capacity == 0 ? std::string("unlimited") : fmt::format("{}/tick", o.prep_capacity);
  const std::string batch = o.batch == 0 ? std::string("per tick") : std::to_string(o.batch);
  fmt::print(
      "jitter {} (every {} ticks), prep capacity {}, batch {}, pacing {} (window {}), follow {} "
      "({} decisions copied)\n",
      o.jitter, o.jitter_period, capacity, batch, OnOff(o.pacing), r.window, OnOff(o.follow),
      r.followed);
  fmt::print("ticks                       {}\n", r.ticks);
  fmt::print("rounds                      {}\n", r.rounds);
  fmt::print("deliveries                  {}\n", r.deliveries);
  fmt::print("hits                        {}\n", r.hits);
  fmt::print("preparations                {}  ({:.4f} per delivery; {} ahead)\n", r.preparations,
             Ratio(r.preparations, r.deliveries), r.prepared_ahead);
  fmt::print("belady preparations         {}  ({:.4f} per delivery)\n", r.belady_preparations,
             Ratio(r.belady_preparations, r.deliveries));
  fmt::print("evictions                   {}\n", r.evictions);
  fmt::print("sharing ratio               {:.4f}  (deliveries / preparations)\n",
             Ratio(r.deliveries, r.preparations));
  fmt::print("drawn in shared rounds      {:.4f}  (of deliveries)\n",
             Ratio(r.shared_deliveries, r.deliveries));
  fmt::print("pacing                      {} holds, {} lifts, at most {} owed\n", r.holds, r.lifts,
             r.max_owed);
  for (const SchedulerSimResult::Job& j : r.jobs) {
    fmt::print(
        "job {:<23} {} deliveries, {} preparations, {} epochs, done at tick {}, held {} ticks, "
        "starved {} ticks\n",
        j.name, j.deliveries, j.preparations, j.epochs, j.finish_tick, j.held_ticks,
        j.starved_ticks);
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
                    {"finish_tick", j.finish_tick},
                    {"held_ticks", j.held_ticks},
                    {"starved_ticks", j.starved_ticks}});
  }
  const Json summary = {
      {"mode", "cache"},
      {"cache", o.cache},
      {"policy", std::string(cache::EvictionPolicyName(o.policy))},
      {"lookahead", r.lookahead},
      {"lookahead_derived", o.lookahead == 0},
      {"prefetch", TriggerDepth(o)},
      {"jitter", o.jitter},
      {"jitter_period", o.jitter_period},
      {"prep_capacity", o.prep_capacity},
      {"batch", o.batch},
      {"pacing", OnOff(o.pacing)},
      {"follow", OnOff(o.follow)},
      {"followed", r.followed},
      {"window", r.window},
      {"ticks", r.ticks},
      {"rounds", r.rounds},
      {"deliveries", r.deliveries},
      {"hits", r.hits},
      {"preparations", r.preparations},
      {"prepared_ahead", r.prepared_ahead},
      {"preparations_per_delivery", Ratio(r.preparations, r.deliveries)},
      {"evictions", r.evictions},
      {"belady_preparations", r.belady_preparations},
      {"belady_preparations_per_delivery", Ratio(r.belady_preparations, r.deliveries)},
      {"sharing_ratio", Ratio(r.deliveries, r.preparations)},
      {"shared_round_fraction", Ratio(r.shared_deliveries, r.deliveries)},
      {"holds", r.holds},
      {"lifts", r.lifts},
      {"max_owed", r.max_owed},
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
                               static_cast<uint32_t>(j.epochs != 0 ? j.epochs : options.epochs)});
  }
  SchedulerSimOptions o;
  o.cache_samples = options.cache;
  o.policy = options.policy;
  o.lookahead = options.lookahead;
  o.prefetch = options.prefetch;
  o.seed = options.seed;
  o.jitter = options.jitter;
  o.jitter_period = options.jitter_period;
  o.prep_capacity = options.prep_capacity;
  o.batch = options.batch;
  o.pacing = options.pacing;
  o.follow = options.follow;
  // Bad options fail before the traces are created.
  if (Status s = ValidateSchedulerSim(specs, o); !s.ok()) return Fail(s);
  Result<File> trace = OpenTrace("--trace", options.trace_path, "tick,job,epoch,sample,hit");
  if (!trace.ok()) return Fail(trace.status());
  Result<File> ticks = OpenTrace("--tick-trace", options.tick_trace_path,
                                 "tick,job,delivered,held,starved,queued,owed,credit");
  if (!ticks.ok()) return Fail(ticks.status());
  std::FILE* out = trace->get();
  std::FILE* tick_out = ticks->get();
  SimObserver observer;
  if (out != nullptr) {
    observer.on_delivery = [&](const SimDelivery& d) {
      fmt::print(out, "{},{},{},{},{}\n", d.tick, specs[d.job].name, d.epoch, d.sample,
                 d.hit ? 1 : 0);
    };
  }
  if (tick_out != nullptr) {
    observer.on_job_tick = [&](const SimJobTick& j) {
      fmt::print(tick_out, "{},{},{},{},{},{},{},{:.3f}\n", j.tick, specs[j.job].name,
                 j.delivered, j.held ? 1 : 0, j.starved ? 1 : 0, j.queued, j.owed, j.credit);
    };
  }
  Result<SchedulerSimResult> r = RunSchedulerSim(specs, o, observer);
  if (!r.ok()) return Fail(r.status());
  if (Status s = CloseTrace("--trace", options.trace_path, out); !s.ok()) return Fail(s);
  if (Status s = CloseTrace("--tick-trace", options.tick_trace_path, tick_out); !s.ok()) {
    return Fail(s);
  }
  if (options.json) {
    PrintJson(*r, options);
  } else {
    PrintText(*r, options);
  }
  return 0;
}

}  // namespace carpool::tools
