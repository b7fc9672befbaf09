// CacheIndex: the server-side sample id -> slot index with reference counts, pins and the eviction
// policies refcnt, next-use and lru. Pure computation: no shared memory, no clock, no threads, so
// the server (through SampleCache) and `carpool sim` run the same code.
// Thread-compatible: callers serialize access (SampleCache holds its mutex around every call).
#ifndef CARPOOL_CACHE_CACHE_INDEX_H_
#define CARPOOL_CACHE_CACHE_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <vector>

#include "cache/paged_vector.h"
#include "carpool/status.h"

namespace carpool::cache {

enum class EvictionPolicy {
  kRefCnt,   // lowest reference count first, ties by oldest insertion (the Joader paper)
  kNextUse,  // count 0 first; otherwise the furthest next use (NextUseOracle) of a sampled set
  kLru,      // least recently inserted, looked up or unpinned first (the baseline)
};

// "refcnt" | "next-use" | "lru"; the error names the known policies.
Result<EvictionPolicy> ParseEvictionPolicy(std::string_view name);
std::string_view EvictionPolicyName(EvictionPolicy policy);

// Tells the next-use policy when a sample will next be needed, in any unit in which larger means
// later (the scheduler uses seconds from now, judged by the jobs' rates; for a sample that only R
// sets hold, the expected time of its draw). +infinity means never. Called only while choosing a
// victim.
class NextUseOracle {
 public:
  virtual ~NextUseOracle() = default;
  virtual double NextUse(uint32_t sample) const = 0;
};

struct IndexStats {
  uint64_t hits = 0;        // Lookup found the sample
  uint64_t misses = 0;      // Lookup did not
  uint64_t insertions = 0;  // successful Insert
  uint64_t evictions = 0;   // Evict (explicit Remove is not counted)
  uint64_t bytes_used = 0;
  uint64_t bytes_pinned = 0;
  uint64_t entries = 0;
  uint64_t capacity_bytes = 0;
  uint64_t decided_entries = 0;  // cached samples some job has decided (AddDecided)
};

class CacheIndex {
 public:
  static constexpr size_t kDefaultNextUseCandidates = 64;
  static constexpr size_t kUnboundedScan = static_cast<size_t>(-1);
  // What the index knows about a cached sample. `slot` is opaque to the index (SampleCache stores
  // the segment offset; the simulator may store anything).
  struct Entry {
    uint64_t slot = 0;
    uint64_t bytes = 0;
    uint32_t pins = 0;
  };
  struct Evicted {
    uint32_t sample = 0;
    Entry entry;
  };
  struct Options {
    EvictionPolicy policy = EvictionPolicy::kRefCnt;
    uint64_t capacity_bytes = 0;  // 0: nothing can be inserted; every Lookup misses
    // next-use only: how many candidates are asked for their next use per victim choice (K).
    // 0 = kDefaultNextUseCandidates; kUnboundedScan = every unpinned entry (O(n), for experiments).
    size_t next_use_scan_limit = 0;
  };

  // REQUIRES: `oracle` outlives the index; it must be non-null for kNextUse.
  explicit CacheIndex(const Options& options, const NextUseOracle* oracle = nullptr);
  CacheIndex(const CacheIndex&) = delete;
  CacheIndex& operator=(const CacheIndex&) = delete;

  // Reference counts are kept for every sample id, cached or not (a flat vector grown on demand).
  // A count never goes below zero: a negative delta that would is clamped and returns false.
  bool AddRef(uint32_t sample, int64_t delta);
  // AddRef for each of `samples` (counts clamped as AddRef does). When many tracked entries
  // change, the eviction order is rebuilt once (a sort) instead of re-keyed entry by entry: a job
  // joining a cached 1.28M-sample dataset took seconds of tree updates under the engine's lock.
  void AddRefs(std::span<const uint32_t> samples, int64_t delta);
  void SetRefCount(uint32_t sample, uint32_t count);
  uint32_t RefCount(uint32_t sample) const;
  // Bytes of the per-key arrays: pages of 65,536 keys, allocated where keys are used. O(1).
  size_t per_key_bytes() const;
  // Decided-queue entries holding the sample (the scheduler's AddDecided). refcnt and next-use
  // evict a sample no queue holds before any queued one: a decided sample is needed within the
  // look-ahead, an undecided one at a random point of an epoch. Clamped at 0 like AddRef. O(log n).
  bool AddDecided(uint32_t sample, int64_t delta);

