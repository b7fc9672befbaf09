// The --dir source: an image folder with one subfolder per class (labels are the indices of the
// sorted class-folder names), or a flat folder of images (no labels).
#ifndef CARPOOL_DATASETS_IMAGE_DIR_H_
#define CARPOOL_DATASETS_IMAGE_DIR_H_

#include <filesystem>
#include <string_view>

#include "carpool/status.h"
#include "datasets/source.h"

namespace carpool {

inline constexpr std::string_view kImagePrepareDefault = "resize=256,crop=256";

// True for the image file extensions the folder scan registers (.jpg, .png, ...; any case).
bool HasImageExtension(std::string_view name);

// Files inside class folders are found recursively; hidden entries are skipped, as are files
// beside class folders. Fails with NotFound when `dir` is missing or not a directory.
Result<SourceScan> ScanImageDir(const std::filesystem::path& dir, const ProgressFn& progress);

}  // namespace carpool

#endif  // CARPOOL_DATASETS_IMAGE_DIR_H_
