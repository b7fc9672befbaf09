// The --tar source: WebDataset-style tar shards. A sample is an image member KEY.jpg, KEY.jpeg or
// KEY.png (any case) of a shard, labelled by the decimal integer in the member KEY.cls of the same
// shard. Its identity is (canonical shard path, member name); the catalog stores where its bytes
// lie in the shard (offset, size), so a read is one pread. Members of other types (KEY.json, ...)
// are ignored. Free functions, thread-safe; TarShardWriter is thread-compatible.
#ifndef CARPOOL_DATASETS_TAR_SHARDS_H_
#define CARPOOL_DATASETS_TAR_SHARDS_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "carpool/status.h"
#include "datasets/source.h"

namespace carpool {

inline constexpr size_t kTarBlock = 512;

// A regular-file member of a shard: its full name and where its data lie.
struct TarMember {
  std::string name;
  uint64_t offset = 0;  // of the data, just past the header
  uint64_t size = 0;
};

// Appends the regular-file members of the ustar (or GNU, or v7) archive `data`, in archive order,
// to `out`; directories are skipped. Stops at the end-of-archive block or at the end of `data` on
// a block boundary. Errors, with the members before the problem already in `out`:
//  - Corruption: a header with a bad checksum, a truncated header or member data;
//  - Corruption: a pax ('x') header whose records are malformed. Pax and GNU long-name ('L')
//    headers name the next member; 'g' and 'K' headers are skipped.
// `shard` names the archive in messages. `data` is read through `read_at(offset, n, buf)` which
// returns the bytes it read (fewer only at the end of the shard).
using TarReadAt = std::function<Result<size_t>(uint64_t offset, size_t n, uint8_t* buf)>;
Status ListTarMembers(std::string_view shard, uint64_t shard_size, const TarReadAt& read_at,
                      std::vector<TarMember>* out);

// ListTarMembers over a shard in memory (tests, the fuzzer): the same parser the file scan uses.
Status ListTarMembersInMemory(std::string_view shard, std::span<const uint8_t> data,
                              std::vector<TarMember>* out);

// Expands one --tar argument into shard paths: brace ranges "train-{000000..000146}.tar" (zero
// padding from the first bound's width; several ranges multiply), else a glob (sorted matches),
// else the path itself. InvalidArgument for a malformed range, NotFound for a glob without match.
Result<std::vector<std::string>> ExpandShardPattern(std::string_view pattern);

// Scans the shards (several threads, one shard each at a time) into a SourceScan: dirs are the
// canonical shard paths, names the image members, each sample with its data offset. Missing or
// unreadable shards, damaged shards (the members before the damage are kept), images without a
// KEY.cls, labels without an image and labels that are not a non-negative decimal integer are
// each one line in scan.unreadable. When no shard has a .cls member, the samples are unlabelled
// (-1), as for a flat folder; otherwise classes are "0".."max label".
Result<SourceScan> ScanTarShards(const std::vector<std::string>& patterns,
                                 const ProgressFn& progress);

// Builds one ustar shard in memory: 512-byte headers, data padded to 512, two zero blocks at the
// end. Names longer than 100 bytes are split into the ustar prefix at a '/'.
class TarShardWriter {
 public:
  // InvalidArgument when `name` fits no ustar header (over 255 bytes, or no '/' to split at).
  Status Add(std::string_view name, std::span<const uint8_t> data);
  // The archive with its end-of-archive blocks; the writer is empty again afterwards.
  std::vector<uint8_t> Finish();

 private:
  std::vector<uint8_t> bytes_;
};

}  // namespace carpool

#endif  // CARPOOL_DATASETS_TAR_SHARDS_H_
