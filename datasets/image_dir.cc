#include "datasets/image_dir.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <system_error>
#include <vector>

#include "common/log.h"
#include "datasets/file_resolver.h"

namespace carpool {

namespace fs = std::filesystem;

bool HasImageExtension(std::string_view name) {
  static constexpr std::string_view kExt[] = {".jpg", ".jpeg", ".png", ".bmp", ".webp",
                                              ".ppm", ".pgm",  ".tif", ".tiff"};
  size_t dot = name.rfind('.');
  if (dot == std::string_view::npos) return false;
  std::string ext(name.substr(dot));
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return std::find(std::begin(kExt), std::end(kExt), ext) != std::end(kExt);
}

namespace {

bool Hidden(const fs::path& p) { return p.filename().string().starts_with('.'); }

// Appends the image files below `dir` (not following directory symlinks) to `out`.
void CollectImages(const fs::path& dir, int32_t label, std::vector<RawFile>* out, SourceScan* scan,
                   const ProgressFn& progress) {
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec), end;
  if (ec) {
    scan->unreadable.push_back(fmt::format("{}: {}", dir.string(), ec.message()));
    return;
  }
  for (; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    std::error_code type_ec;  // a dangling symlink is no directory; the resolver reports it
    bool is_dir = it->is_directory(type_ec) && !it->is_symlink(type_ec);
    if (Hidden(p)) {
      if (is_dir) it.disable_recursion_pending();
      continue;
    }
    if (is_dir) continue;
    if (!HasImageExtension(p.filename().string())) continue;
    out->push_back({p.string(), label});
    if (progress && out->size() % 8192 == 0) progress("scanning", out->size(), 0);
  }
  // A failed increment ends the walk; report where, so the user can fix it.
  if (ec) scan->unreadable.push_back(fmt::format("{}: {}", dir.string(), ec.message()));
}

}  // namespace

Result<SourceScan> ScanImageDir(const fs::path& dir, const ProgressFn& progress) {
  std::error_code ec;
  fs::path root = fs::canonical(dir, ec);
  if (ec || !fs::is_directory(root, ec)) {
    return Status::NotFound(
        fmt::format("image folder \"{}\" cannot be used: {}; pass an existing directory to --dir",
                    dir.string(), ec ? ec.message() : "not a directory"));
  }
  SourceScan scan;
  scan.default_prepare = std::string(kImagePrepareDefault);
  std::vector<std::string> class_dirs;
  size_t loose_files = 0;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (Hidden(it->path())) continue;
    if (it->is_directory(type_ec)) {
      class_dirs.push_back(it->path().filename().string());
    } else if (HasImageExtension(it->path().filename().string())) {
      ++loose_files;
    }
  }
  if (ec) {
    return Status::IOError(fmt::format("cannot list image folder \"{}\": {}; check permissions",
                                       root.string(), ec.message()));
  }
  std::sort(class_dirs.begin(), class_dirs.end());
  std::vector<RawFile> files;
  if (class_dirs.empty()) {
    CollectImages(root, -1, &files, &scan, progress);
    scan.description = fmt::format("dir {} (flat, unlabelled)", root.string());
  } else {
    for (size_t c = 0; c < class_dirs.size(); ++c) {
      if (class_dirs[c].find('\n') != std::string::npos) {
        return Status::InvalidArgument(
            fmt::format("class folder \"{}\" in \"{}\" has a newline in its name; rename it",
                        class_dirs[c], root.string()));
      }
      CollectImages(root / class_dirs[c], static_cast<int32_t>(c), &files, &scan, progress);
    }
    if (loose_files > 0) {
      log::Warn("{} image files beside the class folders of \"{}\" are not registered", loose_files,
                root.string());
    }
    scan.classes = std::move(class_dirs);
    scan.description = fmt::format("dir {} ({} class folders)", root.string(), scan.classes.size());
  }
  Status s = ResolveFiles(std::move(files), root, &scan, progress);
  if (!s.ok()) return s;
  return scan;
}

}  // namespace carpool
