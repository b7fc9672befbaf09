// The --list source: a CSV file of "path,label" lines. Paths may be absolute or relative to the
// list's own directory; labels are all non-negative integers (used as they are) or else class
// names (labels are indices into the sorted names). An optional first line "path,label" is a
// header; blank lines and lines starting with '#' are skipped; a path may be double-quoted.
#ifndef CARPOOL_DATASETS_FILE_LIST_H_
#define CARPOOL_DATASETS_FILE_LIST_H_

#include <filesystem>
#include <string_view>

#include "carpool/status.h"
#include "datasets/source.h"

namespace carpool {

inline constexpr int32_t kMaxIntegerLabel = 1'000'000;

// Fails with NotFound for a missing list and InvalidArgument naming the line of the first
// malformed one. Files that cannot be read are listed in SourceScan::unreadable.
Result<SourceScan> ReadFileList(const std::filesystem::path& list, const ProgressFn& progress);

}  // namespace carpool

#endif  // CARPOOL_DATASETS_FILE_LIST_H_
