// IDX files (the MNIST format): a big-endian header {0, 0, type, ndims, dims...} followed by the
// data. Only unsigned-byte data (type 0x08) is supported. Files may be gzip-compressed.
#ifndef CARPOOL_DATASETS_IDX_H_
#define CARPOOL_DATASETS_IDX_H_

#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

#include "carpool/status.h"
#include "datasets/source.h"

namespace carpool {

inline constexpr std::string_view kIdxPrepareDefault = "raw,channels=1";

struct IdxHeader {
  std::vector<uint32_t> dims;  // dims[0] is the number of records
  uint64_t header_bytes = 0;   // offset of record 0
  uint64_t record_bytes = 0;   // product of dims[1..]; 1 for a labels file
  uint64_t count() const { return dims.empty() ? 0 : dims[0]; }
};

// The whole file, gunzipped when it starts with the gzip magic (zlib reads plain files as is).
Result<std::vector<uint8_t>> ReadMaybeGzip(const std::filesystem::path& file);

// Validates the header and that the data is exactly as long as the dims say. `file` names the
// file in errors.
Result<IdxHeader> ParseIdxHeader(std::span<const uint8_t> data, std::string_view file);

// The --idx source: one sample per record of `images`, labelled by the matching record of the
// 1-D `labels` file. Classes are "0".."max label".
Result<SourceScan> ReadIdxPair(const std::filesystem::path& images,
                               const std::filesystem::path& labels);

}  // namespace carpool

#endif  // CARPOOL_DATASETS_IDX_H_
