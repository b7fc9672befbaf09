#include "server/sample_lifecycle.h"

#include <fmt/format.h>

namespace carpool {

Status SampleLifecycle::Acquire(const DatasetSamples& dataset, size_t begin, size_t end) {
  if (Status added = table_.Add(dataset, begin, end); !added.ok()) return added;
  if (orphans_.empty()) return Status::OK();
  for (size_t i = begin; i < end; ++i) {  // used again: no orphan any more
    orphans_.erase(dataset.block->key_base + dataset.block->records.rows[i].id);
  }
  return Status::OK();
}

ReleasedSamples SampleLifecycle::Release(std::span<const uint32_t> keys) {
  ReleasedSamples released = table_.Release(keys);
  for (uint32_t key : released.samples) (void)Settle(key);  // only a preparing key stays
  return released;
}

Status SampleLifecycle::Settle(uint32_t key) {
  if (table_.Contains(key)) {
    orphans_.erase(key);  // a job uses it again
    return Status::OK();
  }
  // Its worker reports back, then settles it again. A bad sample stays bad (sticky, logged once):
  // a few entries. A faulted one goes, so that a later job tries it again.
  const SampleState state = states_.Get(key);
  if (state == SampleState::kPreparing) return Status::OK();
  if (state == SampleState::kBad && states_.Fault(key) == nullptr) return Status::OK();
  if (cache_holds_(key)) {  // keep its shape for a later job's hit
    orphans_.insert(key);
    return Status::OK();
  }
  orphans_.erase(key);
  return states_.Forget(key);
}

Status SampleLifecycle::Evicted(uint32_t key) {
  if (table_.Contains(key)) return states_.EvictedInUse(key);
  return Settle(key);
}

void SampleLifecycle::Sweep(double now) {
  if (sweep_.empty()) {
    if (orphans_.empty() || now < next_sweep_) return;
    next_sweep_ = now + kSweepSeconds;
    sweep_.assign(orphans_.begin(), orphans_.end());
  }
  for (size_t n = 0; n < kSweepSlice && !sweep_.empty(); ++n) {
    const uint32_t key = sweep_.back();
    sweep_.pop_back();
    if (orphans_.count(key) == 0) continue;  // forgotten or used since
    if (table_.Contains(key) || !cache_holds_(key)) (void)Settle(key);
  }
}

Status SampleLifecycle::CheckInvariants() const {
  Status broken;
  states_.ForEach([&](uint32_t key, SampleState state) {
    if (!broken.ok()) return;
    const bool sticky_bad = state == SampleState::kBad && states_.Fault(key) == nullptr;
    if (table_.Contains(key) || state == SampleState::kPreparing || sticky_bad ||
        orphans_.count(key) > 0) {
      return;
    }
    broken = Status::Internal(fmt::format(
        "sample key {} is {} but no job uses it, no worker prepares it and it is no orphan", key,
        SampleStateName(state)));
  });
  if (!broken.ok()) return broken;
  for (uint32_t key : orphans_) {
    if (!states_.Has(key)) return Status::Internal(fmt::format("orphan key {} has no state", key));
    if (table_.Contains(key)) {
      return Status::Internal(fmt::format("orphan key {} is used by a job", key));
    }
  }
  return Status::OK();
}

}  // namespace carpool
