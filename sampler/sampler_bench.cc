// Sampler benchmarks, single-threaded; prints two tables with a baseline measured in the same run.
//  1. Rounds: assignments/s of DSA rounds over n jobs (all participating) on datasets of
//     1,281,167 ids, identical / 50% overlapping / nested, against an independent per-job
//     Fisher-Yates shuffle (what each job would do alone).
//  2. Insertion: 128 datasets of 1-2 M random ids out of a 2 M universe inserted one after
//     another; mean and max AddJob time, against rebuilding every node from scratch.
// Usage: carpool_sampler_bench [--seconds S] [--jobs 1,2,4] [--inserts N]
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "sampler/rng.h"
#include "sampler/sampling_tree.h"

namespace carpool {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kImageNet = 1281167;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Job j's dataset of the scenario: identical [0, M); 50% overlapping: a common half [0, M/2)
// plus a private half; nested: the first M·(j+1)/n ids, so the largest has M.
Roaring Dataset(std::string_view scenario, uint32_t j, uint32_t n) {
  Roaring r;
  if (scenario == "identical") {
    r.addRange(0, kImageNet);
  } else if (scenario == "overlap50") {
    const uint32_t half = kImageNet / 2, rest = kImageNet - half;
    r.addRange(0, half);
    r.addRange(half + uint64_t{j} * rest, half + uint64_t{j + 1} * rest);
  } else {
    r.addRange(0, (uint64_t{kImageNet} * (j + 1) + n - 1) / n);
  }
  return r;
}

struct RoundResult {
  double per_second;
  double sharing;  // assignments / distinct samples
};

RoundResult TimeDsa(std::string_view scenario, uint32_t n, double budget) {
  SamplingTree tree(42);
  std::vector<JobId> all(n);
  for (uint32_t j = 0; j < n; ++j) {
    all[j] = j;
    if (!tree.AddJob(j, Dataset(scenario, j, n)).ok()) std::abort();
  }
  std::vector<Assignment> out;
  uint64_t assignments = 0, samples = 0;
  const auto start = Clock::now();
  auto now = start;
  while (Seconds(start, now) < budget) {
    for (int i = 0; i < 256; ++i) {
      out.clear();
      tree.RunRound(all, &out);
      samples += out.size();
      for (const Assignment& a : out) assignments += a.jobs.size();
      for (JobId j : all) {
        if (tree.EpochDone(j) && !tree.ResetEpoch(j).ok()) std::abort();
      }
    }
    now = Clock::now();
  }
  return {static_cast<double>(assignments) / Seconds(start, now),
          static_cast<double>(assignments) / static_cast<double>(samples)};
}

// Independent sampling: each job draws the next element of its own lazy Fisher-Yates shuffle.
double TimeIndependent(std::string_view scenario, uint32_t n, double budget) {
  Rng rng(42);
  std::vector<std::vector<uint32_t>> ids(n);
  std::vector<size_t> left(n);
  for (uint32_t j = 0; j < n; ++j) {
    Roaring r = Dataset(scenario, j, n);
    ids[j].resize(r.cardinality());
    r.toUint32Array(ids[j].data());
    left[j] = ids[j].size();
  }
  uint64_t assignments = 0, sink = 0;
  const auto start = Clock::now();
  auto now = start;
  while (Seconds(start, now) < budget) {
    for (int i = 0; i < 256; ++i) {
      for (uint32_t j = 0; j < n; ++j) {
        if (left[j] == 0) left[j] = ids[j].size();
        const size_t k = rng.Uniform(left[j]--);
        std::swap(ids[j][k], ids[j][left[j]]);
        sink += ids[j][left[j]];
      }
      assignments += n;
    }
    now = Clock::now();
  }
  if (sink == 1) fmt::print("");  // keeps the draws observable
  return static_cast<double>(assignments) / Seconds(start, now);
}

void RoundsTable(const std::vector<uint32_t>& job_counts, double budget) {
  fmt::print("Rounds: all jobs participate, {:.1f} s per cell, datasets of {} ids\n", budget,
             kImageNet);
  fmt::print(
      "| scenario  |  n | DSA assign/s | independent assign/s | DSA / indep "
      "| DSA sharing |\n");
  fmt::print(
      "|-----------|---:|-------------:|---------------------:|------------:"
      "|------------:|\n");
  for (std::string_view scenario : {"identical", "overlap50", "nested"}) {
    for (uint32_t n : job_counts) {
      const RoundResult dsa = TimeDsa(scenario, n, budget);
      const double indep = TimeIndependent(scenario, n, budget);
      fmt::print("| {:<9} | {:>2} | {:>10.2f} M | {:>18.2f} M | {:>11.3f} | {:>11.2f} |\n",
                 scenario, n, dsa.per_second / 1e6, indep / 1e6, dsa.per_second / indep,
                 dsa.sharing);
      std::fflush(stdout);
    }
  }
}

// A random subset of [0, universe) whose expected size is uniform in [1 M, 2 M]: each id is kept
// independently with probability size / universe.
Roaring RandomDataset(Rng& rng, uint32_t universe) {
  const uint64_t size = 1000000 + rng.Uniform(1000001);
  std::vector<uint32_t> ids;
  ids.reserve(size + size / 8);
  for (uint32_t x = 0; x < universe; ++x) {
    if (rng.Uniform(universe) < size) ids.push_back(x);
  }
  return Roaring(ids.size(), ids.data());
}

// The baseline: all nodes from scratch by suffix intersections over the sorted R's.
void RebuildFromScratch(std::vector<const Roaring*> rs, std::vector<Roaring>* nodes) {
  std::sort(rs.begin(), rs.end(),
            [](const Roaring* a, const Roaring* b) { return a->cardinality() < b->cardinality(); });
  nodes->assign(2 * rs.size(), Roaring());
  Roaring s = *rs.back();
  for (size_t q = rs.size(); q-- > 0;) {
    Roaring below = q > 0 ? (*rs[q - 1] & s) : Roaring();
    (*nodes)[2 * q + 1] = *rs[q] - s;  // leaf
    s -= below;
    (*nodes)[2 * q] = std::move(s);  // spine
    s = std::move(below);
  }
}

void InsertionTable(uint32_t inserts) {
  constexpr uint32_t kUniverse = 2000000;
  Rng rng(7);
  std::vector<Roaring> datasets;
  for (uint32_t i = 0; i < inserts; ++i) datasets.push_back(RandomDataset(rng, kUniverse));
  SamplingTree tree(1);
  std::vector<double> insert_s, rebuild_s;
  std::vector<const Roaring*> live;
  std::vector<Roaring> nodes;
  for (uint32_t i = 0; i < inserts; ++i) {
    auto t0 = Clock::now();
    if (!tree.AddJob(i, datasets[i]).ok()) std::abort();
    auto t1 = Clock::now();
    live.push_back(&datasets[i]);
    RebuildFromScratch(live, &nodes);
    auto t2 = Clock::now();
    insert_s.push_back(Seconds(t0, t1));
    rebuild_s.push_back(Seconds(t1, t2));
  }
  auto mean = [](const std::vector<double>& v) {
    return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  };
  auto max = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  fmt::print("\nInsertion: {} datasets of 1-2 M random ids out of {} inserted one after another\n",
             inserts, kUniverse);
  fmt::print("| method                       |   mean s |    max s |\n");
  fmt::print("|------------------------------|---------:|---------:|\n");
  fmt::print("| AddJob (rebuild from p down) | {:8.4f} | {:8.4f} |\n", mean(insert_s),
             max(insert_s));
  fmt::print("| from-scratch rebuild (base)  | {:8.4f} | {:8.4f} |\n", mean(rebuild_s),
             max(rebuild_s));
  fmt::print("AddJob / from-scratch (mean): {:.3f}; the Joader paper reports 0.57 s mean\n",
             mean(insert_s) / mean(rebuild_s));
}

std::vector<uint32_t> ParseList(std::string_view s) {
  std::vector<uint32_t> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string_view::npos) comma = s.size();
    out.push_back(static_cast<uint32_t>(std::stoul(std::string(s.substr(pos, comma - pos)))));
    pos = comma + 1;
  }
  return out;
}

}  // namespace
}  // namespace carpool

int main(int argc, char** argv) {
  double budget = 1.0;
  std::vector<uint32_t> jobs = {1, 2, 4, 8, 16, 32};
  uint32_t inserts = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string_view flag = argv[i];
    if (flag == "--seconds") {
      budget = std::stod(argv[i + 1]);
    } else if (flag == "--jobs") {
      jobs = carpool::ParseList(argv[i + 1]);
    } else if (flag == "--inserts") {
      inserts = static_cast<uint32_t>(std::stoul(argv[i + 1]));
    } else {
      fmt::print(stderr, "unknown flag \"{}\" (known: --seconds, --jobs, --inserts)\n", flag);
      return 2;
    }
  }
  if (!jobs.empty() && jobs[0] != 0) carpool::RoundsTable(jobs, budget);
  if (inserts > 0) carpool::InsertionTable(inserts);
  return 0;
}
