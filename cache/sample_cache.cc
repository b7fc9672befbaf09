#include "cache/sample_cache.h"

#include <fmt/core.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <limits>

namespace carpool::cache {

namespace {

uint64_t AutoPageBytes(uint64_t capacity) {
  uint64_t target = std::bit_floor(std::max<uint64_t>(capacity / 1024, 1));
  return std::clamp<uint64_t>(target, uint64_t{64} << 10, uint64_t{4} << 20);
}

}  // namespace

SampleCache::SampleCache(const CacheOptions& options, const CacheIndex::Options& index_options)
    : clock_origin_(options.clock_origin), index_(index_options, &stored_next_use_) {}

// Not analyzed: CacheIndex calls the oracle from inside its methods, which run under mu_.
double SampleCache::StoredNextUse::NextUse(uint32_t sample) const NO_THREAD_SAFETY_ANALYSIS {
  return cache_.NextUseLocked(sample);
}

double SampleCache::NextUseLocked(uint32_t sample) const {
  if (auto it = next_use_at_.find(sample); it != next_use_at_.end()) {
    const double now =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_origin_).count();
    return std::max(0.0, it->second - now);
  }
  const uint32_t count = index_.RefCount(sample);
  return count == 0 ? std::numeric_limits<double>::infinity() : kUndecidedSeconds / count;
}

void SampleCache::SetNextUse(uint32_t sample, double at) {
  MutexLock lock(mu_);
  if (std::isinf(at)) {
    next_use_at_.erase(sample);
  } else {
    next_use_at_[sample] = at;
  }
}

void SampleCache::NextUses(std::span<const uint32_t> samples, std::span<double> out) const {
  MutexLock lock(mu_);
  for (size_t i = 0; i < samples.size() && i < out.size(); ++i) out[i] = NextUseLocked(samples[i]);
}

SampleCache::~SampleCache() = default;

// Not analyzed: the new object is not shared yet, so its guarded members need no lock.
Result<std::unique_ptr<SampleCache>> SampleCache::Create(const CacheOptions& options)
    NO_THREAD_SAFETY_ANALYSIS {
  CacheIndex::Options index_options{options.policy, 0, options.next_use_scan_limit};
  if (options.capacity_bytes == 0) {
    return std::unique_ptr<SampleCache>(new SampleCache(options, index_options));
  }
  Result<std::string> name = SegmentName(options.instance);
  if (!name.ok()) return name.status();
  uint64_t page = options.page_bytes != 0 ? options.page_bytes
                                          : AutoPageBytes(options.capacity_bytes);
  if (!std::has_single_bit(page) || page < 4096) {
    return Status::InvalidArgument(
        fmt::format("cache page size {} is not a power of two >= 4096", page));
  }
  Result<std::unique_ptr<Segment>> segment =
      Segment::Create({*name, options.capacity_bytes, page});
  if (!segment.ok()) return segment.status();
  index_options.capacity_bytes = (*segment)->data_bytes();
  std::unique_ptr<SampleCache> cache(new SampleCache(options, index_options));
  cache->allocator_ = std::make_unique<SlotAllocator>((*segment)->data_bytes(), page);
  cache->segment_ = std::move(*segment);
  cache->segment_name_ = *name;
  return cache;
}

uint64_t SampleCache::NextGeneration(bool committed) {
  ++generation_;
  if ((generation_ % 2 == 0) != committed) ++generation_;
  return generation_;
}

void SampleCache::FreeSlot(uint64_t offset) {
  payload_bytes_ -= segment_->RefAt(offset).bytes;
  segment_->Retire(offset, NextGeneration(false));
  allocator_->Free(offset - segment_->data_offset());
}

void SampleCache::FreeEvicted(const std::vector<CacheIndex::Evicted>& evicted) {
  for (const CacheIndex::Evicted& e : evicted) FreeSlot(e.entry.slot);
}

std::optional<SlotRef> SampleCache::Lookup(uint32_t sample) {
  MutexLock lock(mu_);
  if (pending_.count(sample) > 0) return std::nullopt;
  std::optional<CacheIndex::Entry> entry = index_.Lookup(sample);
  if (!entry) return std::nullopt;
  return segment_->RefAt(entry->slot);
}

bool SampleCache::Holds(uint32_t sample) const {
  MutexLock lock(mu_);
  return index_.Find(sample) != nullptr;
}

bool SampleCache::Pending(uint32_t sample) const {
  MutexLock lock(mu_);
  return pending_.count(sample) > 0;
}

