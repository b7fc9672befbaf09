// A compact, versionless encoding of a set of sample ids, for a job's checkpointed position (the
// samples of its epoch already taken) in a create-job frame. Two forms; the encoder picks the
// smaller: a bitmap over [first, last] (dense sets: 1 bit per id in the range) or varint runs
// (sparse sets: ~2 bytes per run). A 1,281,167-sample epoch half taken encodes in ~160 KB.
#ifndef CARPOOL_PROTOCOL_ID_SET_H_
#define CARPOOL_PROTOCOL_ID_SET_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "carpool/status.h"

namespace carpool::protocol {

// `ids` ascending and distinct (REQUIRES). O(|ids| + range / 8).
std::string EncodeIdSet(const std::vector<uint32_t>& ids);
// Corruption, naming what is wrong, for bytes that EncodeIdSet cannot have written, and for a set
// of more than `max_ids` ids (a few bytes of runs can name billions). Returns the ids ascending.
// O(size + min(range, max_ids)).
Result<std::vector<uint32_t>> DecodeIdSet(std::string_view bytes, uint64_t max_ids);

}  // namespace carpool::protocol

#endif  // CARPOOL_PROTOCOL_ID_SET_H_
