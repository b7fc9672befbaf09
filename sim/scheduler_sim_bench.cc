// The eviction-policy experiment (issue 4): preparations ÷ deliveries of refcnt, next-use and lru
// against Belady's MIN on the same request sequence, over the scenarios, cache sizes and
// look-aheads of the issue; then sharing against cache size and look-ahead.
//   carpool_policy_bench [--n 4000] [--epochs 2] [--seed 1] [--prefetch 4]
// Prints markdown tables; the baseline of every cell (Belady) is computed in the same run.
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sim/scheduler_sim.h"

namespace carpool {
namespace {

using cache::EvictionPolicy;

struct Scenario {
  std::string name;
  std::vector<SimJobSpec> jobs;
};

Roaring Range(uint32_t lo, uint32_t hi) {
  Roaring r;
  r.addRange(lo, hi);
  return r;
}

std::vector<Scenario> Scenarios(uint32_t n, uint32_t epochs) {
  const uint32_t h = n / 2;
  auto job = [&](const char* name, uint32_t lo, uint32_t hi, double start, double speed) {
    return SimJobSpec{name, Range(lo, hi), start, speed, epochs};
  };
  return {
      {"2 jobs 1:1", {job("a", 0, n, 0, 1), job("b", 0, n, 0, 1)}},
      {"2 jobs 1:2", {job("a", 0, n, 0, 1), job("b", 0, n, 0, 0.5)}},
      {"2 jobs 1:4", {job("a", 0, n, 0, 1), job("b", 0, n, 0, 0.25)}},
      {"join at 30%", {job("a", 0, n, 0, 1), job("b", 0, n, 0.3 * n, 1)}},
      {"50% overlap", {job("a", 0, n, 0, 1), job("b", h, n + h, 0, 1)}},
      {"4 mixed",
       {job("a", 0, n, 0, 1), job("b", 0, n, 0, 0.5), job("c", h, n + h, 0.1 * n, 2),
        job("d", 0, h, 0.2 * n, 0.25)}},
  };
}

double Ratio(uint64_t num, uint64_t den) { return den == 0 ? 0 : double(num) / double(den); }

SchedulerSimResult Run(const Scenario& sc, uint64_t cache, EvictionPolicy policy, uint64_t la,
                       uint64_t prefetch, uint64_t seed) {
  SchedulerSimOptions o;
  o.cache_samples = cache;
  o.policy = policy;
  o.lookahead = la;
  o.prefetch = prefetch;
  o.seed = seed;
  auto r = RunSchedulerSim(sc.jobs, o);
  if (!r.ok()) {
    fmt::print(stderr, "{}: {}\n", sc.name, r.status().ToString());
    std::exit(1);
  }
  return std::move(r).value();
}

void PolicyTable(uint32_t n, uint32_t epochs, uint64_t prefetch, uint64_t seed,
                 const std::vector<uint64_t>& lookaheads) {
  fmt::print(
      "### preparations / deliveries (lower is better); nu/B = next-use / Belady "
      "preparations\n\n");
  fmt::print("| scenario | L | cache | refcnt | next-use | lru | Belady | nu/B | rc<=lru |\n");
  fmt::print("|---|---:|---:|---:|---:|---:|---:|---:|:-:|\n");
  int cells = 0, nu_ok = 0, rc_ok = 0;
  for (const Scenario& sc : Scenarios(n, epochs)) {
    for (uint64_t la : lookaheads) {
      for (double frac : {0.01, 0.05, 0.20, 1.00}) {
        const uint64_t cache = static_cast<uint64_t>(frac * n);
        SchedulerSimResult rc = Run(sc, cache, EvictionPolicy::kRefCnt, la, prefetch, seed);
        SchedulerSimResult nu = Run(sc, cache, EvictionPolicy::kNextUse, la, prefetch, seed);
        SchedulerSimResult lru = Run(sc, cache, EvictionPolicy::kLru, la, prefetch, seed);
        const double d = double(nu.deliveries);
        const double nu_b = Ratio(nu.preparations, nu.belady_preparations);
        const bool nu_good = nu.preparations <= 1.10 * double(nu.belady_preparations);
        const bool rc_good = rc.preparations <= lru.preparations;
        ++cells;
        nu_ok += nu_good;
        rc_ok += rc_good;
        fmt::print("| {} | {} | {:.0f}% | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.3f}{} | {} |\n",
                   sc.name, la, frac * 100, rc.preparations / d, nu.preparations / d,
                   lru.preparations / d, nu.belady_preparations / d, nu_b, nu_good ? "" : " ✗",
                   rc_good ? "yes" : "**no**");
      }
    }
  }
  fmt::print("\nnext-use within 10% of Belady: {}/{} cells; refcnt <= lru: {}/{} cells\n\n", nu_ok,
             cells, rc_ok, cells);
}

// Sharing (deliveries ÷ preparations) of next-use against cache size and L, and the fraction of
// deliveries drawn in a round shared with another job (independent of the cache).
void SharingTable(uint32_t n, uint32_t epochs, uint64_t prefetch, uint64_t seed) {
  const std::vector<uint64_t> las = {4, 16, 64, 256, 1024, 4096};
  for (int which : {1, 2, 5}) {
    const Scenario sc = Scenarios(n, epochs)[which];
    fmt::print("### sharing ratio (deliveries / preparations), next-use, {}\n\n", sc.name);
    fmt::print("| cache \\ L |");
    for (uint64_t la : las) fmt::print(" {} |", la);
    fmt::print("\n|---|");
    for (size_t i = 0; i < las.size(); ++i) fmt::print("---:|");
    fmt::print("\n");
    std::vector<double> shared;
    for (double frac : {0.01, 0.05, 0.20, 1.00}) {
      fmt::print("| {:.0f}% |", frac * 100);
      for (uint64_t la : las) {
        SchedulerSimResult r =
            Run(sc, static_cast<uint64_t>(frac * n), EvictionPolicy::kNextUse, la, prefetch, seed);
        fmt::print(" {:.2f} |", Ratio(r.deliveries, r.preparations));
        if (frac == 1.00) shared.push_back(Ratio(r.shared_deliveries, r.deliveries));
      }
      fmt::print("\n");
    }
    fmt::print("| shared rounds |");
    for (double s : shared) fmt::print(" {:.2f} |", s);
    fmt::print("\n\n");
  }
}

uint64_t Flag(int argc, char** argv, const char* name, uint64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::strtoull(argv[i + 1], nullptr, 10);
  }
  return fallback;
}

}  // namespace
}  // namespace carpool

int main(int argc, char** argv) {
  using namespace carpool;
  const auto n = static_cast<uint32_t>(Flag(argc, argv, "--n", 4000));
  const auto epochs = static_cast<uint32_t>(Flag(argc, argv, "--epochs", 2));
  const uint64_t seed = Flag(argc, argv, "--seed", 1);
  const uint64_t prefetch = Flag(argc, argv, "--prefetch", 4);
  const auto t0 = std::chrono::steady_clock::now();
  fmt::print("dataset {} ids, {} epochs per job, prefetch {}, seed {}\n\n", n, epochs, prefetch,
             seed);
  PolicyTable(n, epochs, prefetch, seed, {64, 1024});
  SharingTable(n, epochs, prefetch, seed);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("({:.1f} s)\n", s);
  return 0;
}
