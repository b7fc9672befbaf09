// carpool_cache_bench: cache micro-benchmarks, each against a baseline measured in the same run.
//   index insert / lookup ops/s        vs std::unordered_map insert / find
//   copy out of the segment (Pin,      vs memcpy between heap buffers of the same sizes
//     PinnedData, memcpy, Unpin)
//   allocator churn: how much of the segment live samples fill under steady and shifting sizes
// Usage: carpool_cache_bench [--quick]
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/cache_index.h"
#include "cache/sample_cache.h"

namespace carpool::cache {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Best of `reps` runs of fn(), in seconds; fn returns a value we keep alive.
template <typename Fn>
double BestOf(int reps, Fn fn) {
  double best = 1e300;
  uint64_t sink = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    sink += fn();
    best = std::min(best, Seconds(t0));
  }
  if (sink == 42) fmt::print("");  // keeps the work observable
  return best;
}

void Row(const std::string& what, double value, const std::string& unit, double baseline) {
  fmt::print("| {:<46} | {:>12.3g} {:<5} | {:>12.3g} | {:>6.2f} |\n", what, value, unit, baseline,
             value / baseline);
}

void IndexBench(uint32_t n, int reps) {
  std::vector<uint32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937 rng(1);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<uint32_t> probes(n);
  for (auto& p : probes) p = ids[rng() % n];

  double map_insert = BestOf(reps, [&] {
    std::unordered_map<uint32_t, CacheIndex::Entry> map;
    for (uint32_t s : ids) map.emplace(s, CacheIndex::Entry{s, 1, 0});
    return map.size();
  });
  std::unordered_map<uint32_t, CacheIndex::Entry> map;
  for (uint32_t s : ids) map.emplace(s, CacheIndex::Entry{s, 1, 0});
  double map_find = BestOf(reps, [&] {
    uint64_t sum = 0;
    for (uint32_t s : probes) sum += map.find(s)->second.slot;
    return sum;
  });
  fmt::print("\n{} samples, best of {} runs\n\n", n, reps);
  fmt::print("| {:<46} | {:>18} | {:>12} | {:>6} |\n", "operation", "carpool", "baseline",
             "ratio");
  fmt::print("|{:-<48}|{:->20}|{:->14}|{:->8}|\n", "", "", "", "");
  for (EvictionPolicy policy : {EvictionPolicy::kRefCnt, EvictionPolicy::kLru}) {
    std::string name(EvictionPolicyName(policy));
    double insert = BestOf(reps, [&] {
      CacheIndex index({policy, n, 0});
      for (uint32_t s : ids) (void)index.Insert(s, s, 1);
      return index.stats().entries;
    });
    CacheIndex index({policy, n, 0});
    for (uint32_t s : ids) (void)index.Insert(s, s, 1);
    if (index.stats().entries != n) std::abort();  // every insert must have happened
    double lookup = BestOf(reps, [&] {
      uint64_t sum = 0;
      for (uint32_t s : probes) sum += index.Lookup(s)->slot;
      return sum;
    });
    Row("index insert (" + name + ") vs unordered_map insert", n / insert, "op/s", n / map_insert);
    Row("index lookup (" + name + ") vs unordered_map find", n / lookup, "op/s", n / map_find);
  }
  // Steady state at capacity: every insert evicts one (refcnt, counts changing underneath).
  double churn = BestOf(reps, [&] {
    CacheIndex index({EvictionPolicy::kRefCnt, n / 4, 0});
    std::vector<CacheIndex::Evicted> evicted;
    for (uint32_t i = 0; i < n; ++i) {
      index.AddRef(ids[i], static_cast<int64_t>(i % 3));
      evicted.clear();
      (void)index.MakeRoom(1, &evicted);
      (void)index.Insert(ids[i], i, 1);
    }
    return index.stats().evictions;
  });
  double map_churn = BestOf(reps, [&] {
    std::unordered_map<uint32_t, CacheIndex::Entry> m;
    for (uint32_t i = 0; i < n; ++i) {
      if (i >= n / 4) m.erase(ids[i - n / 4]);
      m.emplace(ids[i], CacheIndex::Entry{i, 1, 0});
    }
    return m.size();
  });
  Row("refcnt insert+evict+addref vs map insert+erase", n / churn, "op/s", n / map_churn);
}

