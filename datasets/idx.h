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
#include "datasets/prepare_spec.h"
#include "datasets/source.h"

namespace carpool {

inline constexpr std::string_view kIdxPrepareDefault = "raw,channels=1";

// A record becomes one cache slot and one batch element: anything larger is a damaged header.
// 256 MiB is above the largest prepared image (kMaxPrepareSide^2 x 3 bytes).
inline constexpr uint64_t kMaxIdxRecordBytes = uint64_t{1} << 28;

struct IdxHeader {
  std::vector<uint32_t> dims;  // dims[0] is the number of records
  uint64_t header_bytes = 0;   // offset of record 0
  uint64_t record_bytes = 0;   // product of dims[1..]; 1 for a labels file
  uint64_t data_bytes = 0;     // count() * record_bytes
  uint64_t count() const { return dims.empty() ? 0 : dims[0]; }
};

// The whole file, gunzipped when it starts with the gzip magic (zlib reads plain files as is).
Result<std::vector<uint8_t>> ReadMaybeGzip(const std::filesystem::path& file);

// Validates the header at the start of `prefix` (magic, dims, a record of at most
// kMaxIdxRecordBytes, sizes computed without overflow); the bytes after the header are not looked
// at. `file` names the file in errors (Corruption).
Result<IdxHeader> ParseIdxHeaderPrefix(std::span<const uint8_t> prefix, std::string_view file);

// ParseIdxHeaderPrefix, and the data must be exactly as long as the dims say.
Result<IdxHeader> ParseIdxHeader(std::span<const uint8_t> data, std::string_view file);

// The header of an IDX file (gzip or plain), read without reading the data.
Result<IdxHeader> ReadIdxHeader(const std::filesystem::path& file);

// How a raw prepare spec lays out one record: dims [N] as 1x1xC, [N,W] as 1x(W/C)xC, [N,H,W] as
// HxWxC with C = spec.channels, and [N,H,W,C] with C from the header.
struct IdxRecordLayout {
  int height = 0;
  int width = 0;
  int channels = 0;
};

// InvalidArgument when the spec is not raw, the header has more than 4 dims, or the layout's bytes
// differ from the record's (e.g. channels=3 on 28x28 records); the message names the spec and
// the fix.
Result<IdxRecordLayout> RawRecordLayout(const IdxHeader& h, const PrepareSpec& spec,
                                        std::string_view file);

// The --idx source: one sample per record of `images`, labelled by the matching record of the
// 1-D `labels` file. Classes are "0".."max label".
Result<SourceScan> ReadIdxPair(const std::filesystem::path& images,
                               const std::filesystem::path& labels);

}  // namespace carpool

#endif  // CARPOOL_DATASETS_IDX_H_
