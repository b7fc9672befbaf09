// The client's view of a job's batch slot segment (layout: batch_slot_layout.h), which came as
// the fd attached to its job-info. The mapping is read-write (the segment is this job's alone, and
// training code may change a batch in place); this class itself only reads it, so it is
// thread-safe after Open. The mapping stays valid while this object lives, even after the server
// closes the segment.
#ifndef CARPOOL_CLIENT_SLOT_MAPPING_H_
#define CARPOOL_CLIENT_SLOT_MAPPING_H_

#include <cstdint>
#include <memory>
#include <string>

#include "carpool/status.h"
#include "common/unique_fd.h"
#include "protocol/batch_slot_layout.h"
#include "protocol/protocol.h"
#include "protocol/segment_fd.h"

namespace carpool {

// Pointers into one published batch; valid while the SlotMapping lives and the slot is unreleased.
struct BatchRegion {
  const uint8_t* images = nullptr;   // device memory for a batch on a GPU
  const int32_t* labels = nullptr;   // host
  const uint32_t* ids = nullptr;     // host
  int64_t* device_labels = nullptr;  // int64 labels in device memory (GPU batches only)
};

class SlotMapping {
 public:
  // Maps `segment` (the descriptor that came with `info`) and checks its header against `info`.
  // The descriptor is closed once mapped. InvalidArgument when there is none.
  static Result<std::unique_ptr<SlotMapping>> Open(const protocol::JobInfo& info, UniqueFd segment);
  ~SlotMapping();
  SlotMapping(const SlotMapping&) = delete;
  SlotMapping& operator=(const SlotMapping&) = delete;

  // Validates `ready` against this segment (slot index, generation, every byte range inside the
  // slot, image bytes = sample_count * per-sample bytes) and returns pointers into it. A batch on
  // a GPU (ready.on_device) has its images and int64 labels in device slot `ready.slot` at
  // `device_base` (slots of device_stride, device_slot_bytes usable each), checked the same way.
  Result<BatchRegion> View(const protocol::BatchReady& ready, uint8_t* device_base = nullptr,
                           uint64_t device_stride = 0, uint64_t device_slot_bytes = 0) const;

  uint32_t slot_count() const { return slot_count_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t Generation(uint32_t slot) const;  // REQUIRES: slot < slot_count()
  slots::SlotState State(uint32_t slot) const;  // REQUIRES: slot < slot_count()

 private:
  SlotMapping() = default;
  const slots::SlotHeader& Header(uint32_t slot) const;

  std::unique_ptr<protocol::SharedMapping> region_;
  uint8_t* base_ = nullptr;
  uint32_t slot_count_ = 0;
  uint64_t slot_bytes_ = 0;
  uint64_t sample_bytes_ = 0;
  slots::SegmentGeometry geometry_;
};

}  // namespace carpool

#endif  // CARPOOL_CLIENT_SLOT_MAPPING_H_
