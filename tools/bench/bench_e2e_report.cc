#include "tools/bench/bench_e2e_report.h"

#include <fmt/core.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace carpool::tools {
namespace {

// The scenario's row at the run's first cache: a scenario's rows follow the caches' order.
const E2eScenarioResult* Find(const std::vector<E2eScenarioResult>& results,
                              std::string_view name) {
  for (const E2eScenarioResult& r : results) {
    if (r.scenario.name == name) return &r;
  }
  return nullptr;
}

std::string Ratio(double a, double b) { return b > 0 ? fmt::format("{:.2f}", a / b) : "-"; }

using Json = nlohmann::ordered_json;

Json JsonSide(const E2eSideResult& s) {
  Json jobs = Json::array();
  for (const E2eJobResult& j : s.jobs) {
    jobs.push_back({{"dataset", j.dataset},
                    {"samples", j.samples},
                    {"start_s", j.start_s},
                    {"end_s", j.end_s},
                    {"samples_per_s", j.rate()},
                    {"cpu_s", j.cpu_s},
                    {"threads", j.threads}});
  }
  return {{"samples", s.samples()},         {"wall_s", s.wall_s()},
          {"samples_per_s", s.rate()},      {"cpu_s", s.cpu_s},
          {"server_cpu_s", s.server_cpu_s}, {"cpu_s_per_sample", s.cpu_per_sample()},
          {"cores_used", s.cores_used()},   {"preparations", s.preparations},
          {"deliveries", s.deliveries},     {"preparations_per_delivery", s.preps_per_delivery()},
          {"jobs", std::move(jobs)}};
}

// The first cache's label, for the goals that are read at it.
std::string FirstCache(const E2eRunInfo& info) {
  return info.caches.empty() ? "?" : FractionLabel(info.caches[0].fraction);
}

// null where the goal was not measured.
Json JsonOptional(const std::optional<double>& v) { return v ? Json(*v) : Json(nullptr); }

}  // namespace

E2eGoals ComputeE2eGoals(const std::vector<E2eScenarioResult>& results) {
  E2eGoals g;
  const E2eScenarioResult* sync4 = Find(results, "sync4");
  const E2eScenarioResult* sync1 = Find(results, "sync1");
  if (sync4 != nullptr && sync4->baseline.rate() > 0) {
    g.sync4_vs_baseline = sync4->carpool.rate() / sync4->baseline.rate();
  }
  if (sync4 != nullptr && sync1 != nullptr && !sync1->carpool.jobs.empty() &&
      sync1->carpool.jobs[0].rate() > 0) {
    double slowest = sync4->carpool.jobs.empty() ? 0 : sync4->carpool.jobs[0].rate();
    for (const E2eJobResult& j : sync4->carpool.jobs) slowest = std::min(slowest, j.rate());
    g.sync4_vs_sync1 = slowest / sync1->carpool.jobs[0].rate();
  }
  return g;
}

