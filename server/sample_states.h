// The engine's per-sample state: one table, one state per sample, and every legal transition in
// this one place (docs/server.md, "The life of a sample").
//
//   kQueued     decided for a job (or not yet seen); nothing prepared, nothing in flight
//   kPreparing  a worker is preparing it into the cache
//   kCached     committed to the cache (it may since have been evicted: a pin tells)
//   kTransient  the cache had no room, or evicted it again: the batch that takes it prepares it
//   kBad        unreadable or undecodable; skipped for good (sticky)
//
//   queued    --BeginPreparation--> preparing --Committed / AlreadyCached--> cached
//   preparing --NoRoom--> transient            cached --Evicted--> transient
//   cached --EvictedInUse--> queued, the first time since its last take; transient after that
//   preparing --Abandoned--> queued (the commit failed)
//   transient --TakeTransient--> queued        queued|transient --LookupHit--> cached
//   cached    --LookupMiss--> queued           any --MarkBad--> bad
//   any --MarkFaulted--> bad (a fault: its jobs fail rather than skip it)
//   any but preparing --Forget--> (no entry: queued)
//
// An illegal transition changes nothing and returns FailedPrecondition naming the sample and both
// states, so a bookkeeping bug is a logged error, not a sample that is cached and transient at
// once. Thread-compatible (the engine holds its lock). Every call is O(1) expected.
#ifndef CARPOOL_SERVER_SAMPLE_STATES_H_
#define CARPOOL_SERVER_SAMPLE_STATES_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

#include "carpool/status.h"
#include "server/prepare.h"

namespace carpool {

enum class SampleState : uint8_t { kQueued, kPreparing, kCached, kTransient, kBad };
inline constexpr size_t kSampleStateCount = 5;
std::string_view SampleStateName(SampleState state);

class SampleStates {
 public:
  SampleState Get(uint32_t sample) const;
  // kQueued: nobody prepares it and nothing is known of it, so the coordinator must start its
  // preparation. Any other state is being prepared, prepared, or to be prepared by its assembler.
  bool NeedsPreparation(uint32_t sample) const { return Get(sample) == SampleState::kQueued; }
  // The shape of a sample committed to the cache at some point (kept after eviction), or null.
  const PreparedShape* Shape(uint32_t sample) const;
  size_t Count(SampleState state) const { return counts_[static_cast<size_t>(state)]; }

  Status BeginPreparation(uint32_t sample);                       // queued -> preparing
  Status Committed(uint32_t sample, const PreparedShape& shape);  // preparing -> cached
  Status AlreadyCached(uint32_t sample);  // preparing -> cached; the shape is known from before
  Status NoRoom(uint32_t sample);         // preparing -> transient
  Status Abandoned(uint32_t sample);      // preparing -> queued
  Status Evicted(uint32_t sample);        // cached -> transient
  // The cache evicted a sample some job still needs (Allocate's list): cached -> queued, so the
  // workers prepare it again (ahead, or in parallel when its batch reaches a front). Evicted again
  // before a batch takes it, it goes cached -> transient instead: a cache too small for the
  // batches waiting on it would otherwise evict and prepare the same samples for ever. Other
  // states are left alone (a miss already requeued it). O(1) expected.
  Status EvictedInUse(uint32_t sample);
  // A batch took the sample from the cache (pinned): EvictedInUse requeues it again. O(1) expected.
  void Taken(uint32_t sample);
  Status TakeTransient(uint32_t sample);  // transient -> queued
  // The cache answered a lookup of a decided sample. Hit: queued|transient|cached -> cached (the
  // shape must be known). Miss: cached -> queued, other states unchanged. Preparing and bad
  // samples are left alone: the cache does not know them yet, or never will.
  Status LookupHit(uint32_t sample);
  Status LookupMiss(uint32_t sample);
  // any -> bad. Returns true the first time (so the reason is logged once).
  bool MarkBad(uint32_t sample, std::string reason);
  // any -> bad, as a fault: a task threw while preparing it (not a data error), so the jobs that
  // need it fail with `reason` instead of skipping it. Returns true the first time.
  bool MarkFaulted(uint32_t sample, std::string reason);
  // The reason of a sample marked faulted, else null. O(1).
  const std::string* Fault(uint32_t sample) const;
  // Drops what is known of a sample (SampleLifecycle calls it for a sample no job uses any more,
  // and never for a sample bad from its data, which stays bad; a faulted one is dropped, so a job
  // coming back to it tries again). FailedPrecondition for a sample being prepared: its worker
  // still reports back.
  Status Forget(uint32_t sample);
  size_t size() const { return entries_.size(); }  // samples with an entry
  bool Has(uint32_t sample) const { return entries_.count(sample) > 0; }  // O(1) expected
  // fn(sample, state) for every sample with an entry, in no order. O(entries).
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& [sample, entry] : entries_) fn(sample, entry.state);
  }

 private:
  struct Entry {
    SampleState state = SampleState::kQueued;
    bool has_shape = false;
    bool requeued = false;  // EvictedInUse sent it back to the workers since its last take
    PreparedShape shape;
  };
  Status Move(uint32_t sample, SampleState to, std::initializer_list<SampleState> from);
  void Set(Entry& e, SampleState to);

  std::unordered_map<uint32_t, Entry> entries_;
  std::unordered_map<uint32_t, std::string> bad_reasons_;
  std::unordered_map<uint32_t, std::string> faults_;  // of bad samples marked faulted
  std::array<size_t, kSampleStateCount> counts_{};  // kQueued counts only entries present
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_SAMPLE_STATES_H_
