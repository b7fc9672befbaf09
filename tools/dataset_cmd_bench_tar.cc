// `carpool dataset bench --tar`: prepare throughput (read + decode + resize, as the server's
// workers do it) from tar shards against the image folder, on the same synthetic JPEGs, measured
// side by side in one run. Passes alternate between the two sources and each keeps its best pass,
// so that other load on the machine hits both alike. Prints a Markdown table and the ratio.
#include <fmt/core.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <boost/program_options.hpp>
#include <chrono>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "datasets/image_dir.h"
#include "datasets/sample_reader.h"
#include "datasets/tar_shards.h"
#include "server/prepare.h"
#include "tools/dataset_cmd.h"

namespace carpool::tools {

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

struct Source {
  std::string name;
  std::vector<SampleRecord> records;  // in image-index order, the same images for both sources
  double best_prepare = 0, best_read = 0;  // items/s
};

// Registers the scan and returns its records sorted by image name (img_NNNNNNNN.jpg).
Result<std::vector<SampleRecord>> RegisterAndLoad(Catalog& catalog, const std::string& name,
                                                  const Result<SourceScan>& scan) {
  if (!scan.ok()) return scan.status();
  if (!scan->unreadable.empty()) {
    return Status::Internal(fmt::format("bench data has problems: {}", scan->unreadable.front()));
  }
  Result<RegisterReport> r = catalog.Register(
      {name, scan->default_prepare, scan->classes, scan->description}, *scan, false);
  if (!r.ok()) return r.status();
  Result<std::vector<SampleRecord>> recs = catalog.GetSamples(r->info.ids);
  if (!recs.ok()) return recs.status();
  auto image = [](const SampleRecord& r) {
    return r.source == "tar" ? r.member : fs::path(r.path).filename().string();
  };
  std::sort(recs->begin(), recs->end(),
            [&](const SampleRecord& a, const SampleRecord& b) { return image(a) < image(b); });
  return recs;
}

// One pass over every record on `threads` threads; returns items/s, or 0 on a failed sample.
double Pass(const std::vector<SampleRecord>& recs, const PrepareSpec* spec, unsigned threads,
            std::atomic<bool>* failed) {
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < recs.size(); i = next++) {
      Result<std::vector<uint8_t>> bytes = ReadSample(recs[i]);
      bool ok = bytes.ok() && (spec == nullptr || PrepareSample(*spec, *bytes).ok());
      if (!ok) *failed = true;
    }
  };
  Clock::time_point start = Clock::now();
  std::vector<std::future<void>> workers;
  for (unsigned t = 0; t < threads; ++t) workers.push_back(std::async(std::launch::async, worker));
  for (auto& w : workers) w.get();
  return recs.size() / std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int DatasetBenchTar(int argc, char** argv) {
  uint64_t count = 3000, shard_size = 500;
  unsigned threads = 0, passes = 5;
  std::string base = fs::temp_directory_path().string(), prepare = "resize=256,crop=256";
  bool keep = false, quiet = false, tar = false;
  po::options_description opts("carpool dataset bench --tar [options]");
  opts.add_options()("help,h", "show this help")("tar", po::bool_switch(&tar), "this benchmark")(
      "count", po::value(&count)->default_value(count), "images (500x375 JPEGs, quality 90)")(
      "shard-size", po::value(&shard_size)->default_value(shard_size), "images per tar shard")(
      "threads", po::value(&threads), "preparation threads (default: all cores)")(
      "passes", po::value(&passes)->default_value(passes), "timed passes per source")(
      "prepare", po::value(&prepare)->default_value(prepare), "prepare spec")(
      "dir", po::value(&base)->default_value(base), "where to write the images")(
      "keep", po::bool_switch(&keep), "keep the images")("quiet,q", po::bool_switch(&quiet),
                                                        "no progress bar");
  po::variables_map vm;
  if (std::optional<int> rc = ParseVerbArgs("bench", argc, argv, opts, {}, &vm)) return *rc;
  Result<PrepareSpec> spec = ParsePrepareSpec(prepare);
  if (!spec.ok()) return UsageError("bench", spec.status().message());
  if (count == 0 || shard_size == 0 || passes == 0) {
    return UsageError("bench", "--count, --shard-size and --passes must be >= 1");
  }
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  std::string tmpl = (fs::path(base) / "carpool-bench-tar-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return Fail("bench", Status::IOError(fmt::format("cannot create a temp dir in \"{}\"", base)));
  }
  fs::path root = tmpl;
  auto finish = [&](int rc) {
    std::error_code ec;
    if (!keep) fs::remove_all(root, ec);
    if (keep) fmt::print("kept {}\n", root.string());
    return rc;
  };
  SynthSpec synth;
  ProgressBar bar(quiet);
  Result<uint64_t> bytes = WriteSynthetic(root / "folder", synth, count, 0, 0, &bar);
  if (bytes.ok()) bytes = WriteSynthetic(root / "shards", synth, count, shard_size, 0, &bar);
  if (!bytes.ok()) return finish(Fail("bench", bytes.status()));
  Result<std::unique_ptr<Catalog>> catalog = Catalog::Open(root);
  if (!catalog.ok()) return finish(Fail("bench", catalog.status()));
  Source folder{"folder (--dir)", {}}, shards{"tar shards (--tar)", {}};
  Result<std::vector<SampleRecord>> recs =
      RegisterAndLoad(**catalog, "folder", ScanImageDir(root / "folder", nullptr));
  if (recs.ok()) folder.records = std::move(*recs);
  if (recs.ok()) {
    recs = RegisterAndLoad(**catalog, "shards",
                           ScanTarShards({(root / "shards" / "train-*.tar").string()}, nullptr));
  }
  if (recs.ok()) shards.records = std::move(*recs);
  if (!recs.ok()) return finish(Fail("bench", recs.status()));
  // The same images: byte-identical samples, pairwise.
  if (folder.records.size() != count || shards.records.size() != count) {
    return finish(Fail("bench", Status::Internal("the two sources registered different counts")));
  }
  for (size_t i = 0; i < count; i += std::max<uint64_t>(1, count / 64)) {
    if (*ReadSample(folder.records[i]) != *ReadSample(shards.records[i])) {
      return finish(Fail("bench", Status::Internal(fmt::format(
                                      "image {} differs between folder and shard", i))));
    }
  }
  std::atomic<bool> failed{false};
  Pass(folder.records, &*spec, threads, &failed);  // warm-up: page cache, decoder state
  Pass(shards.records, &*spec, threads, &failed);
  for (unsigned p = 0; p < passes; ++p) {
    for (Source* s : {&folder, &shards}) {
      s->best_prepare = std::max(s->best_prepare, Pass(s->records, &*spec, threads, &failed));
      s->best_read = std::max(s->best_read, Pass(s->records, nullptr, threads, &failed));
    }
  }
  if (failed) return finish(Fail("bench", Status::Internal("a sample failed to read or prepare")));
  fmt::print(
      "{} images, {:.1f} KiB average JPEG, {} shards of {}; prepare {}; {} threads ({} cores); "
      "best of {} alternating passes, warm page cache\n\n",
      count, *bytes / 1024.0 / count, (count + shard_size - 1) / shard_size, shard_size,
      spec->ToString(), threads, std::thread::hardware_concurrency(), passes);
  fmt::print("| {:<20} | {:>14} | {:>14} |\n", "source", "prepare img/s", "read-only img/s");
  fmt::print("|{:-<22}|{:->16}|{:->16}|\n", "", ":", ":");
  for (const Source* s : {&folder, &shards}) {
    fmt::print("| {:<20} | {:>14.0f} | {:>14.0f} |\n", s->name, s->best_prepare, s->best_read);
  }
  double ratio = shards.best_prepare / folder.best_prepare;
  fmt::print("\nprepare throughput, shards / folder: {:.3f} ({} the within-10% goal); read-only "
             "{:.3f}\n",
             ratio, ratio >= 0.9 ? "meets" : "MISSES", shards.best_read / folder.best_read);
  return finish(0);
}

}  // namespace carpool::tools