void PrintE2eTables(const E2eRunInfo& info, const std::vector<E2eScenarioResult>& results,
                    const std::vector<E2eTorchResult>& torch) {
  fmt::print(
      "carpool bench e2e: {} JPEGs 500x375 in {}\n"
      "  prepare {} | transform {} | batch {} | {} epoch(s) | prefetch {} | step {} ms/batch\n"
      "  carpool: 1 server (--workers {}) + 1 consume process per job\n"
      "  baseline: 1 standalone loader process per job, {} worker threads split across the jobs; "
      "no cache, so measured once per scenario and repeated in its rows at other cache sizes\n"
      "  best of {} run(s) per scenario and side | load average before: {} | after: {} | "
      "run took {:.0f} s\n",
      info.images, info.data_dir, info.prepare, info.transform, info.batch_size, info.epochs,
      info.prefetch, info.step_ms, info.workers, info.workers, info.repeat, info.load_before,
      info.load_after, info.seconds);
  fmt::print("  {}\n", DescribePreparedSet(info.prepared));
  for (const CacheChoice& c : info.caches) {
    fmt::print("  rows at {}: {}\n", FractionLabel(c.fraction), DescribeCache(c));
  }
  fmt::print("\n");

  fmt::print(
      "#### Aggregate (all jobs of a scenario; CPU of every process, the server included; cores "
      "used = CPU seconds / wall seconds, below 2 on this machine when other load took the "
      "rest)\n\n");
  fmt::print(
      "| scenario | cache | jobs | carpool samples/s | baseline samples/s | ratio | carpool CPU "
      "ms/sample | baseline CPU ms/sample | ratio | carpool preps/deliv | baseline preps/deliv "
      "| cores used carpool / baseline |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const E2eScenarioResult& r : results) {
    const E2eSideResult& c = r.carpool;
    const E2eSideResult& b = r.baseline;
    fmt::print(
        "| {} | {} | {} | {:.0f} | {:.0f} | {} | {:.2f} | {:.2f} | {} | {:.3f} | {:.3f} | {:.2f} / "
        "{:.2f} |\n",
        r.scenario.name, FractionLabel(r.cache.fraction), r.scenario.jobs.size(), c.rate(),
        b.rate(), Ratio(c.rate(), b.rate()), c.cpu_per_sample() * 1e3, b.cpu_per_sample() * 1e3,
        Ratio(c.cpu_per_sample(), b.cpu_per_sample()), c.preps_per_delivery(),
        b.preps_per_delivery(), c.cores_used(), b.cores_used());
  }

  fmt::print("\n#### Per job (samples/s from the job's spawn to its exit)\n\n");
  fmt::print(
      "| scenario | cache | job | dataset | start s | step ms | samples | carpool samples/s "
      "| baseline samples/s | ratio | baseline threads |\n"
      "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const E2eScenarioResult& r : results) {
    for (size_t i = 0; i < r.scenario.jobs.size(); ++i) {
      const E2eJobResult& c = r.carpool.jobs[i];
      const E2eJobResult& b = r.baseline.jobs[i];
      fmt::print("| {} | {} | {} | {} | {:.1f} | {} | {} | {:.0f} | {:.0f} | {} | {} |\n",
                 r.scenario.name, FractionLabel(r.cache.fraction), i, c.dataset,
                 r.scenario.jobs[i].start_s, r.scenario.jobs[i].step_ms, c.samples, c.rate(),
                 b.rate(), Ratio(c.rate(), b.rate()), b.threads);
    }
  }

  fmt::print("\n#### Scenarios\n\n");
  for (const E2eScenarioResult& r : results) {
    if (r.baseline_reused) continue;  // listed at its first row
    fmt::print("- {}: {}\n", r.scenario.name, r.scenario.description);
  }

  if (!torch.empty()) {
    fmt::print(
        "\n#### torchvision ImageFolder + DataLoader per job (bench/torchvision_jobs.py), "
        "{} workers in total; carpool at cache {}\n\n",
        info.workers, FirstCache(info));
    fmt::print(
        "| jobs | per-job samples/s | aggregate samples/s | CPU ms/sample | carpool aggregate "
        "(same N, sync) | carpool / torchvision |\n|---:|---|---:|---:|---:|---:|\n");
    for (const E2eTorchResult& t : torch) {
      std::string per_job;
      for (double r : t.job_rates)
        per_job += fmt::format("{}{:.0f}", per_job.empty() ? "" : ", ", r);
      const E2eScenarioResult* same = Find(results, fmt::format("sync{}", t.jobs));
      const double carpool = same != nullptr ? same->carpool.rate() : 0.0;
      fmt::print("| {} | {} | {:.0f} | {:.2f} | {} | {} |\n", t.jobs, per_job, t.rate(),
                 t.cpu_per_sample() * 1e3, same ? fmt::format("{:.0f}", carpool) : "-",
                 same ? Ratio(carpool, t.rate()) : "-");
    }
  }

  const E2eGoals g = ComputeE2eGoals(results);
  fmt::print("\n#### Goals (issue 6), carpool at cache {}\n\n", FirstCache(info));
  if (g.sync4_vs_baseline) {
    fmt::print("- N = 4 in sync, aggregate carpool / baseline = {:.2f} (goal >= 3): {}\n",
               *g.sync4_vs_baseline, g.aggregate_met() ? "met" : "NOT met");
  } else {
    fmt::print("- N = 4 in sync vs baseline: not measured (run scenario sync4)\n");
  }
  if (g.sync4_vs_sync1) {
    fmt::print(
        "- N = 4 in sync, slowest carpool job / carpool job at N = 1 = {:.2f} (goal >= 0.75): {}\n",
        *g.sync4_vs_sync1, g.per_job_met() ? "met" : "NOT met");
  } else {
    fmt::print("- per-job speed at N = 4 vs N = 1: not measured (run scenarios sync1 and sync4)\n");
  }
}

std::string E2eJson(const E2eRunInfo& info, const std::vector<E2eScenarioResult>& results,
                    const std::vector<E2eTorchResult>& torch) {
  Json scenarios = Json::array();
  for (const E2eScenarioResult& r : results) {
    scenarios.push_back(
        {{"name", r.scenario.name},
         {"description", r.scenario.description},
         {"cache", CacheJson(r.cache)},
         {"carpool", JsonSide(r.carpool)},
         {"baseline", JsonSide(r.baseline)},
         {"baseline_reused", r.baseline_reused},
         {"throughput_ratio", r.baseline.rate() > 0 ? r.carpool.rate() / r.baseline.rate() : 0.0}});
  }
  Json tv = Json::array();
  for (const E2eTorchResult& t : torch) {
    tv.push_back({{"jobs", t.jobs},
                  {"job_samples_per_s", t.job_rates},
                  {"samples", t.samples},
                  {"wall_s", t.wall_s},
                  {"samples_per_s", t.rate()},
                  {"cpu_s", t.cpu_s},
                  {"cpu_s_per_sample", t.cpu_per_sample()}});
  }
  Json caches = Json::array();
  for (const CacheChoice& c : info.caches) caches.push_back(CacheJson(c));
  const E2eGoals g = ComputeE2eGoals(results);
  const Json report = {{"images", info.images},
                       {"prepare", info.prepare},
                       {"transform", info.transform},
                       {"batch_size", info.batch_size},
                       {"epochs", info.epochs},
                       {"prefetch", info.prefetch},
                       {"workers", info.workers},
                       {"step_ms", info.step_ms},
                       {"repeat", info.repeat},
                       {"prepared_set",
                        {{"samples", info.prepared.samples},
                         {"sample_bytes", info.prepared.sample_bytes},
                         {"bytes", info.prepared.bytes()},
                         {"cache_bytes", info.prepared.cache_bytes()}}},
                       {"caches", std::move(caches)},
                       {"load_before", info.load_before},
                       {"load_after", info.load_after},
                       {"seconds", info.seconds},
                       {"scenarios", std::move(scenarios)},
                       {"torchvision", std::move(tv)},
                       {"goals",
                        {{"cache", FirstCache(info)},
                         {"sync4_vs_baseline", JsonOptional(g.sync4_vs_baseline)},
                         {"aggregate_met", g.aggregate_met()},
                         {"sync4_vs_sync1", JsonOptional(g.sync4_vs_sync1)},
                         {"per_job_met", g.per_job_met()}}}};
  return report.dump();
}

}  // namespace carpool::tools
