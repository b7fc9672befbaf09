// The layout of a job's shared-memory batch slot segment, shared by the server (which writes it,
// server/batch_pool.h) and the client (which maps it read-write, client/slot_mapping.h: the
// segment is its job's alone, and training code may change a batch in place). It lives
// here, beside the protocol, so that the client depends on nothing of the server.
//
// Segment = SegmentHeader at 0 | SlotHeader[slot_count] at headers_offset |
//           slot_count data areas of slot_bytes each, slot_stride apart, from data_offset.
// A data area holds one batch: images at 0, then int32 labels, then uint32 sample ids
// (PlanBatchLayout). Pure functions and plain structs: thread-safe.
#ifndef CARPOOL_PROTOCOL_BATCH_SLOT_LAYOUT_H_
#define CARPOOL_PROTOCOL_BATCH_SLOT_LAYOUT_H_

#include <fmt/format.h>

#include <atomic>
#include <cstdint>

#include "carpool/status.h"

namespace carpool::slots {

inline constexpr uint32_t kSegmentMagic = 0x544F4C53;  // "SLOT"
inline constexpr uint32_t kSegmentVersion = 1;
inline constexpr uint64_t kPageBytes = 4096;
inline constexpr uint64_t kFieldAlignment = 64;  // of labels and ids inside a slot
inline constexpr uint64_t kMaxSegmentBytes = uint64_t{1} << 40;

struct SegmentHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t slot_count;
  uint32_t reserved;
  uint64_t slot_bytes;
  uint64_t slot_stride;
  uint64_t headers_offset;
  uint64_t data_offset;
  uint64_t job_id;
};

enum class SlotState : uint32_t { kFree = 0, kWriting = 1, kPublished = 2 };

// One per slot. The server bumps `generation` (release order) when it publishes the slot; a client
// checks it (acquire order) against the generation in the batch-ready message before reading.
struct alignas(64) SlotHeader {
  std::atomic<uint64_t> generation;
  std::atomic<uint32_t> state;  // SlotState; informational for tools and tests
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory atomics must be lock-free");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared-memory atomics must be lock-free");

inline constexpr uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

struct SegmentGeometry {
  uint64_t headers_offset = 0;
  uint64_t data_offset = 0;
  uint64_t slot_stride = 0;
  uint64_t total_bytes = 0;
};

// The byte geometry of a segment of slot_count slots of slot_bytes each; fails on a zero or
// absurd size (over kMaxSegmentBytes), so no caller ever overflows.
inline Result<SegmentGeometry> ComputeGeometry(uint32_t slot_count, uint64_t slot_bytes) {
  if (slot_count == 0 || slot_bytes == 0 || slot_bytes > kMaxSegmentBytes ||
      slot_count > kMaxSegmentBytes / RoundUp(slot_bytes, kPageBytes)) {
    return Status::InvalidArgument(fmt::format(
        "batch slot segment of {} slots x {} bytes is empty or exceeds {} bytes; lower the batch "
        "size or prefetch depth",
        slot_count, slot_bytes, kMaxSegmentBytes));
  }
  SegmentGeometry g;
  g.headers_offset = RoundUp(sizeof(SegmentHeader), alignof(SlotHeader));
  g.data_offset = RoundUp(g.headers_offset + uint64_t{slot_count} * sizeof(SlotHeader), kPageBytes);
  g.slot_stride = RoundUp(slot_bytes, kPageBytes);
  g.total_bytes = g.data_offset + uint64_t{slot_count} * g.slot_stride;
  if (g.total_bytes > kMaxSegmentBytes) {
    return Status::InvalidArgument(
        fmt::format("batch slot segment of {} bytes exceeds {}", g.total_bytes, kMaxSegmentBytes));
  }
  return g;
}

// Where one batch of `samples` samples of `sample_bytes` each goes inside a slot. The engine uses
// it both to size slots (with the job's batch size) and to place each batch.
struct BatchLayout {
  uint64_t images_offset = 0, images_bytes = 0;
  uint64_t labels_offset = 0, labels_bytes = 0;
  uint64_t ids_offset = 0, ids_bytes = 0;
  uint64_t total_bytes = 0;
};

// REQUIRES: samples * sample_bytes fits comfortably in 64 bits (both are bounded by the server).
inline BatchLayout PlanBatchLayout(uint32_t samples, uint64_t sample_bytes) {
  BatchLayout l;
  l.images_bytes = uint64_t{samples} * sample_bytes;
  l.labels_offset = RoundUp(l.images_bytes, kFieldAlignment);
  l.labels_bytes = uint64_t{samples} * 4;
  l.ids_offset = RoundUp(l.labels_offset + l.labels_bytes, kFieldAlignment);
  l.ids_bytes = uint64_t{samples} * 4;
  l.total_bytes = l.ids_offset + l.ids_bytes;
  return l;
}

}  // namespace carpool::slots

#endif  // CARPOOL_PROTOCOL_BATCH_SLOT_LAYOUT_H_
