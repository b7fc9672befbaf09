// The data of `carpool bench e2e`: synthetic JPEGs from `carpool dataset gen` in a cache folder
// (kept and reused across runs), registered in the folder's own catalog as "e2e", plus two derived
// datasets that overlap by half: "e2e-a" (the first two thirds of e2e's ids) and "e2e-b" (the last
// two thirds), so |a ∩ b| = |a| / 2 = |b| / 2. Thread-compatible.
#ifndef CARPOOL_TOOLS_BENCH_BENCH_E2E_DATA_H_
#define CARPOOL_TOOLS_BENCH_BENCH_E2E_DATA_H_

#include <cstdint>
#include <filesystem>
#include <string>

#include "carpool/status.h"

namespace carpool::tools {

inline constexpr const char* kE2eDataset = "e2e";
inline constexpr const char* kE2eOverlapA = "e2e-a";
inline constexpr const char* kE2eOverlapB = "e2e-b";

struct E2eData {
  std::filesystem::path image_dir;  // class subfolders of JPEGs (an ImageFolder root)
  std::filesystem::path state_dir;  // the catalog
  uint64_t images = 0;
  uint64_t overlap_size = 0;    // |e2e-a| = |e2e-b|
  uint64_t overlap_common = 0;  // |e2e-a ∩ e2e-b|
  bool generated = false;       // false: the images were reused
};

// The default cache folder: $XDG_CACHE_HOME/carpool/bench-e2e, else ~/.cache/carpool/bench-e2e.
std::filesystem::path DefaultE2eDir();

// Generates `images` JPEGs of 500x375 under `dir` unless a complete set is there, then registers
// the datasets with `prepare` (replacing earlier registrations). `exe` is the carpool binary,
// `log_dir` takes the generator's and registration's logs.
Result<E2eData> PrepareE2eData(const std::string& exe, const std::filesystem::path& dir,
                               uint64_t images, const std::string& prepare,
                               const std::filesystem::path& log_dir);

}  // namespace carpool::tools

#endif  // CARPOOL_TOOLS_BENCH_BENCH_E2E_DATA_H_