void CopyBench(uint64_t segment_bytes, int reps) {
  fmt::print("\nCopy out of a {} MiB segment as the server's readers do: Pin, PinnedData, "
             "memcpy, Unpin, and memcpy from a heap buffer of the same size; ratio = pinned / "
             "heap; best of {} interleaved passes\n\n",
             segment_bytes >> 20, reps);
  fmt::print("| {:<28} | {:>12} | {:>10} | {:>6} |\n", "sample size x slots", "pinned GiB/s",
             "heap GiB/s", "ratio");
  fmt::print("|{:-<30}|{:->14}|{:->12}|{:->8}|\n", "", "", "", "");
  for (uint64_t bytes : {uint64_t{4096}, uint64_t{150528}, uint64_t{196608}, uint64_t{4} << 20}) {
    CacheOptions o;
    o.instance = fmt::format("bench-{}", ::getpid());
    o.capacity_bytes = segment_bytes;
    o.policy = EvictionPolicy::kLru;
    std::unique_ptr<SampleCache> cache = SampleCache::Create(o).value();
    uint32_t slots = 0;
    for (;; ++slots) {  // fill to ~90% without evicting
      if (cache->Stats().index.bytes_used + bytes + 4096 > segment_bytes * 9 / 10) break;
      Result<SampleCache::Allocation> a = cache->Allocate(slots, bytes);
      if (!a.ok()) break;
      std::memset(a->data.data(), static_cast<int>(slots), bytes);
      (void)cache->Commit(slots).value();
    }
    std::vector<uint8_t> src(uint64_t{slots} * bytes, 1), dst(bytes);
    // Interleave the passes so that load from other processes hits both sides alike.
    double seg = 1e300, heap = 1e300;
    uint64_t sink = 0;
    for (int r = 0; r < reps; ++r) {
      auto t0 = Clock::now();
      for (uint32_t s = 0; s < slots; ++s) {
        (void)cache->Pin(s);
        std::span<const uint8_t> data = cache->PinnedData(s).value();
        std::memcpy(dst.data(), data.data(), data.size());
        (void)cache->Unpin(s);
      }
      seg = std::min(seg, Seconds(t0));
      sink += dst[bytes / 2];
      t0 = Clock::now();
      for (uint32_t i = 0; i < slots; ++i) std::memcpy(dst.data(), &src[i * bytes], bytes);
      heap = std::min(heap, Seconds(t0));
      sink += dst[bytes / 2];
    }
    if (sink == 42) fmt::print("");
    double total = static_cast<double>(uint64_t{slots} * bytes) / (1 << 30);
    fmt::print("| {:<28} | {:>12.2f} | {:>10.2f} | {:>6.2f} |\n",
               fmt::format("{} B x {} slots", bytes, slots), total / seg, total / heap,
               heap / seg);
  }
}

// Fills a cache with a size mix that changes every phase and reports, at the end of each phase,
// how much of the data area live samples fill (payload) and their slots use (blocks).
void ChurnBench(uint64_t capacity, int steps) {
  fmt::print("\nAllocator churn: {} MiB cache (lru), {} inserts, sizes change every {} inserts; "
             "'fill' = live payload / data area at the end of each phase\n\n",
             capacity >> 20, steps, steps / 6);
  fmt::print("| {:<34} | {:>10} | {:>10} | {:>10} | {:>12} |\n", "phase (payload sizes)",
             "fill", "blocks", "evictions", "largest run");
  fmt::print("|{:-<36}|{:->12}|{:->12}|{:->12}|{:->14}|\n", "", "", "", "", "");
  CacheOptions o;
  o.instance = fmt::format("bench-churn-{}", ::getpid());
  o.capacity_bytes = capacity;
  o.policy = EvictionPolicy::kLru;
  std::unique_ptr<SampleCache> cache = SampleCache::Create(o).value();
  std::mt19937 rng(3);
  const char* names[] = {"images 190-210 KB", "records 0.2-4 KB", "images 190-210 KB",
                         "mixed 0.1 KB-1 MB", "images 120-260 KB", "records 0.2-4 KB"};
  uint32_t sample = 0;
  uint64_t evictions = 0;
  for (int phase = 0; phase < 6; ++phase) {
    for (int i = 0; i < steps / 6; ++i) {
      uint64_t bytes = phase == 1 || phase == 5 ? 200 + rng() % 3800
                       : phase == 3             ? 100 + rng() % (1 << 20)
                       : phase == 4             ? 120000 + rng() % 140000
                                                : 190000 + rng() % 20000;
      Result<SampleCache::Allocation> a = cache->Allocate(sample, bytes);
      if (a.ok()) (void)cache->Commit(sample);
      ++sample;
    }
    CacheStats st = cache->Stats();
    double total = static_cast<double>(st.allocator.total_bytes);
    fmt::print("| {:<34} | {:>9.1f}% | {:>9.1f}% | {:>10} | {:>8} pages |\n", names[phase],
               100.0 * st.payload_bytes / total, 100.0 * st.allocator.block_bytes / total,
               st.index.evictions - evictions, st.allocator.largest_free_run_pages);
    evictions = st.index.evictions;
  }
}

}  // namespace
}  // namespace carpool::cache

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  fmt::print("carpool cache micro-benchmarks{}\n", quick ? " (--quick)" : "");
  carpool::cache::IndexBench(quick ? 100000 : 1000000, quick ? 2 : 5);
  carpool::cache::CopyBench(quick ? uint64_t{64} << 20 : uint64_t{256} << 20, quick ? 5 : 21);
  carpool::cache::ChurnBench(quick ? uint64_t{64} << 20 : uint64_t{256} << 20,
                             quick ? 6000 : 60000);
  return 0;
}
