#include "server/prepared_keys.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace carpool {

Roaring KeysOf(const Roaring& ids, uint32_t base) {
  if (base == 0) return ids;
  std::vector<uint32_t> keys(ids.cardinality());
  ids.toUint32Array(keys.data());
  for (uint32_t& k : keys) k += base;
  Roaring out;
  out.addMany(keys.size(), keys.data());
  out.runOptimize();
  return out;
}

Result<uint32_t> PreparedKeys::BaseFor(const PrepareSpec& spec, uint32_t max_id,
                                       std::string_view dataset) {
  auto it = std::find(specs_.begin(), specs_.end(), spec);
  const auto slot = static_cast<uint32_t>(it - specs_.begin());
  const bool is_new = it == specs_.end();
  if (is_new && specs_.size() == kMaxSpecSlots) {
    return Status::FailedPrecondition(fmt::format(
        "dataset \"{}\" is prepared as \"{}\", but this server has already prepared samples with "
        "{} different prepare specs, the most one server keys apart; restart the server (its "
        "cache starts empty) or register the dataset with a spec already in use",
        dataset, spec.ToString(), kMaxSpecSlots));
  }
  // Slot 0's ids may use all 32 bits only while it is the one slot.
  const bool shared = specs_.size() + (is_new ? 1 : 0) > 1;
  const uint32_t slot0_max = slot == 0 ? std::max(max_slot0_id_, max_id) : max_slot0_id_;
  if (shared && (slot0_max > kKeyIdMask || (slot > 0 && max_id > kKeyIdMask))) {
    return Status::FailedPrecondition(fmt::format(
        "dataset \"{}\" (prepare spec \"{}\") has sample ids up to {}; serving more than one "
        "prepare spec at once needs every id below {}; serve the datasets of other specs from "
        "another server (--instance) or restart this one",
        dataset, spec.ToString(), slot == 0 ? slot0_max : max_id, kKeyIdMask + 1));
  }
  if (is_new) specs_.push_back(spec);
  if (slot == 0) max_slot0_id_ = slot0_max;
  return slot << kKeyIdBits;
}

}  // namespace carpool
