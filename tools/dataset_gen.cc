// `carpool dataset gen`: deterministic synthetic JPEGs in image-folder layout, or the same JPEGs
// as WebDataset tar shards. Each image has a smooth background, shapes with hard and anti-aliased
// edges, and sensor-like noise, so that its JPEG size (about 40-60 KB at 500x375, quality 90) and
// decode cost resemble a photo's.
#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <future>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/splitmix.h"

#include "datasets/tar_shards.h"
#include "server/image_codec.h"
#include "tools/dataset_cmd.h"

namespace carpool::tools {

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

struct GenArgs {
  std::string dir, size = "500x375";
  uint64_t count = 0, seed = 0, shard_size = 1000;
  int classes = 10, quality = 90;
  unsigned threads = 0;
  bool quiet = false, tar = false;
};

cv::Scalar RandomColor(cv::RNG& rng) {
  return cv::Scalar(rng.uniform(0, 256), rng.uniform(0, 256), rng.uniform(0, 256));
}

// Image `index` of class `label`; depends only on (seed, index).
cv::Mat Synthesize(int width, int height, int label, uint64_t seed, uint64_t index) {
  cv::RNG rng(SplitMix64(seed ^ SplitMix64(index)));
  // Smooth regions: a coarse random grid tinted by class, upsampled bicubically.
  cv::Mat coarse(4 + label % 3, 5 + label % 4, CV_8UC3);
  rng.fill(coarse, cv::RNG::UNIFORM, cv::Scalar::all(30), cv::Scalar::all(226));
  coarse += cv::Scalar(17 * label % 60, 31 * label % 60, 53 * label % 60);
  cv::Mat img;
  cv::resize(coarse, img, cv::Size(width, height), 0, 0, cv::INTER_CUBIC);
  // Edges: filled shapes and lines.
  int shapes = rng.uniform(6, 14);
  for (int s = 0; s < shapes; ++s) {
    cv::Point c(rng.uniform(0, width), rng.uniform(0, height));
    int r = rng.uniform(8, std::max(9, std::min(width, height) / 4));
    int line = rng.uniform(0, 2) ? cv::LINE_AA : cv::LINE_8;
    switch (rng.uniform(0, 4)) {
      case 0:
        cv::circle(img, c, r, RandomColor(rng), cv::FILLED, line);
        break;
      case 1:
        cv::ellipse(img, c, cv::Size(r, r / 2 + 1), rng.uniform(0, 180), 0, 360, RandomColor(rng),
                    cv::FILLED, line);
        break;
      case 2:
        cv::rectangle(img, cv::Rect(c.x, c.y, r, r * 2 / 3 + 1), RandomColor(rng), cv::FILLED);
        break;
      default:
        cv::line(img, c, cv::Point(rng.uniform(0, width), rng.uniform(0, height)), RandomColor(rng),
                 rng.uniform(1, 5), line);
    }
  }
  // Texture and noise: high-frequency content that JPEG cannot drop at quality 90.
  cv::Mat noise(img.size(), CV_16SC3);
  rng.fill(noise, cv::RNG::NORMAL, cv::Scalar::all(0), cv::Scalar::all(6));
  cv::Mat out;
  img.convertTo(out, CV_16SC3);
  out += noise;
  out.convertTo(img, CV_8UC3);
  return img;
}

bool ParseSize(const std::string& text, int* w, int* h) {
  return std::sscanf(text.c_str(), "%dx%d", w, h) == 2 && *w > 0 && *h > 0 && *w <= 8192 &&
         *h <= 8192 && text == fmt::format("{}x{}", *w, *h);
}

Status WriteFile(const fs::path& file, std::span<const uint8_t> bytes) {
  std::FILE* f = std::fopen(file.c_str(), "wb");
  bool ok = f != nullptr && std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (f != nullptr) ok = std::fclose(f) == 0 && ok;
  if (ok) return Status::OK();
  return Status::IOError(
      fmt::format("cannot write \"{}\"; check free space and permissions", file.string()));
}

// Unit `u` of the output: image u (folder layout), or shard u of images [u * N, (u + 1) * N).
Result<uint64_t> WriteUnit(const fs::path& dir, const SynthSpec& spec, uint64_t count,
                           uint64_t shard_size, uint64_t u) {
  if (shard_size == 0) {
    Result<std::vector<uint8_t>> jpeg = SynthesizeJpeg(spec, u);
    if (!jpeg.ok()) return jpeg.status();
    Status s = WriteFile(dir / SynthClassDir(spec, u) / fmt::format("{}.jpg", SynthKey(u)), *jpeg);
    if (!s.ok()) return s;
    return jpeg->size();
  }
  TarShardWriter shard;
  uint64_t bytes = 0;
  for (uint64_t i = u * shard_size; i < std::min(count, (u + 1) * shard_size); ++i) {
    Result<std::vector<uint8_t>> jpeg = SynthesizeJpeg(spec, i);
    if (!jpeg.ok()) return jpeg.status();
    std::string label = std::to_string(i % static_cast<uint64_t>(spec.classes));
    Status s = shard.Add(SynthKey(i) + ".jpg", *jpeg);
    if (s.ok()) s = shard.Add(SynthKey(i) + ".cls", std::span(reinterpret_cast<const uint8_t*>(
                                                                  label.data()), label.size()));
    if (!s.ok()) return s;
    bytes += jpeg->size();
  }
  Status s = WriteFile(dir / SynthShardName(u), shard.Finish());
  if (!s.ok()) return s;
  return bytes;
}

}  // namespace

