// How the catalog stores bitmaps and class lists. Internal to datasets/.
#ifndef CARPOOL_DATASETS_CATALOG_CODEC_H_
#define CARPOOL_DATASETS_CATALOG_CODEC_H_

#include <cstdint>
#include <roaring/roaring.hh>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "carpool/status.h"

namespace carpool {

// Portable roaring format (the one Java and Go read), run-optimized.
std::vector<uint8_t> EncodeIds(const Roaring& ids);
// Bounded, validated read: the blob must be exactly one portable bitmap of `count` ids.
Result<Roaring> DecodeIds(std::span<const uint8_t> blob, uint64_t count, std::string_view dataset);

// Class names joined by '\n' (names never hold one).
std::string EncodeClasses(const std::vector<std::string>& classes);
std::vector<std::string> DecodeClasses(std::string_view text);

int64_t UnixNow();

}  // namespace carpool

#endif  // CARPOOL_DATASETS_CATALOG_CODEC_H_
