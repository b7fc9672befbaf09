// SampleCache: the server's cache of prepared samples. It joins the index and eviction policy
// (CacheIndex), the size-class allocator (SlotAllocator) and the shared-memory segment (Segment).
// Only the server reads the samples (PinnedData); clients never map the cache.
//
// Life of a sample: Allocate (evicts by policy to make room; the slot is pinned and invisible to
// Lookup) -> the caller writes the payload, from any thread -> Commit (readable, unpinned) ->
// Lookup/Pin/Unpin -> evicted by policy, which retires the slot's generation before reuse.
//
// --cache-size 0: no segment is created, every Lookup misses, and Allocate returns
// ResourceExhausted; the caller then prepares into its own transient buffer (the no-sharing
// baseline).
// Thread-safe: one internal mutex around all bookkeeping; payload bytes are written outside it.
#ifndef CARPOOL_CACHE_SAMPLE_CACHE_H_
#define CARPOOL_CACHE_SAMPLE_CACHE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/cache_index.h"
#include "cache/segment.h"
#include "cache/slot_allocator.h"
#include "common/mutex.h"
#include "carpool/status.h"

namespace carpool::cache {

struct CacheOptions {
  std::string instance = "default";  // segment "carpool-<instance>"
  uint64_t capacity_bytes = 0;       // the segment's data area, rounded up to whole pages
  EvictionPolicy policy = EvictionPolicy::kRefCnt;
  uint64_t page_bytes = 0;           // 0: capacity/1024 as a power of two in [64 KiB, 4 MiB]
  size_t next_use_scan_limit = 0;    // see CacheIndex::Options
  // SetNextUse's times are seconds since this instant (the server's scheduler clock).
  std::chrono::steady_clock::time_point clock_origin = std::chrono::steady_clock::now();
};

struct CacheStats {
  IndexStats index;          // hits, misses, insertions, evictions, bytes (= slot bytes), entries
  AllocatorStats allocator;  // pages and blocks
  uint64_t payload_bytes = 0;  // sample bytes in committed and pending slots
  uint64_t pending = 0;        // allocated, not yet committed
};

class SampleCache {
 public:
  struct Allocation {
    SlotRef ref;               // generation is odd (not readable) until Commit
    std::span<uint8_t> data;   // ref.bytes writable bytes in the segment
  };

  // The next-use policy ranks samples by the times SetNextUse gave (the cache asks nobody while
  // it evicts, so Allocate needs no lock of its caller's).
  static Result<std::unique_ptr<SampleCache>> Create(const CacheOptions& options);
  ~SampleCache();  // retires nothing; unlinks the segment (Segment's destructor)
  SampleCache(const SampleCache&) = delete;
  SampleCache& operator=(const SampleCache&) = delete;

  // Committed sample: its ref, counted as a hit. Not cached: nullopt, counted as a miss. Being
  // prepared (allocated, not committed): nullopt, counted as neither; see Pending().
  std::optional<SlotRef> Lookup(uint32_t sample);
  bool Pending(uint32_t sample) const;
  // Cached or pending; counts nothing and refreshes nothing. O(1) expected.
  bool Holds(uint32_t sample) const;

  // Reserves a slot for `bytes` of payload, evicting by policy. AlreadyExists if cached or
  // pending; ResourceExhausted if the cache is disabled, the sample is larger than the cache, or
  // the pinned samples leave no room.
  // `evicted`, when given, gets the samples evicted to make room (the caller may drop their state).
  Result<Allocation> Allocate(uint32_t sample, uint64_t bytes,
                              std::vector<uint32_t>* evicted = nullptr);
  // Publishes a pending slot. NotFound if `sample` is not pending.
  Result<SlotRef> Commit(uint32_t sample);
  // Frees a pending slot (preparation failed). NotFound if `sample` is not pending.
  Status Abort(uint32_t sample);

