// Turns user-given file paths into canonical (directory, name) samples, fast: each distinct
// directory is canonicalized once, and files are checked with one fstatat/faccessat against an
// open directory fd, on several threads. Symlinked files are followed to their target, so a file
// reached through a symlink or ".." is the same sample as the real path.
#ifndef CARPOOL_DATASETS_FILE_RESOLVER_H_
#define CARPOOL_DATASETS_FILE_RESOLVER_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "carpool/status.h"
#include "datasets/source.h"

namespace carpool {

struct RawFile {
  std::string path;  // absolute, or relative to the `base` given to ResolveFiles
  int32_t label = -1;
};

// Appends one SourceSample per readable file to scan->samples (in input order) and one
// "path: reason" line per unreadable one to scan->unreadable. Reuses and extends scan->dirs.
// `threads` 0 means the hardware concurrency. Fails only on a resource error.
Status ResolveFiles(std::vector<RawFile> files, const std::filesystem::path& base, SourceScan* scan,
                    const ProgressFn& progress, unsigned threads = 0);

}  // namespace carpool

#endif  // CARPOOL_DATASETS_FILE_RESOLVER_H_
