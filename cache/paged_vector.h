// PagedVector: a per-key array whose memory follows the keys in use, not the largest key. Keys
// are prepared keys (server/prepared_keys.h: a prepare spec's slot << 27 | catalog id), so the
// second spec's first key is 134,217,728: a dense vector sized to it took 1.6 GB for three such
// arrays and 2 s to fill when a 40-sample dataset of a second spec joined. Pages of 65,536
// entries are allocated, filled with the default, on first Touch.
// Thread-compatible. Get and operator[] are O(1); Touch is O(page) the first time per page.
#ifndef CARPOOL_CACHE_PAGED_VECTOR_H_
#define CARPOOL_CACHE_PAGED_VECTOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace carpool::cache {

template <typename T>
class PagedVector {
 public:
  static constexpr uint32_t kPageBits = 16;
  static constexpr uint32_t kPageSize = uint32_t{1} << kPageBits;

  explicit PagedVector(T fill) : fill_(fill) {}

  // Makes `key`'s entry exist (its page allocated, every entry `fill`).
  void Touch(uint32_t key) {
    const size_t page = key >> kPageBits;
    if (page >= pages_.size()) pages_.resize(page + 1);
    if (!pages_[page]) {
      pages_[page] = std::make_unique<T[]>(kPageSize);
      for (uint32_t i = 0; i < kPageSize; ++i) pages_[page][i] = fill_;
      ++allocated_pages_;
    }
  }
  // The entry of a key, or `fill` when its page was never touched. Allocates nothing.
  T Get(uint32_t key) const {
    const size_t page = key >> kPageBits;
    return page < pages_.size() && pages_[page] ? pages_[page][key & (kPageSize - 1)] : fill_;
  }
  // REQUIRES: Touch(key) was called.
  T& operator[](uint32_t key) { return pages_[key >> kPageBits][key & (kPageSize - 1)]; }
  const T& operator[](uint32_t key) const {
    return pages_[key >> kPageBits][key & (kPageSize - 1)];
  }
  // Memory held by the pages (not the page table). O(1).
  size_t allocated_bytes() const { return allocated_pages_ * size_t{kPageSize} * sizeof(T); }

 private:
  T fill_;
  std::vector<std::unique_ptr<T[]>> pages_;
  size_t allocated_pages_ = 0;
};

}  // namespace carpool::cache

#endif  // CARPOOL_CACHE_PAGED_VECTOR_H_
