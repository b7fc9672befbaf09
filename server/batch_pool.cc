#include "server/batch_pool.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <new>

#include "common/log.h"

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
  return fmt::format("carpool-{}-job-{}", instance, job_id);
}

int BatchPool::RemoveStaleSegments(const std::string& instance) {
  std::string prefix = SegmentName(instance, 0);
  prefix.pop_back();  // "carpool-<instance>-job-"
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

std::vector<std::string> BatchPool::SegmentLinks(const std::string& proc_dir,
                                                 const std::string& instance) {
  std::string prefix = "/memfd:" + SegmentName(instance, 0);
  prefix.pop_back();  // "/memfd:carpool-<instance>-job-"
  std::vector<std::string> links;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(proc_dir, ec)) {
    std::error_code link_ec;  // an fd closed meanwhile reads as no link
    const std::string target = std::filesystem::read_symlink(entry.path(), link_ec).string();
    if (target.rfind(prefix, 0) != 0) continue;
    const size_t end = target.find_first_not_of("0123456789", prefix.size());
    if (end > prefix.size() && end != std::string::npos && target[end] == ' ') {
      links.push_back(entry.path().string());
    }
  }
  return links;
}

namespace {

// The live pools' memfds by name: how a session finds its job's segment to send, since the
// engine hands the session only the job-info, which names the segment.
struct LivePools {
  Mutex mu;
  std::map<std::string, int> fds GUARDED_BY(mu);
};
LivePools& Live() {
  static LivePools* live = new LivePools();  // never destroyed: pools may outlive statics
  return *live;
}

// MemAvailable of /proc/meminfo; the maximum when it cannot be read (the reservation decides).
uint64_t MemAvailableBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::numeric_limits<uint64_t>::max();
}

}  // namespace

Result<UniqueFd> CreateSealedSegment(const std::string& name, uint64_t bytes, std::string_view what,
                                     std::string_view fix) {
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) {
    return Status::IOError(
        fmt::format("cannot create {} {} (memfd_create): {}", what, name, std::strerror(errno)));
  }
  // A memfd starts at 0777; the descriptor alone gives access, the mode is a second lock.
  if (::fchmod(fd.get(), 0600) != 0 || ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return Status::IOError(
        fmt::format("cannot set up {} {} ({} bytes): {}", what, name, bytes, std::strerror(errno)));
  }
  // Reserved now, so that a shortage is this error and not a SIGBUS at the first write. A memfd
  // is outside /dev/shm's size limit: more than the memory available is refused before trying,
  // rather than pushing the machine into the OOM killer.
  const uint64_t available = MemAvailableBytes();
  const int err =
      bytes > available ? ENOMEM : ::posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes));
  if (err != 0) {
    return Status::ResourceExhausted(
        fmt::format("cannot reserve {} bytes of memory for {}: {} ({} bytes available); {}", bytes,
                    what, std::strerror(err), available, fix));
  }
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Status::IOError(fmt::format("cannot seal {} {}: {}", what, name, std::strerror(errno)));
  }
  return fd;
}

Result<UniqueFd> BatchPool::ShareSegment(const std::string& name) {
  LivePools& live = Live();
  MutexLock lock(live.mu);
  auto it = live.fds.find(name);
  if (it == live.fds.end()) {
    return Status::NotFound(
        fmt::format("no live batch segment {} in this server to send; its job was removed", name));
  }
  UniqueFd copy(::fcntl(it->second, F_DUPFD_CLOEXEC, 0));
  if (!copy.valid()) {
    return Status::IOError(fmt::format("cannot duplicate batch segment {}'s descriptor: {}", name,
                                       std::strerror(errno)));
  }
  return copy;
}

size_t BatchPool::LiveCount() {
  LivePools& live = Live();
  MutexLock lock(live.mu);
  return live.fds.size();
}

// Not analyzed: the new object is not shared yet, so its guarded members need no lock.
Result<std::unique_ptr<BatchPool>> BatchPool::Create(const std::string& name, uint64_t job_id,
                                                     uint32_t slot_count, uint64_t slot_bytes)
    NO_THREAD_SAFETY_ANALYSIS {
  if (name.empty() || name.find('/') != std::string::npos || name.size() > 200) {
    return Status::InvalidArgument(
        fmt::format("batch segment name \"{}\" must be 1..200 characters without '/'", name));
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
  Result<UniqueFd> fd = CreateSealedSegment(
      name, geometry->total_bytes,
      fmt::format("job {}'s batch slots ({} x {} bytes)", job_id, slot_count, slot_bytes),
      "lower the batch size or prefetch");
  if (!fd.ok()) return fd.status();
  auto region = protocol::SharedMapping::Map(fd->get(), geometry->total_bytes,
                                             fmt::format("batch segment {}", name));
  if (!region.ok()) return region.status();
  pool->fd_ = std::move(*fd);
  pool->region_ = std::move(*region);
  pool->base_ = pool->region_->data();
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
  LivePools& live = Live();
  MutexLock lock(live.mu);
  if (!live.fds.emplace(name, pool->fd_.get()).second) {
    return Status::AlreadyExists(
        fmt::format("batch segment {} exists already in this server; two jobs got one id", name));
  }
  return pool;
}

BatchPool::~BatchPool() {
  Shutdown();
  LivePools& live = Live();
  MutexLock lock(live.mu);
  auto it = live.fds.find(name_);
  if (it != live.fds.end() && it->second == fd_.get()) live.fds.erase(it);
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
