// A writer (this process, through SampleCache) churns real shared memory while forked reader
// processes copy samples out through SegmentReader and verify every byte. One reader is killed
// with SIGKILL halfway; the writer and the other readers must not notice.
#include <fmt/core.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
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
constexpr int kRing = 1024;
// TSan slows the writer 5-15x: its churn (and the kill halfway) gets that much longer.
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

// The refs the writer publishes, each behind its own seqlock so readers never see a torn ref.
struct RingEntry {
  std::atomic<uint64_t> seq{0};
  std::atomic<uint64_t> offset{0}, generation{0}, bytes{0}, sample{0};
};
struct ReaderCounts {
  std::atomic<uint64_t> ok{0}, stale{0}, wrong{0};
};
struct Shared {
  std::atomic<bool> stop{false};
  RingEntry ring[kRing];
  ReaderCounts counts[kReaders];
};

uint8_t ByteOf(uint32_t sample, size_t i) { return static_cast<uint8_t>(sample * 131 + i * 7); }

void Fill(std::span<uint8_t> data, uint32_t sample) {
  std::memcpy(data.data(), &sample, 4);
  for (size_t i = 4; i < data.size(); ++i) data[i] = ByteOf(sample, i);
}

bool Matches(const uint8_t* data, size_t n, uint32_t sample) {
  if (n < 4 || std::memcmp(data, &sample, 4) != 0) return false;
  for (size_t i = 4; i < n; ++i) {
    if (data[i] != ByteOf(sample, i)) return false;
  }
  return true;
}

void Publish(RingEntry& e, const SlotRef& ref, uint32_t sample) {
  uint64_t s = e.seq.load(std::memory_order_relaxed);
  e.seq.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  e.offset.store(ref.offset, std::memory_order_relaxed);
  e.generation.store(ref.generation, std::memory_order_relaxed);
  e.bytes.store(ref.bytes, std::memory_order_relaxed);
  e.sample.store(sample, std::memory_order_relaxed);
  e.seq.store(s + 2, std::memory_order_release);
}

bool Snapshot(const RingEntry& e, SlotRef* ref, uint32_t* sample) {
  uint64_t s1 = e.seq.load(std::memory_order_acquire);
  ref->offset = e.offset.load(std::memory_order_relaxed);
  ref->generation = e.generation.load(std::memory_order_relaxed);
  ref->bytes = e.bytes.load(std::memory_order_relaxed);
  *sample = static_cast<uint32_t>(e.sample.load(std::memory_order_relaxed));
  std::atomic_thread_fence(std::memory_order_acquire);
  return s1 != 0 && s1 % 2 == 0 && e.seq.load(std::memory_order_relaxed) == s1;
}

[[noreturn]] void RunReader(const std::string& segment, Shared* shared, int id) {
  Result<std::unique_ptr<SegmentReader>> reader = SegmentReader::Open(segment);
  if (!reader.ok()) ::_exit(2);
  std::mt19937 rng(100 + id);
  std::vector<uint8_t> buf(1 << 20);
  ReaderCounts& counts = shared->counts[id];
  while (!shared->stop.load(std::memory_order_relaxed)) {
    SlotRef ref;
    uint32_t sample = 0;
    if (!Snapshot(shared->ring[rng() % kRing], &ref, &sample)) continue;
    Result<uint64_t> n = (*reader)->Read(ref, buf);
    if (n.ok() && Matches(buf.data(), *n, sample)) {
      counts.ok.fetch_add(1, std::memory_order_relaxed);
    } else if (!n.ok() && n.status().code() == StatusCode::kUnavailable) {
      counts.stale.fetch_add(1, std::memory_order_relaxed);
    } else {
      counts.wrong.fetch_add(1, std::memory_order_relaxed);  // another sample's bytes, or an error
    }
  }
  ::_exit(0);
}

