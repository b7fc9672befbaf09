// Prepared samples are keyed by (sample, prepare spec): the same files registered as two datasets
// with two specs ("Fashion-MNIST at 28 and at 32") are two prepared samples, each prepared, cached,
// counted and evicted apart. Everything past CreateJob (sample table, sample states, scheduler,
// cache, next-use, GPU resident area) works on keys; a batch's ids go back to catalog ids.
//
// A key is the catalog id with its spec's slot in the top bits: key = slot << kKeyIdBits | id.
// The first spec a server sees gets slot 0, so a server with one spec keys every sample by its id
// (any 32-bit id). A spec keeps its slot for the server's lifetime: cached samples keyed by a slot
// may outlive the spec's last job, so a slot is never given to another spec.
// Thread-compatible (the engine holds its lock). Every call is O(specs) (at most kMaxSpecSlots).
#ifndef CARPOOL_SERVER_PREPARED_KEYS_H_
#define CARPOOL_SERVER_PREPARED_KEYS_H_

#include <roaring/roaring.hh>

#include <cstdint>
#include <string_view>
#include <vector>

#include "carpool/status.h"
#include "datasets/prepare_spec.h"

namespace carpool {

inline constexpr int kKeyIdBits = 27;
inline constexpr uint32_t kKeyIdMask = (uint32_t{1} << kKeyIdBits) - 1;
inline constexpr uint32_t kMaxSpecSlots = uint32_t{1} << (32 - kKeyIdBits);  // 32

// `ids` as keys of the spec whose base is `base` (their catalog ids when it is 0). O(|ids|).
Roaring KeysOf(const Roaring& ids, uint32_t base);

class PreparedKeys {
 public:
  // The key base of `spec` (key = base + catalog id), giving it the next slot when it is new.
  // `max_id`: the dataset's largest catalog id. FailedPrecondition, naming the dataset and the
  // fix, when the keys would not fit: a 33rd spec, or ids of 2^27 and more beside a second spec.
  Result<uint32_t> BaseFor(const PrepareSpec& spec, uint32_t max_id, std::string_view dataset);
  // The specs seen, by slot (slot i's base is i << kKeyIdBits).
  const std::vector<PrepareSpec>& specs() const { return specs_; }

 private:
  std::vector<PrepareSpec> specs_;
  uint32_t max_slot0_id_ = 0;  // the largest id keyed in slot 0 (where ids may use all 32 bits)
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_PREPARED_KEYS_H_
