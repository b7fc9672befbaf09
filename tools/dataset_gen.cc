// `carpool dataset gen`: deterministic synthetic JPEGs in image-folder layout. Each image has a
// smooth background, shapes with hard and anti-aliased edges, and sensor-like noise, so that its
// JPEG size (about 40-60 KB at 500x375, quality 90) and decode cost resemble a photo's.
#include <fmt/core.h>

#include <atomic>
#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <future>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <string>
#include <thread>
#include <vector>

#include "carpool/splitmix.h"

#include "server/image_codec.h"
#include "tools/dataset_cmd.h"

namespace carpool::tools {

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

struct GenArgs {
  std::string dir, size = "500x375";
  uint64_t count = 0, seed = 0;
  int classes = 10, quality = 90;
  unsigned threads = 0;
  bool quiet = false;
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

}  // namespace

int DatasetGen(int argc, char** argv) {
  GenArgs a;
  po::options_description opts("carpool dataset gen DIR --count N [options]");
  opts.add_options()("help,h", "show this help")("count", po::value(&a.count), "images to write")(
      "size", po::value(&a.size)->default_value(a.size), "WIDTHxHEIGHT")(
      "classes", po::value(&a.classes)->default_value(a.classes), "class folders")(
      "seed", po::value(&a.seed)->default_value(a.seed), "random seed")(
      "quality", po::value(&a.quality)->default_value(a.quality), "JPEG quality")(
      "threads", po::value(&a.threads), "worker threads (default: all cores)")(
      "quiet,q", po::bool_switch(&a.quiet), "no progress bar")("dir", po::value(&a.dir),
                                                               "output folder (positional)");
  po::positional_options_description pos;
  pos.add("dir", 1);
  po::variables_map vm;
  if (std::optional<int> rc = ParseVerbArgs("gen", argc, argv, opts, pos, &vm)) return *rc;
  std::string error;
  int width = 0, height = 0;
  if (error.empty() && a.dir.empty()) error = "missing output DIR";
  if (error.empty() && a.count == 0) error = "--count N (N >= 1) is required";
  if (error.empty() && !ParseSize(a.size, &width, &height)) {
    error = fmt::format("--size \"{}\" is not WIDTHxHEIGHT, e.g. 500x375", a.size);
  }
  if (error.empty() && (a.classes < 1 || a.classes > 100000)) {
    error = fmt::format("--classes {} is not in [1, 100000]", a.classes);
  }
  if (error.empty() && (a.quality < 1 || a.quality > 100)) {
    error = fmt::format("--quality {} is not in [1, 100]", a.quality);
  }
  if (!error.empty()) return UsageError("gen", error);
  std::error_code ec;
  for (int c = 0; c < a.classes && !ec; ++c) {
    fs::create_directories(fs::path(a.dir) / fmt::format("class_{:03}", c), ec);
  }
  if (ec) {
    return Fail("gen", Status::IOError(
                           fmt::format("cannot create folders in \"{}\": {}; pass a writable DIR",
                                       a.dir, ec.message())));
  }
  std::atomic<uint64_t> next{0}, done{0}, bytes{0};
  std::atomic<bool> failed{false};
  Status failure;  // written once, by the worker that sets `failed`
  auto worker = [&] {
    for (uint64_t i = next++; i < a.count && !failed; i = next++) {
      int label = static_cast<int>(i % a.classes);
      cv::Mat img = Synthesize(width, height, label, a.seed, i);
      // TurboJPEG with imgcodecs' settings (4:2:0, accurate DCT): the bytes cv::imencode wrote.
      Result<std::vector<uint8_t>> jpeg =
          EncodeJpeg(img, ChannelOrder::kBgr, {.quality = a.quality});
      fs::path file =
          fs::path(a.dir) / fmt::format("class_{:03}", label) / fmt::format("img_{:08}.jpg", i);
      std::FILE* f = jpeg.ok() ? std::fopen(file.c_str(), "wb") : nullptr;
      bool ok = f != nullptr && std::fwrite(jpeg->data(), 1, jpeg->size(), f) == jpeg->size();
      if (f != nullptr) ok = std::fclose(f) == 0 && ok;
      if (!ok && !failed.exchange(true)) {
        failure = jpeg.ok()
                      ? Status::IOError(fmt::format(
                            "cannot write \"{}\"; check free space and permissions", file.string()))
                      : jpeg.status();
      }
      bytes += jpeg.ok() ? jpeg->size() : 0;
      ++done;
    }
  };
  unsigned threads = a.threads ? a.threads : std::max(1u, std::thread::hardware_concurrency());
  ProgressBar bar(a.quiet);
  std::vector<std::future<void>> workers;
  for (unsigned t = 0; t < threads; ++t) workers.push_back(std::async(std::launch::async, worker));
  for (auto& w : workers) {
    while (w.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      bar.Update("generating", done.load(), a.count);
      bar.Done();
    }
  }
  bar.Update("generating", done.load(), a.count);
  bar.Done();
  if (failed) return Fail("gen", failure);
  fmt::print("wrote {} JPEGs ({}x{}, quality {}, {} classes, seed {}) to {}: {:.1f} KB average\n",
             a.count, width, height, a.quality, a.classes, a.seed, a.dir,
             bytes.load() / 1024.0 / a.count);
  return 0;
}

}  // namespace carpool::tools