  // Pinned samples are never evicted. NotFound if not cached; FailedPrecondition while its slot is
  // pending (being written: a reader that looked it up committed may meet it evicted and
  // allocated again before its Pin, and must not pin bytes not yet there).
  Status Pin(uint32_t sample);
  Status Unpin(uint32_t sample);
  // The bytes of a committed, pinned sample, for the server's own readers (batch assembly).
  // FailedPrecondition unless pinned; the span stays valid until the matching Unpin.
  Result<std::span<const uint8_t>> PinnedData(uint32_t sample);

  // Reference counts, kept for cached and uncached samples (CacheIndex::AddRef).
  bool AddRef(uint32_t sample, int64_t delta);
  // AddRef for each of `samples` under one lock. O(n) for uncached samples, O(n log n) cached.
  void AddRefs(std::span<const uint32_t> samples, int64_t delta);
  // CacheIndex::AddDecided under the lock. O(log n).
  bool AddDecided(uint32_t sample, int64_t delta);
  // Cached samples, and those of them some job has decided (IndexStats::entries and
  // decided_entries), read together. O(1).
  struct Occupancy {
    uint64_t entries = 0;
    uint64_t decided = 0;
  };
  Occupancy Occupied() const;
  void SetRefCount(uint32_t sample, uint32_t count);
  uint32_t RefCount(uint32_t sample) const;
  // When a job is next expected to take `sample`, in seconds since options.clock_origin
  // (RefCountSink::NextUseChanged); +infinity: no job has decided it. O(1) expected.
  void SetNextUse(uint32_t sample, double at);
  // Seconds from now until each sample's next use, as the next-use policy ranks them: the time
  // SetNextUse gave (0 when overdue); for a sample no job has decided, +infinity with reference
  // count 0 (nobody needs it), else kUndecidedSeconds over its count (needed later, sooner the
  // more jobs hold it). For the GPU's resident area. O(n) under the cache's lock.
  void NextUses(std::span<const uint32_t> samples, std::span<double> out) const;
  static constexpr double kUndecidedSeconds = 1e9;

  CacheStats Stats() const;
  // Empty when the cache is disabled (capacity 0).
  const std::string& segment_name() const { return segment_name_; }
  // The segment's whole mapping in this process (empty with --cache-size 0). Every span that
  // PinnedData returns lies inside it. O(1).
  std::span<uint8_t> Mapping() const;
  EvictionPolicy policy() const {
    MutexLock lock(mu_);
    return index_.policy();
  }

 private:
  // The next-use policy's oracle: the cache's own stored times, read under its mutex.
  class StoredNextUse : public NextUseOracle {
   public:
    explicit StoredNextUse(const SampleCache& cache) : cache_(cache) {}
    double NextUse(uint32_t sample) const override;

   private:
    const SampleCache& cache_;
  };

  explicit SampleCache(const CacheOptions& options, const CacheIndex::Options& index_options);
  double NextUseLocked(uint32_t sample) const REQUIRES(mu_);
  // Odd when !committed; strictly increasing.
  uint64_t NextGeneration(bool committed) REQUIRES(mu_);
  void FreeSlot(uint64_t offset) REQUIRES(mu_);  // retire the generation, return the block
  void FreeEvicted(const std::vector<CacheIndex::Evicted>& evicted) REQUIRES(mu_);

  mutable Mutex mu_;
  const std::chrono::steady_clock::time_point clock_origin_;
  StoredNextUse stored_next_use_{*this};
  std::unordered_map<uint32_t, double> next_use_at_ GUARDED_BY(mu_);  // decided samples only
  CacheIndex index_ GUARDED_BY(mu_);
  std::unique_ptr<SlotAllocator> allocator_ GUARDED_BY(mu_);  // null when disabled
  std::unique_ptr<Segment> segment_;          // null when disabled
  std::unordered_map<uint32_t, uint64_t> pending_ GUARDED_BY(mu_);  // sample -> slot offset
  uint64_t generation_ GUARDED_BY(mu_) = 0;
  uint64_t payload_bytes_ GUARDED_BY(mu_) = 0;
  std::string segment_name_;
};

}  // namespace carpool::cache

#endif  // CARPOOL_CACHE_SAMPLE_CACHE_H_
