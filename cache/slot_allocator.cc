#include "cache/slot_allocator.h"

#include <fmt/core.h>

#include <algorithm>
#include <bit>
#include <cassert>

namespace carpool::cache {

SlotAllocator::SlotAllocator(uint64_t total_bytes, uint64_t page_bytes)
    : page_bytes_(page_bytes), page_count_(static_cast<uint32_t>(total_bytes / page_bytes)) {
  assert(std::has_single_bit(page_bytes) && page_bytes >= 4096 && page_bytes >= kMinBlock * 8);
  // 8 classes per doubling, multiples of kMinBlock, up to one page.
  for (uint64_t base = kMinBlock; base <= page_bytes; base *= 2) {
    for (uint64_t step = 0; step < 8; ++step) {
      uint64_t size = (base + base * step / 8 + kMinBlock - 1) / kMinBlock * kMinBlock;
      if (size > page_bytes) break;
      if (!classes_.empty() && classes_.back().block_bytes >= size) continue;
      // The slab length (pages) that wastes the least at its end; stop early under 1/16.
      SizeClass c{size, 1, 0, kNone};
      double best_waste = 1.0;
      for (uint32_t k = 1; k <= kMaxSlabPages; ++k) {
        uint64_t slab = k * page_bytes;
        double waste = static_cast<double>(slab % size) / static_cast<double>(slab);
        if (waste < best_waste) {
          best_waste = waste;
          c.slab_pages = k;
        }
        if (best_waste <= 1.0 / 16) break;
      }
      c.blocks_per_slab = static_cast<uint32_t>(c.slab_pages * page_bytes / size);
      classes_.push_back(c);
    }
  }
  slab_of_page_.assign(page_count_, kNone);
  if (page_count_ > 0) GiveRun(0, page_count_);
}

int SlotAllocator::ClassOf(uint64_t bytes) const {
  auto it = std::lower_bound(classes_.begin(), classes_.end(), bytes,
                             [](const SizeClass& c, uint64_t b) { return c.block_bytes < b; });
  return it == classes_.end() ? -1 : static_cast<int>(it - classes_.begin());
}

uint64_t SlotAllocator::BlockBytes(uint64_t bytes) const {
  int c = ClassOf(std::max<uint64_t>(bytes, 1));
  if (c >= 0) return classes_[c].block_bytes;
  return (bytes + page_bytes_ - 1) / page_bytes_ * page_bytes_;
}

std::optional<uint32_t> SlotAllocator::TakeRun(uint32_t pages) {
  auto it = by_length_.lower_bound({pages, 0});
  if (it == by_length_.end()) return std::nullopt;
  auto [length, first] = *it;
  by_length_.erase(it);
  runs_.erase(first);
  if (length > pages) {
    runs_[first + pages] = length - pages;
    by_length_.insert({length - pages, first + pages});
  }
  return first;
}

void SlotAllocator::GiveRun(uint32_t first, uint32_t pages) {
  // Coalesce with the free runs on either side.
  auto next = runs_.lower_bound(first);
  if (next != runs_.end() && next->first == first + pages) {
    pages += next->second;
    by_length_.erase({next->second, next->first});
    next = runs_.erase(next);
  }
  if (next != runs_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == first) {
      by_length_.erase({prev->second, prev->first});
      first = prev->first;
      pages += prev->second;
      runs_.erase(prev);
    }
  }
  runs_[first] = pages;
  by_length_.insert({pages, first});
}

int32_t SlotAllocator::NewSlab(uint32_t first_page, uint32_t pages, int32_t size_class) {
  int32_t id;
  if (!free_slabs_.empty()) {
    id = free_slabs_.back();
    free_slabs_.pop_back();
  } else {
    id = static_cast<int32_t>(slabs_.size());
    slabs_.emplace_back();
  }
  Slab& s = slabs_[id];
  s = Slab{};
  s.first_page = first_page;
  s.pages = pages;
  s.size_class = size_class;
  for (uint32_t p = first_page; p < first_page + pages; ++p) slab_of_page_[p] = id;
  pages_in_use_ += pages;
  return id;
}

