#include "server/batch_pool.h"

#include <fmt/format.h>

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cstring>
#include <filesystem>
#include <new>

#include "cache/shm_reserve.h"
#include "carpool/log.h"

namespace carpool {
namespace bip = boost::interprocess;

protocol::BatchReady MakeBatchReady(uint64_t job_id, uint32_t slot, uint64_t generation,
                                    uint32_t epoch, uint64_t batch_index, uint32_t samples,
                                    const slots::BatchLayout& layout) {
  protocol::BatchReady r;
  r.job_id = job_id;
  r.slot = slot;
  r.generation = generation;
  r.epoch = epoch;
  r.batch_index = batch_index;
  r.sample_count = samples;
  r.images_offset = layout.images_offset;
  r.images_bytes = layout.images_bytes;
  r.labels_offset = layout.labels_offset;
  r.labels_bytes = layout.labels_bytes;
  r.ids_offset = layout.ids_offset;
  r.ids_bytes = layout.ids_bytes;
  return r;
}

std::string BatchPool::SegmentName(const std::string& instance, uint64_t job_id) {
  return fmt::format("/carpool-{}-job-{}", instance, job_id);
}

int BatchPool::RemoveStaleSegments(const std::string& instance) {
  std::string prefix = SegmentName(instance, 0);
  prefix = prefix.substr(1, prefix.size() - 2);  // "carpool-<instance>-job-"
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    if (name.find_first_not_of("0123456789", prefix.size()) != std::string::npos) continue;
    if (bip::shared_memory_object::remove(name.c_str())) ++removed;
  }
  if (removed > 0) log::Info("removed {} stale batch segments of instance {}", removed, instance);
  return removed;
}

// Not analyzed: the new object is not shared yet, so its guarded members need no lock.
Result<std::unique_ptr<BatchPool>> BatchPool::Create(
    const std::string& name, uint64_t job_id, uint32_t slot_count, uint64_t slot_bytes,
    const cache::ClientAccess& access) NO_THREAD_SAFETY_ANALYSIS {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
      name.size() > 200) {
    return Status::InvalidArgument(
        fmt::format("batch segment name \"{}\" must look like /name (no other '/')", name));
  }
  auto geometry = slots::ComputeGeometry(slot_count, slot_bytes);
  if (!geometry.ok()) return geometry.status();

  std::unique_ptr<BatchPool> pool(new BatchPool());
  pool->name_ = name;
  pool->job_id_ = job_id;
  pool->slot_count_ = slot_count;
  pool->slot_bytes_ = slot_bytes;
  pool->geometry_ = *geometry;
  pool->state_.assign(slot_count, slots::SlotState::kFree);
  const char* shm_name = name.c_str() + 1;  // Boost adds the leading '/'
  try {
    // A segment left by a crashed server with the same instance name is stale by construction.
    bip::shared_memory_object::remove(shm_name);
    bip::permissions perms(0600);  // a group, if any, gets access next (cache/client_access.h)
    bip::shared_memory_object shm(bip::create_only, shm_name, bip::read_write, perms);
    Status shared =
        cache::ApplyClientAccess(shm.get_mapping_handle().handle, access,
                                 fmt::format("job {}'s batch segment {}", job_id, name));
    if (!shared.ok()) {
      bip::shared_memory_object::remove(shm_name);
      return shared;
    }
    shm.truncate(static_cast<bip::offset_t>(geometry->total_bytes));
    Status reserved = cache::ReserveShm(
        shm.get_mapping_handle().handle, geometry->total_bytes,
        fmt::format("job {}'s batch slots ({} x {} bytes)", job_id, slot_count, slot_bytes),
        "lower the batch size or prefetch, or make /dev/shm larger");
    if (!reserved.ok()) {
      bip::shared_memory_object::remove(shm_name);
      return reserved;
    }
    pool->region_ =
        std::make_unique<bip::mapped_region>(shm, bip::read_write, 0, geometry->total_bytes);
  } catch (const bip::interprocess_exception& e) {
    bip::shared_memory_object::remove(shm_name);
    return Status::IOError(fmt::format(
        "cannot create batch segment {} ({} bytes): {}; check that /dev/shm has room",
        name, geometry->total_bytes, e.what()));
  }
  pool->base_ = static_cast<uint8_t*>(pool->region_->get_address());
  slots::SegmentHeader h{};
  h.magic = slots::kSegmentMagic;
  h.version = slots::kSegmentVersion;
  h.slot_count = slot_count;
  h.slot_bytes = slot_bytes;
  h.slot_stride = geometry->slot_stride;
  h.headers_offset = geometry->headers_offset;
  h.data_offset = geometry->data_offset;
  h.job_id = job_id;
  std::memcpy(pool->base_, &h, sizeof(h));
  for (uint32_t i = 0; i < slot_count; ++i) {
    new (pool->base_ + geometry->headers_offset + uint64_t{i} * sizeof(slots::SlotHeader))
        slots::SlotHeader{{0}, {static_cast<uint32_t>(slots::SlotState::kFree)}};
  }
  return pool;
}

