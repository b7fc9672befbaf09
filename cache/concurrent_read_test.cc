// The server's readers (batch assembly) against its writer: one thread churns the cache through
// SampleCache (allocate, fill, commit, evict) while reader threads look samples up, pin them, read
// their bytes through PinnedData and verify every byte, as the engine's workers do. A pinned
// sample is never evicted under its reader, so a reader sees either its sample's own bytes or a
// miss; never another sample's.
#include <fmt/core.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "cache/sample_cache.h"

namespace carpool::cache {
namespace {

constexpr int kReaders = 3;
constexpr uint32_t kSamples = 2000;
// TSan slows the writer 5-15x: its churn gets that much longer.
#if defined(__SANITIZE_THREAD__)
constexpr int kSlowdown = 10;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr int kSlowdown = 10;
#else
constexpr int kSlowdown = 1;
#endif
#else
constexpr int kSlowdown = 1;
#endif

struct ReaderCounts {
  std::atomic<uint64_t> ok{0}, missed{0}, wrong{0};
};

uint8_t ByteOf(uint32_t sample, size_t i) { return static_cast<uint8_t>(sample * 131 + i * 7); }

void Fill(std::span<uint8_t> data, uint32_t sample) {
  std::memcpy(data.data(), &sample, 4);
  for (size_t i = 4; i < data.size(); ++i) data[i] = ByteOf(sample, i);
}

bool Matches(std::span<const uint8_t> data, uint32_t sample) {
  if (data.size() < 4 || std::memcmp(data.data(), &sample, 4) != 0) return false;
  for (size_t i = 4; i < data.size(); ++i) {
    if (data[i] != ByteOf(sample, i)) return false;
  }
  return true;
}

// One reader: Lookup, Pin, PinnedData, verify, Unpin. A sample evicted between Lookup and Pin is a
// miss (Pin says NotFound), as it is for the engine.
void RunReader(SampleCache& cache, const std::atomic<bool>& stop, ReaderCounts& counts, int id) {
  std::mt19937 rng(100 + id);
  while (!stop.load(std::memory_order_relaxed)) {
    const uint32_t sample = rng() % kSamples;
    if (!cache.Lookup(sample) || !cache.Pin(sample).ok()) {
      counts.missed.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    Result<std::span<const uint8_t>> data = cache.PinnedData(sample);
    if (data.ok() && Matches(*data, sample)) {
      counts.ok.fetch_add(1, std::memory_order_relaxed);
    } else {
      counts.wrong.fetch_add(1, std::memory_order_relaxed);  // another sample's bytes, or an error
    }
    if (!cache.Unpin(sample).ok()) counts.wrong.fetch_add(1, std::memory_order_relaxed);
  }
}

TEST(CacheConcurrentReadTest, ReadersVerifyContentWhileTheWriterChurns) {
  CacheOptions options;
  options.instance = fmt::format("test-{}-concurrent", ::getpid());
  options.capacity_bytes = 8 << 20;
  options.policy = EvictionPolicy::kLru;
  Result<std::unique_ptr<SampleCache>> created = SampleCache::Create(options);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  std::unique_ptr<SampleCache> cache = std::move(*created);

  std::atomic<bool> stop{false};
  std::array<ReaderCounts, kReaders> counts;
  std::vector<std::thread> readers;
  for (int id = 0; id < kReaders; ++id) {
    readers.emplace_back(RunReader, std::ref(*cache), std::cref(stop), std::ref(counts[id]), id);
  }

  std::mt19937 rng(5);
  uint64_t written = 0;
  uint64_t exhausted = 0;  // every slot pinned by the readers at that moment
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(1500) * kSlowdown) {
    const uint32_t sample = rng() % kSamples;
    if (cache->Holds(sample)) continue;
    Result<SampleCache::Allocation> a = cache->Allocate(sample, 4 + rng() % 60000);
    if (!a.ok()) {
      ASSERT_EQ(a.status().code(), StatusCode::kResourceExhausted) << a.status().ToString();
      ++exhausted;
      continue;
    }
    Fill(a->data, sample);
    ASSERT_TRUE(cache->Commit(sample).ok());
    ++written;
  }
  stop.store(true);
  for (std::thread& t : readers) t.join();

  for (int id = 0; id < kReaders; ++id) {
    EXPECT_EQ(counts[id].wrong.load(), 0u) << "reader " << id << " read wrong bytes";
    EXPECT_GT(counts[id].ok.load(), 0u) << "reader " << id;
  }
  CacheStats st = cache->Stats();
  EXPECT_GT(st.index.evictions, 100u);  // the slots really were reused under the readers
  EXPECT_EQ(st.index.bytes_pinned, 0u);
  fmt::print(
      "wrote {} samples ({} times no room), {} evictions; reads ok/missed per reader: "
      "{}/{} {}/{} {}/{}\n",
      written, exhausted, st.index.evictions, counts[0].ok.load(), counts[0].missed.load(),
      counts[1].ok.load(), counts[1].missed.load(), counts[2].ok.load(), counts[2].missed.load());

  // Every cached sample still holds its own bytes after all that.
  int checked = 0;
  for (uint32_t s = 0; s < kSamples; ++s) {
    if (!cache->Lookup(s)) continue;
    ASSERT_TRUE(cache->Pin(s).ok());
    Result<std::span<const uint8_t>> data = cache->PinnedData(s);
    ASSERT_TRUE(data.ok()) << s;
    ASSERT_TRUE(Matches(*data, s)) << s;
    ASSERT_TRUE(cache->Unpin(s).ok());
    ++checked;
  }
  EXPECT_EQ(static_cast<uint64_t>(checked), cache->Stats().index.entries);
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace carpool::cache