std::string SynthKey(uint64_t index) { return fmt::format("img_{:08}", index); }
std::string SynthClassDir(const SynthSpec& spec, uint64_t index) {
  return fmt::format("class_{:03}", index % static_cast<uint64_t>(spec.classes));
}
std::string SynthShardName(uint64_t shard) { return fmt::format("train-{:06}.tar", shard); }

Result<std::vector<uint8_t>> SynthesizeJpeg(const SynthSpec& spec, uint64_t index) {
  int label = static_cast<int>(index % static_cast<uint64_t>(spec.classes));
  cv::Mat img = Synthesize(spec.width, spec.height, label, spec.seed, index);
  // TurboJPEG with imgcodecs' settings (4:2:0, accurate DCT): the bytes cv::imencode wrote.
  return EncodeJpeg(img, ChannelOrder::kBgr, {.quality = spec.quality});
}

Result<uint64_t> WriteSynthetic(const fs::path& dir, const SynthSpec& spec, uint64_t count,
                                uint64_t shard_size, unsigned threads, ProgressBar* bar) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  for (int c = 0; shard_size == 0 && c < spec.classes && !ec; ++c) {
    fs::create_directories(dir / SynthClassDir(spec, static_cast<uint64_t>(c)), ec);
  }
  if (ec) {
    return Status::IOError(fmt::format("cannot create folders in \"{}\": {}; pass a writable DIR",
                                       dir.string(), ec.message()));
  }
  const uint64_t units = shard_size == 0 ? count : (count + shard_size - 1) / shard_size;
  std::atomic<uint64_t> next{0}, done{0}, bytes{0};
  std::atomic<bool> failed{false};
  Status failure;  // written once, by the worker that sets `failed`
  auto worker = [&] {
    for (uint64_t u = next++; u < units && !failed; u = next++) {
      Result<uint64_t> wrote = WriteUnit(dir, spec, count, shard_size, u);
      if (!wrote.ok() && !failed.exchange(true)) failure = wrote.status();
      bytes += wrote.ok() ? *wrote : 0;
      done += shard_size == 0 ? 1 : std::min(shard_size, count - u * shard_size);
    }
  };
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::future<void>> workers;
  for (unsigned t = 0; t < threads; ++t) workers.push_back(std::async(std::launch::async, worker));
  for (auto& w : workers) {
    while (w.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      if (bar != nullptr) bar->Update("generating", done.load(), count);
    }
  }
  if (bar != nullptr) {
    bar->Update("generating", done.load(), count);
    bar->Done();
  }
  if (failed) return failure;
  return bytes.load();
}

int DatasetGen(int argc, char** argv) {
  GenArgs a;
  po::options_description opts("carpool dataset gen DIR --count N [options]");
  opts.add_options()("help,h", "show this help")("count", po::value(&a.count), "images to write")(
      "size", po::value(&a.size)->default_value(a.size), "WIDTHxHEIGHT")(
      "classes", po::value(&a.classes)->default_value(a.classes), "class folders")(
      "seed", po::value(&a.seed)->default_value(a.seed), "random seed")(
      "quality", po::value(&a.quality)->default_value(a.quality), "JPEG quality")(
      "tar", po::bool_switch(&a.tar),
      "write tar shards DIR/train-NNNNNN.tar (members img_N.jpg, img_N.cls) instead of folders")(
      "shard-size", po::value(&a.shard_size)->default_value(a.shard_size), "with --tar: images "
      "per shard")("threads", po::value(&a.threads), "worker threads (default: all cores)")(
      "quiet,q", po::bool_switch(&a.quiet), "no progress bar")("dir", po::value(&a.dir),
                                                               "output folder (positional)");
  po::positional_options_description pos;
  pos.add("dir", 1);
  po::variables_map vm;
  if (std::optional<int> rc = ParseVerbArgs("gen", argc, argv, opts, pos, &vm)) return *rc;
  std::string error;
  SynthSpec spec{.classes = a.classes, .quality = a.quality, .seed = a.seed};
  if (error.empty() && a.dir.empty()) error = "missing output DIR";
  if (error.empty() && a.count == 0) error = "--count N (N >= 1) is required";
  if (error.empty() && !ParseSize(a.size, &spec.width, &spec.height)) {
    error = fmt::format("--size \"{}\" is not WIDTHxHEIGHT, e.g. 500x375", a.size);
  }
  if (error.empty() && (a.classes < 1 || a.classes > 100000)) {
    error = fmt::format("--classes {} is not in [1, 100000]", a.classes);
  }
  if (error.empty() && (a.quality < 1 || a.quality > 100)) {
    error = fmt::format("--quality {} is not in [1, 100]", a.quality);
  }
  if (error.empty() && a.tar && a.shard_size == 0) error = "--shard-size N needs N >= 1";
  if (!error.empty()) return UsageError("gen", error);
  ProgressBar bar(a.quiet);
  Result<uint64_t> bytes = WriteSynthetic(a.dir, spec, a.count, a.tar ? a.shard_size : 0,
                                          a.threads, &bar);
  if (!bytes.ok()) return Fail("gen", bytes.status());
  fmt::print("wrote {} JPEGs ({}x{}, quality {}, {} classes, seed {}) to {}: {:.1f} KB average\n",
             a.count, spec.width, spec.height, a.quality, a.classes, a.seed, a.dir,
             *bytes / 1024.0 / a.count);
  if (a.tar) {
    uint64_t shards = (a.count + a.shard_size - 1) / a.shard_size;
    fmt::print("as {} tar shards; register them with: carpool dataset add NAME --tar '{}/{}'\n",
               shards, a.dir, shards == 1 ? SynthShardName(0)
                                          : fmt::format("train-{{000000..{:06}}}.tar", shards - 1));
  }
  return 0;
}

}  // namespace carpool::tools