void SlotAllocator::ReleaseSlab(int32_t id) {
  Slab& s = slabs_[id];
  for (uint32_t p = s.first_page; p < s.first_page + s.pages; ++p) slab_of_page_[p] = kNone;
  pages_in_use_ -= s.pages;
  GiveRun(s.first_page, s.pages);
  s.freed.clear();
  s.freed.shrink_to_fit();
  free_slabs_.push_back(id);
}

void SlotAllocator::LinkPartial(int32_t id) {
  Slab& s = slabs_[id];
  SizeClass& c = classes_[s.size_class];
  s.prev = kNone;
  s.next = c.partial_head;
  if (c.partial_head != kNone) slabs_[c.partial_head].prev = id;
  c.partial_head = id;
}

void SlotAllocator::UnlinkPartial(int32_t id) {
  Slab& s = slabs_[id];
  SizeClass& c = classes_[s.size_class];
  if (s.prev != kNone) slabs_[s.prev].next = s.next;
  else c.partial_head = s.next;
  if (s.next != kNone) slabs_[s.next].prev = s.prev;
  s.prev = s.next = kNone;
}

Result<SlotAllocator::Block> SlotAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0) return Status::InvalidArgument("cannot allocate a slot of 0 bytes");
  int c = ClassOf(bytes);
  if (c < 0) {
    uint64_t pages64 = (bytes + page_bytes_ - 1) / page_bytes_;
    std::optional<uint32_t> first =
        pages64 <= page_count_ ? TakeRun(static_cast<uint32_t>(pages64)) : std::nullopt;
    if (!first) {
      return Status::ResourceExhausted(
          fmt::format("no run of {} free pages for a {}-byte slot", pages64, bytes));
    }
    uint32_t pages = static_cast<uint32_t>(pages64);
    int32_t id = NewSlab(*first, pages, kSpanClass);
    slabs_[id].used = 1;
    block_bytes_ += pages64 * page_bytes_;
    ++live_blocks_;
    return Block{uint64_t{*first} * page_bytes_, pages64 * page_bytes_};
  }
  SizeClass& cls = classes_[c];
  int32_t id = cls.partial_head;
  if (id == kNone) {
    std::optional<uint32_t> first = TakeRun(cls.slab_pages);
    if (!first) {
      return Status::ResourceExhausted(fmt::format(
          "no free {}-byte block and no run of {} free pages", cls.block_bytes, cls.slab_pages));
    }
    id = NewSlab(*first, cls.slab_pages, c);
    LinkPartial(id);
  }
  Slab& s = slabs_[id];
  uint32_t block;
  if (!s.freed.empty()) {
    block = s.freed.back();
    s.freed.pop_back();
  } else {
    block = s.untouched++;
  }
  if (++s.used == cls.blocks_per_slab) UnlinkPartial(id);
  block_bytes_ += cls.block_bytes;
  ++live_blocks_;
  return Block{uint64_t{s.first_page} * page_bytes_ + block * cls.block_bytes, cls.block_bytes};
}

void SlotAllocator::Free(uint64_t offset) {
  uint32_t page = static_cast<uint32_t>(offset / page_bytes_);
  assert(page < page_count_ && slab_of_page_[page] != kNone);
  int32_t id = slab_of_page_[page];
  Slab& s = slabs_[id];
  --live_blocks_;
  if (s.size_class == kSpanClass) {
    block_bytes_ -= uint64_t{s.pages} * page_bytes_;
    ReleaseSlab(id);
    return;
  }
  SizeClass& cls = classes_[s.size_class];
  uint64_t in_slab = offset - uint64_t{s.first_page} * page_bytes_;
  assert(in_slab % cls.block_bytes == 0);
  block_bytes_ -= cls.block_bytes;
  if (s.used-- == cls.blocks_per_slab) LinkPartial(id);
  if (s.used == 0) {
    UnlinkPartial(id);
    ReleaseSlab(id);
    return;
  }
  s.freed.push_back(static_cast<uint32_t>(in_slab / cls.block_bytes));
}

AllocatorStats SlotAllocator::stats() const {
  AllocatorStats st;
  st.total_bytes = uint64_t{page_count_} * page_bytes_;
  st.block_bytes = block_bytes_;
  st.pages_in_use = pages_in_use_;
  st.live_blocks = live_blocks_;
  st.largest_free_run_pages = by_length_.empty() ? 0 : by_length_.rbegin()->first;
  return st;
}

}  // namespace carpool::cache