TEST(CacheMultiProcessTest, ReadersVerifyContentWhileWriterChurnsAndOneIsKilled) {
  void* mem = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                     -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  Shared* shared = new (mem) Shared();

  CacheOptions options;
  options.instance = fmt::format("test-{}-mp", ::getpid());
  options.capacity_bytes = 8 << 20;
  options.policy = EvictionPolicy::kLru;
  Result<std::unique_ptr<SampleCache>> created = SampleCache::Create(options);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  std::unique_ptr<SampleCache> cache = std::move(*created);

  std::vector<pid_t> readers;
  for (int id = 0; id < kReaders; ++id) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) RunReader(cache->segment_name(), shared, id);  // children never return
    readers.push_back(pid);
  }

  std::mt19937 rng(5);
  uint64_t published = 0;
  std::array<uint64_t, kReaders> ok_at_kill{};
  auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::steady_clock::now() - start; };
  bool killed = false;
  while (elapsed() < std::chrono::milliseconds(1500) * kSlowdown) {
    uint32_t sample = rng() % 2000;
    std::optional<SlotRef> ref = cache->Lookup(sample);
    if (!ref) {
      Result<SampleCache::Allocation> a = cache->Allocate(sample, 4 + rng() % 60000);
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      Fill(a->data, sample);
      Result<SlotRef> committed = cache->Commit(sample);
      ASSERT_TRUE(committed.ok());
      ref = *committed;
    }
    Publish(shared->ring[published++ % kRing], *ref, sample);
    if (!killed && elapsed() > std::chrono::milliseconds(600) * kSlowdown) {
      ASSERT_EQ(::kill(readers[0], SIGKILL), 0);
      int status = 0;
      ASSERT_EQ(::waitpid(readers[0], &status, 0), readers[0]);
      ASSERT_TRUE(WIFSIGNALED(status));
      for (int id = 0; id < kReaders; ++id) ok_at_kill[id] = shared->counts[id].ok.load();
      killed = true;
    }
  }
  shared->stop.store(true);
  for (int id = 1; id < kReaders; ++id) {
    int status = 0;
    ASSERT_EQ(::waitpid(readers[id], &status, 0), readers[id]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "reader " << id;
  }

  uint64_t stale = 0;
  for (int id = 0; id < kReaders; ++id) {
    const ReaderCounts& c = shared->counts[id];
    EXPECT_EQ(c.wrong.load(), 0u) << "reader " << id << " read wrong bytes";
    EXPECT_GT(c.ok.load(), 0u) << "reader " << id;
    if (id > 0) {
      EXPECT_GT(c.ok.load(), ok_at_kill[id]) << "reader " << id << " stalled";
    }
    stale += c.stale.load();
  }
  CacheStats st = cache->Stats();
  EXPECT_GT(st.index.evictions, 100u);  // the slots really were reused under the readers
  EXPECT_GT(stale, 0u);                 // and readers noticed
  fmt::print("published {} refs, {} evictions; reads ok/stale per reader: {}/{} {}/{} {}/{}\n",
             published, st.index.evictions, shared->counts[0].ok.load(),
             shared->counts[0].stale.load(), shared->counts[1].ok.load(),
             shared->counts[1].stale.load(), shared->counts[2].ok.load(),
             shared->counts[2].stale.load());

  // The segment is intact for a fresh reader after all that.
  Result<std::unique_ptr<SegmentReader>> fresh = SegmentReader::Open(cache->segment_name());
  ASSERT_TRUE(fresh.ok());
  std::vector<uint8_t> buf(1 << 20);
  int checked = 0;
  for (uint32_t s = 0; s < 2000; ++s) {
    std::optional<SlotRef> ref = cache->Lookup(s);
    if (!ref) continue;
    ASSERT_TRUE((*fresh)->Read(*ref, buf).ok());
    ASSERT_TRUE(Matches(buf.data(), ref->bytes, s)) << s;
    ++checked;
  }
  EXPECT_EQ(static_cast<uint64_t>(checked), cache->Stats().index.entries);
  EXPECT_GT(checked, 0);
  ::munmap(mem, sizeof(Shared));
}

}  // namespace
}  // namespace carpool::cache
