// Segment: the server's read-write mapping of its shared-memory cache segment ("carpool-<instance>"
// under /dev/shm). No other process maps it. Layout and slot generations: cache/segment_layout.h.
// Boost.Interprocess exceptions stop here.
#ifndef CARPOOL_CACHE_SEGMENT_H_
#define CARPOOL_CACHE_SEGMENT_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "cache/segment_layout.h"
#include "carpool/status.h"

namespace carpool::cache {

struct SegmentMapping;  // the Boost.Interprocess mapping, kept out of this header

// "carpool-<instance>"; InvalidArgument unless instance is 1..64 of [A-Za-z0-9._-].
Result<std::string> SegmentName(std::string_view instance);

// Thread-compatible for the server's bookkeeping calls (SampleCache serializes them); the payload
// bytes of distinct slots may be written from different threads.
class Segment {
 public:
  struct Options {
    std::string name;         // from SegmentName()
    uint64_t data_bytes = 0;  // rounded up to whole pages
    uint64_t page_bytes = 1 << 20;
  };

  // Creates the segment. If one of that name exists and its owner is alive: AlreadyExists. If its
  // owner died (or its pid now belongs to another process, or it was left half-initialized), it is
  // removed with a warning and created afresh. Never returns with a segment left half-made.
  static Result<std::unique_ptr<Segment>> Create(const Options& options);
  // Unmaps, and unlinks the name if this process created it (a forked child never unlinks).
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  const std::string& name() const { return name_; }
  uint64_t data_offset() const { return header_->data_offset; }
  uint64_t data_bytes() const { return header_->page_count * header_->page_bytes; }
  uint64_t page_bytes() const { return header_->page_bytes; }
  uint64_t size() const { return header_->segment_bytes; }
  // The whole mapping (header and data area), e.g. to register it for DMA once. O(1).
  std::span<uint8_t> Mapping() const { return {base_, header_->segment_bytes}; }

  // Slot generations; offsets are from the segment start and point at a slot header.
  // REQUIRES: the caller issues strictly increasing generations and serializes these calls.
  // Odd `generation`: the slot is being written with `sample` (or is free when retired).
  void BeginWrite(uint64_t offset, uint32_t sample, uint64_t payload_bytes, uint64_t generation);
  void Publish(uint64_t offset, uint64_t generation);  // even: readable
  void Retire(uint64_t offset, uint64_t generation);   // odd: stale for every reader
  std::span<uint8_t> Payload(uint64_t offset, uint64_t bytes);
  // The slot's current generation and payload size, as the writer last stored them.
  SlotRef RefAt(uint64_t offset) const;

 private:
  Segment() = default;
  std::string name_;
  pid_t creator_ = 0;
  uint8_t* base_ = nullptr;
  SegmentHeader* header_ = nullptr;
  std::unique_ptr<SegmentMapping> mapping_;
};

}  // namespace carpool::cache

#endif  // CARPOOL_CACHE_SEGMENT_H_