BatchPool::~BatchPool() {
  Shutdown();
  region_.reset();
  if (!bip::shared_memory_object::remove(name_.c_str() + 1)) {
    log::Warn("batch segment {} was already gone at job removal", name_);
  }
}

slots::SlotHeader& BatchPool::Header(uint32_t slot) {
  return *reinterpret_cast<slots::SlotHeader*>(base_ + geometry_.headers_offset +
                                               uint64_t{slot} * sizeof(slots::SlotHeader));
}

WritableSlot BatchPool::TakeLocked(uint32_t slot) {
  state_[slot] = slots::SlotState::kWriting;
  Header(slot).state.store(static_cast<uint32_t>(slots::SlotState::kWriting),
                           std::memory_order_relaxed);
  uint8_t* data = base_ + geometry_.data_offset + uint64_t{slot} * geometry_.slot_stride;
  return WritableSlot{slot, std::span<uint8_t>(data, slot_bytes_)};
}

std::optional<WritableSlot> BatchPool::TryAcquire() {
  MutexLock lock(mu_);
  if (shutdown_) return std::nullopt;
  for (uint32_t i = 0; i < slot_count_; ++i) {
    if (state_[i] == slots::SlotState::kFree) return TakeLocked(i);
  }
  return std::nullopt;
}

std::optional<WritableSlot> BatchPool::Acquire(std::chrono::milliseconds timeout) {
  MutexLock lock(mu_);
  std::optional<uint32_t> found;
  mu_.WaitFor(freed_, timeout, [&]() REQUIRES(mu_) {
    if (shutdown_) return true;
    for (uint32_t i = 0; i < slot_count_; ++i) {
      if (state_[i] == slots::SlotState::kFree) {
        found = i;
        return true;
      }
    }
    return false;
  });
  if (shutdown_ || !found) return std::nullopt;
  return TakeLocked(*found);
}

Result<uint64_t> BatchPool::Publish(uint32_t slot) {
  MutexLock lock(mu_);
  if (slot >= slot_count_ || state_[slot] != slots::SlotState::kWriting) {
    return Status::FailedPrecondition(
        fmt::format("publish of slot {} of {}: it is not acquired for writing", slot, name_));
  }
  state_[slot] = slots::SlotState::kPublished;
  slots::SlotHeader& h = Header(slot);
  // Release order: a client that sees the new generation also sees the batch bytes.
  uint64_t gen = h.generation.load(std::memory_order_relaxed) + 1;
  h.state.store(static_cast<uint32_t>(slots::SlotState::kPublished), std::memory_order_relaxed);
  h.generation.store(gen, std::memory_order_release);
  return gen;
}

Status BatchPool::Abandon(uint32_t slot) {
  MutexLock lock(mu_);
  if (slot >= slot_count_ || state_[slot] != slots::SlotState::kWriting) {
    return Status::FailedPrecondition(
        fmt::format("abandon of slot {} of {}: it is not acquired for writing", slot, name_));
  }
  state_[slot] = slots::SlotState::kFree;
  Header(slot).state.store(static_cast<uint32_t>(slots::SlotState::kFree),
                           std::memory_order_relaxed);
  freed_.notify_all();
  return Status::OK();
}

Status BatchPool::Release(uint32_t slot, uint64_t generation) {
  MutexLock lock(mu_);
  if (slot >= slot_count_) {
    return Status::InvalidArgument(
        fmt::format("release of slot {}: the job has {} slots", slot, slot_count_));
  }
  uint64_t current = Header(slot).generation.load(std::memory_order_relaxed);
  if (state_[slot] != slots::SlotState::kPublished || current != generation) {
    return Status::InvalidArgument(fmt::format(
        "release of slot {} generation {}: the slot is not published with that generation "
        "(current generation {}); a batch was released twice or after its job was reset",
        slot, generation, current));
  }
  state_[slot] = slots::SlotState::kFree;
  Header(slot).state.store(static_cast<uint32_t>(slots::SlotState::kFree),
                           std::memory_order_relaxed);
  freed_.notify_all();
  return Status::OK();
}

void BatchPool::ReleaseAll() {
  MutexLock lock(mu_);
  for (uint32_t i = 0; i < slot_count_; ++i) {
    state_[i] = slots::SlotState::kFree;
    Header(i).state.store(static_cast<uint32_t>(slots::SlotState::kFree),
                          std::memory_order_relaxed);
  }
  freed_.notify_all();
}

void BatchPool::Shutdown() {
  MutexLock lock(mu_);
  shutdown_ = true;
  freed_.notify_all();
}

uint32_t BatchPool::FreeCount() const {
  MutexLock lock(mu_);
  uint32_t n = 0;
  for (auto s : state_) n += s == slots::SlotState::kFree;
  return n;
}

uint32_t BatchPool::PublishedCount() const {
  MutexLock lock(mu_);
  uint32_t n = 0;
  for (auto s : state_) n += s == slots::SlotState::kPublished;
  return n;
}

}  // namespace carpool
