#include "tools/bench/bench_e2e_data.h"

#include <fmt/core.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <vector>

#include "datasets/catalog.h"
#include "datasets/derived.h"
#include "tools/bench/bench_e2e_procs.h"

namespace carpool::tools {
namespace {

constexpr const char* kCompleteMarker = ".complete";
constexpr std::chrono::seconds kSetupTimeout{3600};

Status RunOne(const std::string& label, std::vector<std::string> argv,
              const std::filesystem::path& log_dir) {
  ScheduledProcess p{label, std::move(argv), 0};
  Result<std::vector<FinishedProcess>> done = RunScheduled({p}, log_dir, -1, kSetupTimeout);
  return done.status();
}

// Adds "e2e-a" (ids of rank < 2n/3) and "e2e-b" (rank >= n/3) to the catalog.
Status AddOverlapDatasets(const std::filesystem::path& state_dir, E2eData* data) {
  Result<std::unique_ptr<Catalog>> catalog = Catalog::Open(state_dir);
  if (!catalog.ok()) return catalog.status();
  Result<DatasetInfo> full = (*catalog)->GetDataset(kE2eDataset);
  if (!full.ok()) return full.status();
  const uint64_t n = full->ids.cardinality();
  uint32_t third = 0, two_thirds = 0;
  if (n < 3 || !full->ids.select(static_cast<uint32_t>(n / 3), &third) ||
      !full->ids.select(static_cast<uint32_t>(n - n / 3), &two_thirds)) {
    return Status::InvalidArgument(fmt::format(
        "dataset \"{}\" has {} samples; the overlap scenario needs at least 3", kE2eDataset, n));
  }
  struct Part {
    const char* name;
    std::string range;
  };
  const Part parts[] = {{kE2eOverlapA, fmt::format(":{}", two_thirds)},
                        {kE2eOverlapB, fmt::format("{}:", third)}};
  Roaring a_ids;
  for (const Part& part : parts) {
    Result<DerivedSet> d = SelectIdRange(*full, part.range);
    if (!d.ok()) return d.status();
    d->meta.name = part.name;
    Result<DatasetInfo> added = (*catalog)->AddDataset(d->meta, d->ids, /*replace=*/true);
    if (!added.ok()) return added.status();
    if (a_ids.isEmpty()) {
      a_ids = d->ids;
      data->overlap_size = d->ids.cardinality();
    } else {
      data->overlap_common = (a_ids & d->ids).cardinality();
    }
  }
  return Status::OK();
}

}  // namespace

std::filesystem::path DefaultE2eDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && xdg[0] == '/') {
    return std::filesystem::path(xdg) / "carpool" / "bench-e2e";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] == '/') {
    return std::filesystem::path(home) / ".cache" / "carpool" / "bench-e2e";
  }
  return std::filesystem::temp_directory_path() / "carpool-bench-e2e";
}

Result<E2eData> PrepareE2eData(const std::string& exe, const std::filesystem::path& dir,
                               uint64_t images, const std::string& prepare,
                               const std::filesystem::path& log_dir) {
  E2eData data;
  data.images = images;
  data.image_dir = dir / fmt::format("jpeg-{}-500x375", images);
  data.state_dir = dir / fmt::format("state-{}", images);
  std::error_code ec;
  if (!std::filesystem::exists(data.image_dir / kCompleteMarker, ec)) {
    // A partial set (an interrupted run) is regenerated from scratch.
    std::filesystem::remove_all(data.image_dir, ec);
    std::filesystem::create_directories(data.image_dir, ec);
    if (ec) {
      return Status::IOError(fmt::format("cannot create \"{}\": {}; pass a writable --dir",
                                         data.image_dir.string(), ec.message()));
    }
    if (Status s = RunOne("dataset-gen",
                          {exe, "dataset", "gen", data.image_dir.string(), "--count",
                           std::to_string(images), "--size", "500x375", "--quiet"},
                          log_dir);
        !s.ok()) {
      return s;
    }
    std::ofstream(data.image_dir / kCompleteMarker) << images << "\n";
    data.generated = true;
  }
  std::filesystem::create_directories(data.state_dir, ec);
  if (Status s =
          RunOne("dataset-add",
                 {exe, "dataset", "add", kE2eDataset, "--dir", data.image_dir.string(), "--prepare",
                  prepare, "--replace", "--quiet", "--state-dir", data.state_dir.string()},
                 log_dir);
      !s.ok()) {
    return s;
  }
  if (Status s = AddOverlapDatasets(data.state_dir, &data); !s.ok()) return s;
  return data;
}

}  // namespace carpool::tools
