// SampleLifecycle: everything the engine keeps per prepared key, from the first job that acquires
// it to the moment its state is forgotten (docs/architecture.md, "The life of a sample").
//
// It owns the three structures keyed by sample key, and the rule that ties them together:
//   - the users (SampleTable): how many jobs present use the key, and where its bytes come from;
//   - the state (SampleStates): queued, preparing, cached, transient or bad;
//   - the orphans: keys no job uses whose state stays while the cache may still hold them, so
//     that a later job's cache hit finds its shape.
// The rule (CheckInvariants): a key has a state only while a job uses it, a worker prepares it,
// it is bad from its data (sticky), or it is an orphan. Acquire, Release and Settle keep it;
// every other transition goes through states() and leaves users alone.
//
// Thread-compatible: the engine holds its lock around every call. Costs are per call.
#ifndef CARPOOL_SERVER_SAMPLE_LIFECYCLE_H_
#define CARPOOL_SERVER_SAMPLE_LIFECYCLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "carpool/status.h"
#include "server/engine_samples.h"
#include "server/sample_states.h"

namespace carpool {

class SampleLifecycle {
 public:
  // Whether the cache still holds a key (cache::SampleCache::Holds). Called under the caller's
  // lock; must not call back into this object.
  using CacheHolds = std::function<bool(uint32_t key)>;
  static constexpr double kSweepSeconds = 10;  // each orphan is looked at again this often
  static constexpr size_t kSweepSlice = 4096;  // orphans per Sweep call at most

  explicit SampleLifecycle(CacheHolds cache_holds) : cache_holds_(std::move(cache_holds)) {}

  // One more user of rows [begin, end) of the dataset (SampleTable::Add, with its check): a job
  // acquires its samples in parts, so a caller may drop its lock between them. O(rows).
  Status Acquire(const DatasetSamples& dataset, size_t begin, size_t end);
  // Room for `more` samples (SampleTable::Reserve): before the first of a large job's parts.
  void Reserve(size_t more) { table_.Reserve(more); }
  // One user fewer of each key. A key left unused loses its state (Settle); IDX files no key
  // reads any more are returned for the caller's reader to forget. O(|keys|).
  ReleasedSamples Release(std::span<const uint32_t> keys);
  // A worker finished with the key (prepared, failed or abandoned), or the cache evicted it:
  // forgets its state when no job uses it, keeping it as an orphan while the cache holds it.
  // FailedPrecondition only on a bookkeeping bug. O(1) expected.
  Status Settle(uint32_t key);
  // The cache evicted the key to make room (Allocate's list, under the same lock): a key some job
  // still needs goes back to the workers (SampleStates::EvictedInUse), so that its batch does not
  // find it gone and prepare it in its one assembler; any other key is settled. O(1) expected.
  Status Evicted(uint32_t key);
  // The cache evicts without telling: every kSweepSeconds each orphan is looked at once, at most
  // kSweepSlice per call, so a cache of a million orphans never stalls a caller. O(kSweepSlice).
  void Sweep(double now);

  bool InUse(uint32_t key) const { return table_.Contains(key); }
  // Whether a key in use reads the IDX file (its reader may keep the file loaded). O(1).
  bool ReadsIdx(const std::string& path) const { return table_.ReadsIdx(path); }
  // What a preparation needs; null for a key no job uses. O(path length).
  std::shared_ptr<const SampleSource> Source(uint32_t key) const { return table_.Find(key); }
  int32_t Label(uint32_t key) const { return table_.Label(key); }  // -1 if unknown; O(1)

  // The per-key state machine; its transitions keep users and orphans as they are.
  SampleStates& states() { return states_; }
  const SampleStates& states() const { return states_; }

  size_t keys_in_use() const { return table_.size(); }
  size_t orphans() const { return orphans_.size(); }
  size_t idx_files() const { return table_.idx_files(); }

  // The rule above, checked over every state: InternalError naming the first key that breaks it.
  // O(states). For tests and debugging.
  Status CheckInvariants() const;

 private:
  CacheHolds cache_holds_;
  SampleTable table_;
  SampleStates states_;
  std::unordered_set<uint32_t> orphans_;
  double next_sweep_ = 0;
  std::vector<uint32_t> sweep_;  // the sweep in progress
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_SAMPLE_LIFECYCLE_H_
