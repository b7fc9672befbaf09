// What a source (image folder, file list, IDX pair, tar shards) yields before it enters the catalog: canonical
// directories and the samples found in them. Thread-compatible value types.
#ifndef CARPOOL_DATASETS_SOURCE_H_
#define CARPOOL_DATASETS_SOURCE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace carpool {

// Reports long work: `phase` names it ("scanning", "checking files", "writing catalog"), `total`
// is 0 while unknown. May be called from any thread, but never from two at once.
using ProgressFn = std::function<void(std::string_view phase, uint64_t done, uint64_t total)>;

struct SourceSample {
  uint32_t dir = 0;           // index into SourceScan::dirs
  std::string name;           // file name inside that directory
  int64_t record_index = -1;  // record of an IDX file; -1 for a whole file
  uint64_t size = 0;          // bytes of the file or of the record
  int32_t label = -1;         // index into SourceScan::classes; -1 when unlabelled
  int64_t offset = -1;        // of the data of a tar member (`name` in the shard `dir`); else -1
};

struct SourceScan {
  // Canonical absolute paths (no symlinks, ".", ".."): of directories, or of tar shards.
  std::vector<std::string> dirs;
  std::vector<SourceSample> samples;
  std::vector<std::string> classes;
  // "path: reason" for each file that could not be read; the other samples are still good.
  std::vector<std::string> unreadable;
  std::string description;      // where the samples came from, for `dataset show`
  std::string default_prepare;  // prepare spec to use when the user gives none
};

}  // namespace carpool

#endif  // CARPOOL_DATASETS_SOURCE_H_