  // Counts a hit or a miss; a hit refreshes the sample's lru position.
  std::optional<Entry> Lookup(uint32_t sample);
  // No counting, no lru refresh.
  const Entry* Find(uint32_t sample) const;

  // Inserts an unpinned entry. AlreadyExists if cached; ResourceExhausted if it does not fit in
  // the free bytes (call MakeRoom first); InvalidArgument for 0 bytes.
  Status Insert(uint32_t sample, uint64_t slot, uint64_t bytes);
  // The entry the policy would evict next, or nullopt when every entry is pinned (or none).
  std::optional<uint32_t> PickVictim() const;
  // Removes an unpinned entry and counts an eviction. NotFound / FailedPrecondition (pinned).
  Result<Entry> Evict(uint32_t sample);
  // Removes an entry, pinned or not, without counting an eviction (aborted preparation).
  Result<Entry> Remove(uint32_t sample);
  // Evicts by policy until `bytes` more fit. Fails with ResourceExhausted, evicting nothing, when
  // even evicting every unpinned entry would not make room. Evictions are appended to `evicted`.
  Status MakeRoom(uint64_t bytes, std::vector<Evicted>* evicted);

  // Pinned entries are never chosen as victims. Pins nest. NotFound if not cached;
  // FailedPrecondition on Unpin of an unpinned entry.
  Status Pin(uint32_t sample);
  Status Unpin(uint32_t sample);

  IndexStats stats() const;
  EvictionPolicy policy() const { return options_.policy; }
  uint64_t capacity_bytes() const { return options_.capacity_bytes; }
  uint64_t bytes_free() const { return options_.capacity_bytes - bytes_used_; }

 private:
  static constexpr int32_t kNone = -1;
  struct Node {  // one cached sample, in a pool indexed by node id
    uint32_t sample = 0;
    Entry entry;
    uint64_t seq = 0;      // insertion order (refcnt/next-use ties)
    int32_t prev = kNone;  // lru list links; unused for the other policies
    int32_t next = kNone;
    int32_t pos = kNone;  // next-use: index in unpinned_ while tracked
  };
  // Eviction order for refcnt and next-use: (decided by some job, refcount, insertion seq). Only
  // unpinned entries.
  struct Key {
    uint32_t decided;  // 0 or 1
    uint32_t refcount;
    uint64_t seq;
    int32_t node;
    auto operator<=>(const Key&) const = default;
  };

  void Grow(uint32_t sample);
  int32_t NodeOf(uint32_t sample) const;
  // Enter/leave the eviction structure (unpinned entries only).
  void Track(int32_t node);
  void Untrack(int32_t node);
  Result<Entry> Erase(uint32_t sample, bool count_eviction);
  Key KeyOf(int32_t node) const;
  size_t NextUseCandidates() const;
  // next-use: the victim; REQUIRES: some entry is unpinned.
  uint32_t PickFurthest() const;

  Options options_;
  const NextUseOracle* oracle_;
  PagedVector<uint32_t> refcount_{0};  // by sample key
  PagedVector<uint32_t> decided_{0};   // by sample key: decided-queue entries
  uint64_t decided_entries_ = 0;       // cached samples with decided_ > 0
  PagedVector<int32_t> node_of_{kNone};  // by sample key; kNone when not cached
  std::vector<Node> nodes_;
  std::vector<int32_t> free_nodes_;
  std::set<Key> order_;           // refcnt, next-use
  std::vector<int32_t> unpinned_;  // next-use: the tracked nodes, in any order (sampling)
  int32_t lru_head_ = kNone;      // least recent
  int32_t lru_tail_ = kNone;      // most recent
  uint64_t next_seq_ = 0;
  uint64_t bytes_used_ = 0;
  uint64_t bytes_pinned_ = 0;
  uint64_t entries_ = 0;
  uint64_t hits_ = 0, misses_ = 0, insertions_ = 0, evictions_ = 0;
};

}  // namespace carpool::cache

#endif  // CARPOOL_CACHE_CACHE_INDEX_H_
