#include "client/slot_mapping.h"

#include <fmt/format.h>

#include <cstring>

namespace carpool {

Result<std::unique_ptr<SlotMapping>> SlotMapping::Open(const protocol::JobInfo& info,
                                                       UniqueFd segment) {
  if (!segment.valid()) {
    return Status::InvalidArgument(fmt::format(
        "job {}'s batch segment {} came without its file descriptor; the client must receive "
        "job-info with recvmsg (FrameSocket) and pass the descriptor on",
        info.job_id, info.segment_name));
  }
  auto geometry = slots::ComputeGeometry(info.slot_count, info.slot_bytes);
  if (!geometry.ok()) return geometry.status();
  uint64_t sample_bytes = DTypeBytes(info.dtype);
  for (uint32_t d : info.sample_shape) sample_bytes *= d;  // bounded by the protocol decoder
  // A GPU job's images are in its device slots; its host slots hold labels and ids only.
  const uint64_t image_slot_bytes = info.device >= 0 ? info.device_slot_bytes : info.slot_bytes;
  if (sample_bytes == 0 || sample_bytes > image_slot_bytes) {
    return Status::InvalidArgument(fmt::format("a sample of {} bytes does not fit a slot of {}",
                                               sample_bytes, image_slot_bytes));
  }
  std::unique_ptr<SlotMapping> m(new SlotMapping());
  // Writable: the segment is this job's alone, and training code modifies batches in place.
  auto region = protocol::SharedMapping::Map(segment.get(), geometry->total_bytes,
                                             fmt::format("batch segment {}", info.segment_name));
  if (!region.ok()) return region.status();
  m->region_ = std::move(*region);
  m->base_ = m->region_->data();
  slots::SegmentHeader h;
  std::memcpy(&h, m->base_, sizeof(h));
  if (h.magic != slots::kSegmentMagic || h.version != slots::kSegmentVersion ||
      h.slot_count != info.slot_count || h.slot_bytes != info.slot_bytes ||
      h.slot_stride != geometry->slot_stride || h.headers_offset != geometry->headers_offset ||
      h.data_offset != geometry->data_offset || h.job_id != info.job_id) {
    return Status::Corruption(fmt::format(
        "batch segment {} header (magic 0x{:08x}, {} slots x {} bytes, job {}) does not match "
        "the job info ({} slots x {} bytes, job {})",
        info.segment_name, h.magic, h.slot_count, h.slot_bytes, h.job_id, info.slot_count,
        info.slot_bytes, info.job_id));
  }
  m->slot_count_ = info.slot_count;
  m->slot_bytes_ = info.slot_bytes;
  m->sample_bytes_ = sample_bytes;
  m->geometry_ = *geometry;
  return m;
}

SlotMapping::~SlotMapping() = default;

const slots::SlotHeader& SlotMapping::Header(uint32_t slot) const {
  return *reinterpret_cast<const slots::SlotHeader*>(base_ + geometry_.headers_offset +
                                                     uint64_t{slot} * sizeof(slots::SlotHeader));
}

uint64_t SlotMapping::Generation(uint32_t slot) const {
  return Header(slot).generation.load(std::memory_order_acquire);
}

slots::SlotState SlotMapping::State(uint32_t slot) const {
  return static_cast<slots::SlotState>(Header(slot).state.load(std::memory_order_acquire));
}

Result<BatchRegion> SlotMapping::View(const protocol::BatchReady& r, uint8_t* device_base,
                                      uint64_t device_stride, uint64_t device_slot_bytes) const {
  if (r.on_device != (device_base != nullptr)) {
    return Status::Corruption(fmt::format(
        "batch {} of epoch {} is {} but the job's batches are {}", r.batch_index, r.epoch,
        r.on_device ? "on a GPU" : "in host memory", device_base ? "on a GPU" : "in host memory"));
  }
  if (r.slot >= slot_count_) {
    return Status::Corruption(
        fmt::format("batch-ready names slot {}, the segment has {}", r.slot, slot_count_));
  }
  uint64_t gen = Generation(r.slot);
  if (gen != r.generation) {
    return Status::Corruption(fmt::format("slot {} has generation {}, batch-ready says {}", r.slot,
                                          gen, r.generation));
  }
  auto inside = [this](uint64_t offset, uint64_t bytes) {
    return offset <= slot_bytes_ && bytes <= slot_bytes_ - offset;
  };
  auto inside_device = [device_slot_bytes](uint64_t offset, uint64_t bytes) {
    return offset <= device_slot_bytes && bytes <= device_slot_bytes - offset;
  };
  const uint64_t device_label_bytes = uint64_t{r.sample_count} * sizeof(int64_t);
  const bool images_ok = r.on_device ? inside_device(r.images_offset, r.images_bytes)
                                     : inside(r.images_offset, r.images_bytes);
  if (r.on_device && !inside_device(r.device_labels_offset, device_label_bytes)) {
    return Status::Corruption(fmt::format(
        "batch {} of epoch {} has device labels at {} outside its device slot of {} bytes",
        r.batch_index, r.epoch, r.device_labels_offset, device_slot_bytes));
  }
  if (!images_ok || !inside(r.labels_offset, r.labels_bytes) ||
      !inside(r.ids_offset, r.ids_bytes)) {
    return Status::Corruption(fmt::format("batch {} of epoch {} has a byte range outside its slot "
                                          "of {} bytes",
                                          r.batch_index, r.epoch, slot_bytes_));
  }
  if (r.images_bytes != uint64_t{r.sample_count} * sample_bytes_) {
    return Status::Corruption(fmt::format("batch has {} image bytes, expected {} samples x {}",
                                          r.images_bytes, r.sample_count, sample_bytes_));
  }
  // labels() and sample_ids() span sample_count elements: the ranges must hold exactly that many.
  const uint64_t index_bytes = uint64_t{r.sample_count} * sizeof(int32_t);
  if (r.labels_bytes != index_bytes || r.ids_bytes != index_bytes || r.labels_offset % 4 != 0 ||
      r.ids_offset % 4 != 0) {
    return Status::Corruption(fmt::format(
        "batch {} of epoch {} has {} label bytes at offset {} and {} id bytes at offset {}; "
        "expected {} each ({} samples), 4-byte aligned",
        r.batch_index, r.epoch, r.labels_bytes, r.labels_offset, r.ids_bytes, r.ids_offset,
        index_bytes, r.sample_count));
  }
  const uint8_t* slot = base_ + geometry_.data_offset + uint64_t{r.slot} * geometry_.slot_stride;
  BatchRegion region{slot + r.images_offset,
                     reinterpret_cast<const int32_t*>(slot + r.labels_offset),
                     reinterpret_cast<const uint32_t*>(slot + r.ids_offset), nullptr};
  if (r.on_device) {
    uint8_t* device_slot = device_base + uint64_t{r.slot} * device_stride;
    region.images = device_slot + r.images_offset;
    region.device_labels = reinterpret_cast<int64_t*>(device_slot + r.device_labels_offset);
  }
  return region;
}

}  // namespace carpool