Result<SampleCache::Allocation> SampleCache::Allocate(uint32_t sample, uint64_t bytes,
                                                      std::vector<uint32_t>* evicted_out) {
  MutexLock lock(mu_);
  if (!segment_) {
    return Status::ResourceExhausted(fmt::format(
        "cannot cache sample {}: the cache is disabled (--cache-size 0); prepare it into a "
        "transient buffer",
        sample));
  }
  if (bytes == 0) return Status::InvalidArgument(fmt::format("sample {}: 0 bytes", sample));
  if (index_.Find(sample) != nullptr) {
    return Status::AlreadyExists(fmt::format("sample {} is already cached or pending", sample));
  }
  const uint64_t slot_bytes = bytes + kSlotHeaderBytes;
  const uint64_t block_bytes = allocator_->BlockBytes(slot_bytes);
  if (block_bytes > index_.capacity_bytes()) {
    return Status::ResourceExhausted(
        fmt::format("sample {} needs a {}-byte slot but the cache holds {} bytes; raise "
                    "--cache-size",
                    sample, block_bytes, index_.capacity_bytes()));
  }
  std::vector<CacheIndex::Evicted> evicted;
  Status room = index_.MakeRoom(block_bytes, &evicted);
  FreeEvicted(evicted);
  if (evicted_out != nullptr) {
    for (const CacheIndex::Evicted& e : evicted) evicted_out->push_back(e.sample);
  }
  if (!room.ok()) return room;
  // The bytes fit; the pages may still be split among other classes. Evict on by policy until
  // some slab frees up. This terminates: with every unpinned entry gone, only pins hold pages.
  Result<SlotAllocator::Block> block = allocator_->Allocate(slot_bytes);
  while (!block.ok()) {
    std::optional<uint32_t> victim = index_.PickVictim();
    if (!victim) {
      return Status::ResourceExhausted(fmt::format(
          "no {}-byte slot for sample {}: free space is split among pinned slabs ({}); release "
          "batches or raise --cache-size",
          block_bytes, sample, block.status().message()));
    }
    Result<CacheIndex::Entry> entry = index_.Evict(*victim);
    assert(entry.ok());
    FreeSlot(entry->slot);
    if (evicted_out != nullptr) evicted_out->push_back(*victim);
    block = allocator_->Allocate(slot_bytes);
  }
  const uint64_t offset = segment_->data_offset() + block->offset;
  Status inserted = index_.Insert(sample, offset, block->bytes);
  assert(inserted.ok());
  Status pinned = index_.Pin(sample);
  assert(pinned.ok());
  (void)inserted;
  (void)pinned;
  const uint64_t generation = NextGeneration(false);
  segment_->BeginWrite(offset, sample, bytes, generation);
  pending_[sample] = offset;
  payload_bytes_ += bytes;
  return Allocation{SlotRef{offset, generation, bytes}, segment_->Payload(offset, bytes)};
}

Result<SlotRef> SampleCache::Commit(uint32_t sample) {
  MutexLock lock(mu_);
  auto it = pending_.find(sample);
  if (it == pending_.end()) {
    return Status::NotFound(fmt::format("sample {} has no pending slot to commit", sample));
  }
  const uint64_t offset = it->second;
  pending_.erase(it);
  segment_->Publish(offset, NextGeneration(true));
  Status unpinned = index_.Unpin(sample);
  assert(unpinned.ok());
  (void)unpinned;
  return segment_->RefAt(offset);
}

Status SampleCache::Abort(uint32_t sample) {
  MutexLock lock(mu_);
  auto it = pending_.find(sample);
  if (it == pending_.end()) {
    return Status::NotFound(fmt::format("sample {} has no pending slot to abort", sample));
  }
  const uint64_t offset = it->second;
  pending_.erase(it);
  Result<CacheIndex::Entry> removed = index_.Remove(sample);
  assert(removed.ok());
  (void)removed;
  FreeSlot(offset);
  return Status::OK();
}

Status SampleCache::Pin(uint32_t sample) {
  MutexLock lock(mu_);
  if (pending_.count(sample) > 0) {
    return Status::FailedPrecondition(fmt::format(
        "sample {} is being written (its slot is not committed); pin it once it is cached",
        sample));
  }
  return index_.Pin(sample);
}

Status SampleCache::Unpin(uint32_t sample) {
  MutexLock lock(mu_);
  return index_.Unpin(sample);
}

Result<std::span<const uint8_t>> SampleCache::PinnedData(uint32_t sample) {
  MutexLock lock(mu_);
  const CacheIndex::Entry* entry = index_.Find(sample);
  if (entry == nullptr || pending_.count(sample) > 0) {
    return Status::NotFound(fmt::format("sample {} is not cached (or not yet committed)", sample));
  }
  if (entry->pins == 0) {
    return Status::FailedPrecondition(
        fmt::format("sample {} must be pinned before its bytes are read", sample));
  }
  SlotRef ref = segment_->RefAt(entry->slot);
  std::span<uint8_t> bytes = segment_->Payload(ref.offset, ref.bytes);
  return std::span<const uint8_t>(bytes.data(), bytes.size());
}

bool SampleCache::AddRef(uint32_t sample, int64_t delta) {
  MutexLock lock(mu_);
  return index_.AddRef(sample, delta);
}

void SampleCache::AddRefs(std::span<const uint32_t> samples, int64_t delta) {
  MutexLock lock(mu_);
  index_.AddRefs(samples, delta);
}

bool SampleCache::AddDecided(uint32_t sample, int64_t delta) {
  MutexLock lock(mu_);
  return index_.AddDecided(sample, delta);
}

SampleCache::Occupancy SampleCache::Occupied() const {
  MutexLock lock(mu_);
  const IndexStats stats = index_.stats();
  return Occupancy{stats.entries, stats.decided_entries};
}

void SampleCache::SetRefCount(uint32_t sample, uint32_t count) {
  MutexLock lock(mu_);
  index_.SetRefCount(sample, count);
}

uint32_t SampleCache::RefCount(uint32_t sample) const {
  MutexLock lock(mu_);
  return index_.RefCount(sample);
}

CacheStats SampleCache::Stats() const {
  MutexLock lock(mu_);
  CacheStats stats;
  stats.index = index_.stats();
  if (allocator_) stats.allocator = allocator_->stats();
  stats.payload_bytes = payload_bytes_;
  stats.pending = pending_.size();
  return stats;
}

std::span<uint8_t> SampleCache::Mapping() const {
  return segment_ ? segment_->Mapping() : std::span<uint8_t>();
}

}  // namespace carpool::cache
