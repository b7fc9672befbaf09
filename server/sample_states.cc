#include "server/sample_states.h"

#include <fmt/format.h>

#include <algorithm>

namespace carpool {

std::string_view SampleStateName(SampleState state) {
  switch (state) {
    case SampleState::kQueued: return "queued";
    case SampleState::kPreparing: return "preparing";
    case SampleState::kCached: return "cached";
    case SampleState::kTransient: return "transient";
    case SampleState::kBad: return "bad";
  }
  return "unknown";
}

SampleState SampleStates::Get(uint32_t sample) const {
  auto it = entries_.find(sample);
  return it == entries_.end() ? SampleState::kQueued : it->second.state;
}

const PreparedShape* SampleStates::Shape(uint32_t sample) const {
  auto it = entries_.find(sample);
  return it != entries_.end() && it->second.has_shape ? &it->second.shape : nullptr;
}

void SampleStates::Set(Entry& e, SampleState to) {
  --counts_[static_cast<size_t>(e.state)];
  e.state = to;
  ++counts_[static_cast<size_t>(to)];
}

Status SampleStates::Move(uint32_t sample, SampleState to, std::initializer_list<SampleState> from) {
  auto [it, inserted] = entries_.try_emplace(sample);
  if (inserted) ++counts_[static_cast<size_t>(SampleState::kQueued)];
  Entry& e = it->second;
  if (std::find(from.begin(), from.end(), e.state) == from.end()) {
    return Status::FailedPrecondition(fmt::format("sample {}: no transition from {} to {}", sample,
                                                  SampleStateName(e.state), SampleStateName(to)));
  }
  Set(e, to);
  return Status::OK();
}

Status SampleStates::BeginPreparation(uint32_t sample) {
  return Move(sample, SampleState::kPreparing, {SampleState::kQueued});
}

Status SampleStates::Committed(uint32_t sample, const PreparedShape& shape) {
  Status s = Move(sample, SampleState::kCached, {SampleState::kPreparing});
  if (s.ok()) {
    Entry& e = entries_.at(sample);
    e.shape = shape;
    e.has_shape = true;
  }
  return s;
}

Status SampleStates::AlreadyCached(uint32_t sample) {
  if (Shape(sample) == nullptr) {
    return Status::FailedPrecondition(
        fmt::format("sample {}: the cache holds it but its shape was never recorded", sample));
  }
  return Move(sample, SampleState::kCached, {SampleState::kPreparing});
}

Status SampleStates::NoRoom(uint32_t sample) {
  return Move(sample, SampleState::kTransient, {SampleState::kPreparing});
}

Status SampleStates::Abandoned(uint32_t sample) {
  return Move(sample, SampleState::kQueued, {SampleState::kPreparing});
}

Status SampleStates::Evicted(uint32_t sample) {
  return Move(sample, SampleState::kTransient, {SampleState::kCached});
}

Status SampleStates::EvictedInUse(uint32_t sample) {
  auto it = entries_.find(sample);
  if (it == entries_.end() || it->second.state != SampleState::kCached) return Status::OK();
  Entry& e = it->second;
  Set(e, e.requeued ? SampleState::kTransient : SampleState::kQueued);
  e.requeued = true;
  return Status::OK();
}

void SampleStates::Taken(uint32_t sample) {
  if (auto it = entries_.find(sample); it != entries_.end()) it->second.requeued = false;
}

Status SampleStates::TakeTransient(uint32_t sample) {
  Status s = Move(sample, SampleState::kQueued, {SampleState::kTransient});
  Taken(sample);
  return s;
}

Status SampleStates::LookupHit(uint32_t sample) {
  const SampleState now = Get(sample);
  if (now == SampleState::kPreparing || now == SampleState::kBad) return Status::OK();
  if (Shape(sample) == nullptr) {
    return Status::FailedPrecondition(fmt::format(
        "sample {}: the cache holds it but this server never committed it", sample));
  }
  return Move(sample, SampleState::kCached,
              {SampleState::kQueued, SampleState::kTransient, SampleState::kCached});
}

Status SampleStates::LookupMiss(uint32_t sample) {
  if (Get(sample) != SampleState::kCached) return Status::OK();
  return Move(sample, SampleState::kQueued, {SampleState::kCached});
}

bool SampleStates::MarkBad(uint32_t sample, std::string reason) {
  auto [it, inserted] = entries_.try_emplace(sample);
  if (inserted) ++counts_[static_cast<size_t>(SampleState::kQueued)];
  if (it->second.state == SampleState::kBad) return false;
  Set(it->second, SampleState::kBad);
  bad_reasons_[sample] = std::move(reason);
  return true;
}

bool SampleStates::MarkFaulted(uint32_t sample, std::string reason) {
  if (!MarkBad(sample, reason)) return false;
  faults_[sample] = std::move(reason);
  return true;
}

const std::string* SampleStates::Fault(uint32_t sample) const {
  auto it = faults_.find(sample);
  return it == faults_.end() ? nullptr : &it->second;
}

Status SampleStates::Forget(uint32_t sample) {
  auto it = entries_.find(sample);
  if (it == entries_.end()) return Status::OK();
  if (it->second.state == SampleState::kPreparing) {
    return Status::FailedPrecondition(
        fmt::format("sample {}: cannot forget it while it is being prepared", sample));
  }
  --counts_[static_cast<size_t>(it->second.state)];
  entries_.erase(it);
  bad_reasons_.erase(sample);
  faults_.erase(sample);
  return Status::OK();
}

}  // namespace carpool
