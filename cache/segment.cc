#include "cache/segment.h"

#include <fmt/core.h>
#include <signal.h>
#include <unistd.h>

#include <bit>
#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "cache/shm_reserve.h"
#include "common/log.h"

namespace carpool::cache {

namespace bip = boost::interprocess;

struct SegmentMapping {
  bip::mapped_region region;
};

namespace {

// Process start time in clock ticks since boot (/proc/<pid>/stat field 22), 0 if unknown.
uint64_t ProcessStartTicks(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream fields(stat.substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 22 && (fields >> field); ++i) {
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  }
  return 0;
}

bool OwnerAlive(pid_t pid, uint64_t start_ticks) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  // The pid exists; it is the owner unless it was reused by a process started later.
  uint64_t now = ProcessStartTicks(pid);
  return start_ticks == 0 || now == 0 || now == start_ticks;
}

std::string BipMessage(const bip::interprocess_exception& e) {
  return fmt::format("{} (native error {})", e.what(), e.get_native_error());
}

// Decides whether an existing segment of this name belongs to a live server. Ok(true): live;
// Ok(false): stale, may be removed. A header still being written by a server that is starting
// right now looks like all zeros for a moment, so zeros are re-read for up to ~200 ms.
Result<bool> ExistingOwnerAlive(const std::string& name) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::optional<bip::shared_memory_object> opened;
    try {
      opened.emplace(bip::open_only, name.c_str(), bip::read_only);
    } catch (const bip::interprocess_exception& e) {
      if (e.get_error_code() == bip::not_found_error) return false;  // gone meanwhile: create it
      throw;
    }
    bip::shared_memory_object& shm = *opened;
    bip::offset_t size = 0;
    if (shm.get_size(size) && size >= static_cast<bip::offset_t>(kHeaderBytes)) {
      bip::mapped_region region(shm, bip::read_only, 0, kHeaderBytes);
      const auto* h = static_cast<const SegmentHeader*>(region.get_address());
      uint64_t magic = h->magic.load(std::memory_order_acquire);
      if (magic == kSegmentMagic) {
        bool alive = OwnerAlive(h->owner_pid, h->owner_start_ticks);
        if (alive) {
          return Status::AlreadyExists(fmt::format(
              "shared-memory segment \"{}\" is in use by live server pid {}; stop that server or "
              "start this one with another instance name",
              name, h->owner_pid));
        }
        log::Warn("replacing stale cache segment \"{}\" left by dead server pid {}", name,
                  h->owner_pid);
        return false;
      }
      if (magic != 0) {
        return Status::FailedPrecondition(fmt::format(
            "\"/dev/shm/{}\" exists but is not a carpool cache segment (magic {:#x}); remove it "
            "or choose another instance name",
            name, magic));
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  log::Warn("replacing half-initialized cache segment \"{}\" (a server died while creating it)",
            name);
  return false;
}

}  // namespace

Result<std::string> SegmentName(std::string_view instance) {
  bool ok = !instance.empty() && instance.size() <= 64;
  for (char c : instance) {
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
  }
  if (!ok) {
    return Status::InvalidArgument(fmt::format(
        "instance name \"{}\" is not 1..64 characters of [A-Za-z0-9._-]; pick a simpler name",
        instance));
  }
  return "carpool-" + std::string(instance);
}

Result<std::unique_ptr<Segment>> Segment::Create(const Options& options) {
  const uint64_t page = options.page_bytes;
  if (!std::has_single_bit(page) || page < 4096 || options.data_bytes == 0) {
    return Status::InvalidArgument(fmt::format(
        "segment \"{}\": data bytes {} must be > 0, page bytes {} a power of two >= 4096",
        options.name, options.data_bytes, page));
  }
  const uint64_t pages = (options.data_bytes + page - 1) / page;
  const uint64_t data_offset = kHeaderBytes;
  const uint64_t total = data_offset + pages * page;
  std::unique_ptr<Segment> seg(new Segment());
  seg->name_ = options.name;
  try {
    // The server's alone in both modes: clients never map the cache (their batches come by fd).
    bip::permissions perms(0600);
    std::optional<bip::shared_memory_object> shm;
    for (int attempt = 0; attempt < 3 && !shm; ++attempt) {
      try {
        shm.emplace(bip::create_only, options.name.c_str(), bip::read_write, perms);
      } catch (const bip::interprocess_exception& e) {
        if (e.get_error_code() != bip::already_exists_error) throw;
        Result<bool> alive = ExistingOwnerAlive(options.name);
        if (!alive.ok()) return alive.status();
        bip::shared_memory_object::remove(options.name.c_str());
      }
    }
    if (!shm) {
      return Status::Unavailable(fmt::format(
          "segment \"{}\" kept reappearing while being replaced; another server is starting "
          "with the same instance name",
          options.name));
    }
    seg->creator_ = ::getpid();  // from here on the destructor unlinks
    shm->truncate(static_cast<bip::offset_t>(total));
    Status reserved = ReserveShm(shm->get_mapping_handle().handle, total,
                                 fmt::format("the cache segment \"{}\"", options.name),
                                 "lower --cache-size or make /dev/shm larger");
    if (!reserved.ok()) return reserved;
    seg->mapping_ = std::make_unique<SegmentMapping>(
        SegmentMapping{bip::mapped_region(*shm, bip::read_write)});
  } catch (const bip::interprocess_exception& e) {
    return Status::IOError(fmt::format("cannot create shared-memory segment \"{}\" of {} bytes: "
                                       "{}; check /dev/shm space and permissions",
                                       options.name, total, BipMessage(e)));
  }
  seg->base_ = static_cast<uint8_t*>(seg->mapping_->region.get_address());
  seg->header_ = reinterpret_cast<SegmentHeader*>(seg->base_);
  SegmentHeader* h = seg->header_;
  h->layout_version = kLayoutVersion;
  h->owner_pid = ::getpid();
  h->owner_start_ticks = ProcessStartTicks(::getpid());
  h->segment_bytes = total;
  h->page_bytes = page;
  h->page_count = pages;
  h->data_offset = data_offset;
  h->magic.store(kSegmentMagic, std::memory_order_release);
  return seg;
}

Segment::~Segment() {
  mapping_.reset();
  if (creator_ != 0 && creator_ == ::getpid()) {
    bip::shared_memory_object::remove(name_.c_str());
  }
}

void Segment::BeginWrite(uint64_t offset, uint32_t sample, uint64_t payload_bytes,
                         uint64_t generation) {
  auto* slot = reinterpret_cast<SlotHeader*>(base_ + offset);
  slot->generation.store(generation, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  slot->sample = sample;
  slot->payload_bytes = payload_bytes;
}

void Segment::Publish(uint64_t offset, uint64_t generation) {
  reinterpret_cast<SlotHeader*>(base_ + offset)->generation.store(generation,
                                                                  std::memory_order_release);
}

void Segment::Retire(uint64_t offset, uint64_t generation) {
  reinterpret_cast<SlotHeader*>(base_ + offset)
      ->generation.store(generation, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
}

SlotRef Segment::RefAt(uint64_t offset) const {
  const auto* slot = reinterpret_cast<const SlotHeader*>(base_ + offset);
  return SlotRef{offset, slot->generation.load(std::memory_order_relaxed), slot->payload_bytes};
}

std::span<uint8_t> Segment::Payload(uint64_t offset, uint64_t bytes) {
  return {base_ + offset + kSlotHeaderBytes, bytes};
}

}  // namespace carpool::cache
