#include "cache/cache_index.h"

#include <fmt/core.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "common/splitmix.h"

namespace carpool::cache {

namespace {
// The candidate sampler's hash.
uint64_t Mix(uint64_t x) { return SplitMix64(x); }
}  // namespace

Result<EvictionPolicy> ParseEvictionPolicy(std::string_view name) {
  if (name == "refcnt") return EvictionPolicy::kRefCnt;
  if (name == "next-use") return EvictionPolicy::kNextUse;
  if (name == "lru") return EvictionPolicy::kLru;
  return Status::InvalidArgument(
      fmt::format("eviction policy \"{}\" is unknown (known: refcnt, next-use, lru); pass one of "
                  "those to --policy",
                  name));
}

std::string_view EvictionPolicyName(EvictionPolicy policy) {
  switch (policy) {
    case EvictionPolicy::kRefCnt: return "refcnt";
    case EvictionPolicy::kNextUse: return "next-use";
    case EvictionPolicy::kLru: return "lru";
  }
  return "unknown";
}

CacheIndex::CacheIndex(const Options& options, const NextUseOracle* oracle)
    : options_(options), oracle_(oracle) {
  assert((options.policy != EvictionPolicy::kNextUse || oracle != nullptr) &&
         "the next-use policy needs a NextUseOracle");
}

void CacheIndex::Grow(uint32_t sample) {
  refcount_.Touch(sample);
  decided_.Touch(sample);
  node_of_.Touch(sample);
}

int32_t CacheIndex::NodeOf(uint32_t sample) const { return node_of_.Get(sample); }

size_t CacheIndex::per_key_bytes() const {
  return refcount_.allocated_bytes() + decided_.allocated_bytes() + node_of_.allocated_bytes();
}

CacheIndex::Key CacheIndex::KeyOf(int32_t node) const {
  const Node& n = nodes_[node];
  return Key{decided_[n.sample] > 0 ? 1u : 0u, refcount_[n.sample], n.seq, node};
}

void CacheIndex::Track(int32_t node) {
  if (options_.policy == EvictionPolicy::kNextUse) {
    nodes_[node].pos = static_cast<int32_t>(unpinned_.size());
    unpinned_.push_back(node);
  }
  if (options_.policy != EvictionPolicy::kLru) {
    order_.insert(KeyOf(node));
    return;
  }
  Node& n = nodes_[node];
  n.prev = lru_tail_;
  n.next = kNone;
  if (lru_tail_ != kNone) nodes_[lru_tail_].next = node;
  lru_tail_ = node;
  if (lru_head_ == kNone) lru_head_ = node;
}

void CacheIndex::Untrack(int32_t node) {
  if (options_.policy == EvictionPolicy::kNextUse) {
    const int32_t pos = nodes_[node].pos;
    unpinned_[pos] = unpinned_.back();
    nodes_[unpinned_[pos]].pos = pos;
    unpinned_.pop_back();
    nodes_[node].pos = kNone;
  }
  if (options_.policy != EvictionPolicy::kLru) {
    order_.erase(KeyOf(node));
    return;
  }
  Node& n = nodes_[node];
  if (n.prev != kNone) nodes_[n.prev].next = n.next;
  else lru_head_ = n.next;
  if (n.next != kNone) nodes_[n.next].prev = n.prev;
  else lru_tail_ = n.prev;
  n.prev = n.next = kNone;
}

bool CacheIndex::AddRef(uint32_t sample, int64_t delta) {
  Grow(sample);
  int64_t want = static_cast<int64_t>(refcount_[sample]) + delta;
  bool ok = want >= 0 && want <= std::numeric_limits<uint32_t>::max();
  SetRefCount(sample, static_cast<uint32_t>(
                          std::clamp<int64_t>(want, 0, std::numeric_limits<uint32_t>::max())));
  return ok;
}

void CacheIndex::AddRefs(std::span<const uint32_t> samples, int64_t delta) {
  if (options_.policy == EvictionPolicy::kLru || samples.size() < order_.size() / 8 + 64) {
    for (uint32_t sample : samples) (void)AddRef(sample, delta);
    return;
  }
  for (uint32_t sample : samples) {
    Grow(sample);
    const int64_t want = static_cast<int64_t>(refcount_[sample]) + delta;
    refcount_[sample] = static_cast<uint32_t>(
        std::clamp<int64_t>(want, 0, std::numeric_limits<uint32_t>::max()));
  }
  // Re-key every tracked entry in its own tree node (no allocation), and sort only when the order
  // changed: a join that adds one reference to every cached sample keeps it.
  std::vector<std::set<Key>::node_type> nodes;
  nodes.reserve(order_.size());
  while (!order_.empty()) {
    nodes.push_back(order_.extract(order_.begin()));
    nodes.back().value() = KeyOf(nodes.back().value().node);
  }
  auto by_key = [](const std::set<Key>::node_type& a, const std::set<Key>::node_type& b) {
    return a.value() < b.value();
  };
  if (!std::is_sorted(nodes.begin(), nodes.end(), by_key)) {
    std::sort(nodes.begin(), nodes.end(), by_key);
  }
  for (auto& node : nodes) order_.insert(order_.end(), std::move(node));  // at the end: O(1)
}

void CacheIndex::SetRefCount(uint32_t sample, uint32_t count) {
  Grow(sample);
  int32_t node = node_of_[sample];
  // Re-key a tracked entry; the lru list does not depend on counts.
  bool rekey = node != kNone && nodes_[node].entry.pins == 0 &&
               options_.policy != EvictionPolicy::kLru && refcount_[sample] != count;
  if (rekey) order_.erase(KeyOf(node));
  refcount_[sample] = count;
  if (rekey) order_.insert(KeyOf(node));
}

bool CacheIndex::AddDecided(uint32_t sample, int64_t delta) {
  Grow(sample);
  const int64_t want = static_cast<int64_t>(decided_[sample]) + delta;
  const uint32_t count = static_cast<uint32_t>(
      std::clamp<int64_t>(want, 0, std::numeric_limits<uint32_t>::max()));
  const bool was = decided_[sample] > 0, is = count > 0;
  const int32_t node = node_of_[sample];
  if (node != kNone && was != is) {
    const bool rekey = nodes_[node].entry.pins == 0 && options_.policy != EvictionPolicy::kLru;
    if (rekey) order_.erase(KeyOf(node));
    decided_[sample] = count;
    if (rekey) order_.insert(KeyOf(node));
    if (is) ++decided_entries_;
    else --decided_entries_;
  } else {
    decided_[sample] = count;
  }
  return want >= 0;
}

uint32_t CacheIndex::RefCount(uint32_t sample) const { return refcount_.Get(sample); }

std::optional<CacheIndex::Entry> CacheIndex::Lookup(uint32_t sample) {
  int32_t node = NodeOf(sample);
  if (node == kNone) {
    ++misses_;
    return std::nullopt;
  }
  ++hits_;
  if (options_.policy == EvictionPolicy::kLru && nodes_[node].entry.pins == 0) {
    Untrack(node);
    Track(node);
  }
  return nodes_[node].entry;
}

const CacheIndex::Entry* CacheIndex::Find(uint32_t sample) const {
  int32_t node = NodeOf(sample);
  return node == kNone ? nullptr : &nodes_[node].entry;
}

Status CacheIndex::Insert(uint32_t sample, uint64_t slot, uint64_t bytes) {
  if (bytes == 0) return Status::InvalidArgument(fmt::format("sample {}: 0 bytes", sample));
  if (NodeOf(sample) != kNone) {
    return Status::AlreadyExists(fmt::format("sample {} is already cached", sample));
  }
  if (bytes > bytes_free()) {
    return Status::ResourceExhausted(
        fmt::format("sample {} needs {} bytes but {} of {} are free; call MakeRoom first", sample,
                    bytes, bytes_free(), options_.capacity_bytes));
  }
  Grow(sample);
  int32_t node;
  if (!free_nodes_.empty()) {
    node = free_nodes_.back();
    free_nodes_.pop_back();
  } else {
    node = static_cast<int32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  nodes_[node] = Node{sample, Entry{slot, bytes, 0}, next_seq_++, kNone, kNone, kNone};
  node_of_[sample] = node;
  Track(node);
  if (decided_[sample] > 0) ++decided_entries_;
  bytes_used_ += bytes;
  ++entries_;
  ++insertions_;
  return Status::OK();
}

std::optional<uint32_t> CacheIndex::PickVictim() const {
  if (options_.policy == EvictionPolicy::kLru) {
    if (lru_head_ == kNone) return std::nullopt;
    return nodes_[lru_head_].sample;
  }
  if (order_.empty()) return std::nullopt;
  if (options_.policy == EvictionPolicy::kRefCnt) return nodes_[order_.begin()->node].sample;
  return PickFurthest();
}

size_t CacheIndex::NextUseCandidates() const {
  return options_.next_use_scan_limit == 0 ? kDefaultNextUseCandidates
                                           : options_.next_use_scan_limit;
}

uint32_t CacheIndex::PickFurthest() const {
  // An undecided sample goes before a decided one; then the furthest next use wins; ties go to
  // the lower count (fewer jobs lose it), then the oldest.
  int32_t best = kNone;
  double best_use = 0;
  uint32_t best_decided = 0;
  auto consider = [&](int32_t node) {
    const uint32_t decided = decided_[nodes_[node].sample] > 0 ? 1 : 0;
    if (best != kNone && decided > best_decided) return;
    const double use = oracle_->NextUse(nodes_[node].sample);
    if (best != kNone && decided == best_decided &&
        (use < best_use || (use == best_use && KeyOf(best) < KeyOf(node)))) {
      return;
    }
    best = node;
    best_use = use;
    best_decided = decided;
  };
  // 1. Count 0, oldest first: the first that no job will ever need (+infinity) goes at once.
  const size_t k = NextUseCandidates();
  size_t scanned = 0;
  for (auto it = order_.begin();
       it != order_.end() && it->decided == 0 && it->refcount == 0 && scanned < k;
       ++it, ++scanned) {
    consider(it->node);
    if (std::isinf(best_use) && best_use > 0) return nodes_[best].sample;
  }
  // 2. Every unpinned entry when there are at most K, else K drawn by a hash of the index's state
  // (deterministic: the same state picks the same victim).
  const size_t n = unpinned_.size();
  if (k >= n) {
    for (int32_t node : unpinned_) consider(node);
  } else {
    const uint64_t seed = Mix(next_seq_ ^ (evictions_ << 32) ^ bytes_used_);
    for (size_t i = 0; i < k; ++i) consider(unpinned_[Mix(seed + i) % n]);
  }
  // 3. The sample drew only decided entries while undecided ones exist: take the undecided tier's
  // furthest among its first K (lowest counts, oldest), never a sample some job has decided.
  if (best_decided == 1 && !order_.empty() && order_.begin()->decided == 0) {
    scanned = 0;
    for (auto it = order_.begin(); it != order_.end() && it->decided == 0 && scanned < k;
         ++it, ++scanned) {
      consider(it->node);
    }
  }
  return nodes_[best].sample;
}

Result<CacheIndex::Entry> CacheIndex::Erase(uint32_t sample, bool count_eviction) {
  int32_t node = NodeOf(sample);
  if (node == kNone) return Status::NotFound(fmt::format("sample {} is not cached", sample));
  Entry entry = nodes_[node].entry;
  if (count_eviction && entry.pins > 0) {
    return Status::FailedPrecondition(
        fmt::format("sample {} is pinned {} time(s) and cannot be evicted", sample, entry.pins));
  }
  if (entry.pins == 0) Untrack(node);
  else bytes_pinned_ -= entry.bytes;
  node_of_[sample] = kNone;
  if (decided_[sample] > 0) --decided_entries_;
  free_nodes_.push_back(node);
  bytes_used_ -= entry.bytes;
  --entries_;
  if (count_eviction) ++evictions_;
  return entry;
}

Result<CacheIndex::Entry> CacheIndex::Evict(uint32_t sample) { return Erase(sample, true); }

Result<CacheIndex::Entry> CacheIndex::Remove(uint32_t sample) { return Erase(sample, false); }

Status CacheIndex::MakeRoom(uint64_t bytes, std::vector<Evicted>* evicted) {
  if (bytes > options_.capacity_bytes - bytes_pinned_) {
    return Status::ResourceExhausted(fmt::format(
        "cannot make room for {} bytes: capacity {} bytes, {} bytes pinned; release batches or "
        "raise --cache-size",
        bytes, options_.capacity_bytes, bytes_pinned_));
  }
  while (bytes > bytes_free()) {
    std::optional<uint32_t> victim = PickVictim();
    assert(victim.has_value() && "unpinned bytes exist, so a victim must");
    Result<Entry> entry = Evict(*victim);
    assert(entry.ok());
    evicted->push_back(Evicted{*victim, *entry});
  }
  return Status::OK();
}

Status CacheIndex::Pin(uint32_t sample) {
  int32_t node = NodeOf(sample);
  if (node == kNone) {
    return Status::NotFound(fmt::format("cannot pin sample {}: it is not cached", sample));
  }
  Entry& e = nodes_[node].entry;
  if (e.pins++ == 0) {
    Untrack(node);
    bytes_pinned_ += e.bytes;
  }
  return Status::OK();
}

Status CacheIndex::Unpin(uint32_t sample) {
  int32_t node = NodeOf(sample);
  if (node == kNone) {
    return Status::NotFound(fmt::format("cannot unpin sample {}: it is not cached", sample));
  }
  Entry& e = nodes_[node].entry;
  if (e.pins == 0) {
    return Status::FailedPrecondition(fmt::format("sample {} is not pinned", sample));
  }
  if (--e.pins == 0) {
    Track(node);
    bytes_pinned_ -= e.bytes;
  }
  return Status::OK();
}

IndexStats CacheIndex::stats() const {
  return IndexStats{hits_,       misses_,  insertions_,
                    evictions_,  bytes_used_, bytes_pinned_,
                    entries_,    options_.capacity_bytes, decided_entries_};
}

}  // namespace carpool::cache
