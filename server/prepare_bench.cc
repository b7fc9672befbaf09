// Preparation and transform throughput on one thread, each against a baseline in the same run:
//  - prepare (reduced-resolution JPEG decode when it applies) vs full decode + INTER_AREA resize;
//  - the one-pass transform vs the same steps done as separate OpenCV passes.
// Usage: carpool_prepare_bench [images=64] [min_seconds_per_case=1.0]
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <random>
#include <string>
#include <vector>

#include "server/image_codec.h"
#include "server/prepare.h"
#include "server/transform.h"

namespace carpool {
namespace {

// 500x375 photo-like JPEG at quality 90: gradients, hard-edged shapes and noise.
std::vector<uint8_t> MakeJpeg(uint32_t seed) {
  constexpr int kWidth = 500;
  constexpr int kHeight = 375;
  cv::Mat image(kHeight, kWidth, CV_8UC3);
  std::mt19937 rng(seed);
  const double phase = rng() % 100;
  for (int y = 0; y < kHeight; ++y) {
    for (int x = 0; x < kWidth; ++x) {
      image.at<cv::Vec3b>(y, x) =
          cv::Vec3b(static_cast<uint8_t>(255 * x / kWidth), static_cast<uint8_t>(255 * y / kHeight),
                    static_cast<uint8_t>(128 + 100 * std::sin((x + phase) * 0.05)));
    }
  }
  for (int i = 0; i < 20; ++i) {
    const cv::Point a(static_cast<int>(rng() % kWidth), static_cast<int>(rng() % kHeight));
    const cv::Scalar color(rng() % 256, rng() % 256, rng() % 256);
    cv::ellipse(image, a, cv::Size(10 + rng() % 60, 10 + rng() % 40), rng() % 180, 0, 360, color,
                cv::FILLED, cv::LINE_AA);
  }
  cv::Mat noise(kHeight, kWidth, CV_8UC3);
  cv::theRNG().state = seed;
  cv::randn(noise, cv::Scalar::all(0), cv::Scalar::all(8));
  cv::add(image, noise, image);
  Result<std::vector<uint8_t>> out = EncodeJpeg(image, ChannelOrder::kBgr, {.quality = 90});
  if (!out.ok()) std::abort();
  return *out;
}

// Times one pass of op over every input, alternating baseline and candidate passes until both
// have run min_seconds; returns the best pass rate (items/s) of each. Alternating and taking the
// best pass keep the ratio fair on a machine that other work shares.
struct Rates {
  double base = 0;
  double ours = 0;
};
Rates Compare(size_t inputs, double min_seconds, const std::function<void(size_t)>& base,
              const std::function<void(size_t)>& ours) {
  using Clock = std::chrono::steady_clock;
  Rates best;
  double spent[2] = {0, 0};
  for (int pass = 0; spent[0] < min_seconds || spent[1] < min_seconds; ++pass) {
    const int which = pass % 2;
    const auto& op = which == 0 ? base : ours;
    if (!op) {
      spent[which] = min_seconds;
      continue;
    }
    const auto start = Clock::now();
    for (size_t i = 0; i < inputs; ++i) op(i);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (pass >= 2) {  // the first pass of each is a warm-up
      double& rate = which == 0 ? best.base : best.ours;
      rate = std::max(rate, static_cast<double>(inputs) / seconds);
      spent[which] += seconds;
    }
  }
  return best;
}

// The baseline preparation: full-resolution RGB decode, INTER_AREA resize, crop.
void FullDecodePrepare(const std::vector<uint8_t>& jpeg, const PrepareSpec& spec, uint8_t* dst) {
  Result<cv::Mat> decoded = DecodeJpeg(jpeg, 3);
  if (!decoded.ok()) std::abort();
  const cv::Mat& image = *decoded;
  const double scale = static_cast<double>(spec.resize) / std::min(image.cols, image.rows);
  cv::Mat resized;
  cv::resize(image, resized,
             cv::Size(static_cast<int>(std::lround(image.cols * scale)),
                      static_cast<int>(std::lround(image.rows * scale))),
             0, 0, cv::INTER_AREA);
  cv::Mat out(spec.crop, spec.crop, CV_8UC3, dst);
  resized(cv::Rect((resized.cols - spec.crop) / 2, (resized.rows - spec.crop) / 2, spec.crop,
                   spec.crop))
      .copyTo(out);
}

// The baseline transform: the same steps as separate OpenCV passes (crop view, flip, convert,
// normalize per channel, split into planes).
void MultiPassTransform(const TransformSpec& spec, const PreparedView& src, uint64_t seed,
                        float* dst) {
  const CropWindow w = DrawCropWindow(spec, src.shape, seed);
  const cv::Mat image(src.shape.height, src.shape.width, CV_8UC3, const_cast<uint8_t*>(src.data));
  cv::Mat window = image(cv::Rect(w.x, w.y, w.width, w.height));
  cv::Mat flipped;
  if (w.flip) {
    cv::flip(window, flipped, 1);
  } else {
    flipped = window;
  }
  cv::Mat unit;
  flipped.convertTo(unit, CV_32FC3, 1.0 / 255);
  unit = (unit - cv::Scalar(spec.mean[0], spec.mean[1], spec.mean[2])) /
         cv::Scalar(spec.std[0], spec.std[1], spec.std[2]);
  std::vector<cv::Mat> planes;
  for (int c = 0; c < 3; ++c)
    planes.emplace_back(w.height, w.width, CV_32F, dst + c * w.height * w.width);
  cv::split(unit, planes);
}

int Main(int argc, char** argv) {
  const size_t count = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 64;
  const double min_seconds = argc > 2 ? std::strtod(argv[2], nullptr) : 1.0;
  cv::setNumThreads(1);  // per-worker figures: the server runs one decode per worker thread
  std::vector<std::vector<uint8_t>> jpegs;
  size_t total_bytes = 0;
  for (size_t i = 0; i < count; ++i) {
    jpegs.push_back(MakeJpeg(static_cast<uint32_t>(i + 1)));
    total_bytes += jpegs.back().size();
  }
  fmt::print(
      "{} JPEGs of 500x375, quality 90, mean {:.1f} KiB; one thread, best pass of >= {} s per "
      "side, alternating\n\n",
      count, total_bytes / 1024.0 / count, min_seconds);

  fmt::print(
      "| target | JPEG reduction | full decode + resize (img/s) | carpool prepare (img/s) | "
      "speedup |\n");
  fmt::print("|---|---|---|---|---|\n");
  for (int side : {256, 128, 64}) {
    PrepareSpec spec;
    spec.resize = spec.crop = side;
    std::vector<uint8_t> dst(static_cast<size_t>(side) * side * 3);
    const Rates r = Compare(
        jpegs.size(), min_seconds, [&](size_t i) { FullDecodePrepare(jpegs[i], spec, dst.data()); },
        [&](size_t i) {
          if (!PrepareInto(spec, jpegs[i], dst).ok()) std::abort();
        });
    fmt::print("| resize={0},crop={0} | 1/{1} | {2:.0f} | {3:.0f} | {4:.2f}x |\n", side,
               ReducedDecodeFactor(spec, 500, 375), r.base, r.ours, r.ours / r.base);
  }

  PrepareSpec spec256;
  spec256.resize = spec256.crop = 256;
  std::vector<PreparedImage> prepared;
  for (const auto& jpeg : jpegs) prepared.push_back(*PrepareSample(spec256, jpeg));
  fmt::print(
      "\n| transform (256x256x3 in) | multi-pass OpenCV (img/s) | carpool one pass (img/s) | "
      "speedup |\n");
  fmt::print("|---|---|---|---|\n");
  for (const char* text :
       {"random_crop(224)|flip|normalize(imagenet)|float32|nchw",
        "random_crop(224)|flip|normalize(imagenet)|float16|nchw",
        "random_crop(224)|flip|normalize(imagenet)|float32|nhwc",
        "random_crop(224)|flip|uint8|nhwc", "random_crop(224)|flip|uint8|nchw"}) {
    const TransformSpec spec = *ParseTransformSpec(text);
    std::vector<float> out(3 * 224 * 224);
    uint64_t seed = 0;
    std::function<void(size_t)> base;
    if (spec.dtype == DType::kFloat32) {
      base = [&](size_t i) { MultiPassTransform(spec, prepared[i].view(), ++seed, out.data()); };
    }
    const Rates r = Compare(prepared.size(), min_seconds, base, [&](size_t i) {
      if (!ApplyTransform(spec, prepared[i].view(), ++seed, out.data()).ok()) std::abort();
    });
    std::string cell;  // markdown needs the '|' of the transform text escaped
    for (const char* p = text; *p != '\0'; ++p) {
      if (*p == '|') cell += '\\';
      cell += *p;
    }
    if (r.base > 0) {
      fmt::print("| `{}` | {:.0f} | {:.0f} | {:.2f}x |\n", cell, r.base, r.ours, r.ours / r.base);
    } else {
      fmt::print("| `{}` | - | {:.0f} | - |\n", cell, r.ours);
    }
  }
  return 0;
}

}  // namespace
}  // namespace carpool

int main(int argc, char** argv) { return carpool::Main(argc, argv); }
