// The byte layout of a cache segment. Only the server maps it: clients get their batches through
// their own batch segments (protocol/batch_slot_layout.h), never from the cache.
//
//   [0, 4096)                     SegmentHeader
//   [data_offset, segment_bytes)  pages of slots; each slot = SlotHeader + payload
//
// Generations come from one per-server counter and are never reused. A committed slot has an even
// generation; a slot being written, or free, has an odd one.
#ifndef CARPOOL_CACHE_SEGMENT_LAYOUT_H_
#define CARPOOL_CACHE_SEGMENT_LAYOUT_H_

#include <atomic>
#include <cstdint>

namespace carpool::cache {

inline constexpr uint64_t kSegmentMagic = 0x31304C4F4F505243ULL;  // "CRPOOL01", little-endian
inline constexpr uint32_t kLayoutVersion = 2;  // 2: no page table of carve generations
inline constexpr uint64_t kHeaderBytes = 4096;
inline constexpr uint64_t kSlotHeaderBytes = 64;  // keeps payloads 64-byte aligned

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared atomics must be lock-free");

struct SegmentHeader {
  std::atomic<uint64_t> magic;  // stored last, with release, once the rest is valid
  uint32_t layout_version;
  int32_t owner_pid;
  uint64_t owner_start_ticks;  // /proc/<pid>/stat field 22; tells a reused pid from the owner
  uint64_t segment_bytes;
  uint64_t page_bytes;
  uint64_t page_count;
  uint64_t data_offset;
};
static_assert(sizeof(SegmentHeader) <= kHeaderBytes);

struct SlotHeader {
  std::atomic<uint64_t> generation;
  uint32_t sample;
  uint32_t reserved;
  uint64_t payload_bytes;
  uint8_t padding[kSlotHeaderBytes - 24];
};
static_assert(sizeof(SlotHeader) == kSlotHeaderBytes);

// One cached sample: where its slot is (from the segment start) and which generation of that slot
// holds it. Plain data.
struct SlotRef {
  uint64_t offset = 0;
  uint64_t generation = 0;
  uint64_t bytes = 0;  // payload bytes
  bool operator==(const SlotRef&) const = default;
};

}  // namespace carpool::cache

#endif  // CARPOOL_CACHE_SEGMENT_LAYOUT_H_
