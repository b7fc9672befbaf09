#include "server/area_resize.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <random>
#include <string>
#include <vector>

#include "server/test_images.h"

namespace carpool {
namespace {

// The reference: OpenCV's own INTER_AREA resize of the whole image, then the window.
std::vector<uint8_t> OpenCvResizeCrop(const cv::Mat& src, const ResizeCropGeometry& g) {
  cv::Mat resized;
  cv::resize(src, resized, cv::Size(g.resized_width, g.resized_height), 0, 0, cv::INTER_AREA);
  const cv::Mat window = resized(cv::Rect(g.crop_x, g.crop_y, g.out_width, g.out_height)).clone();
  return std::vector<uint8_t>(window.data, window.data + window.total() * window.elemSize());
}

// "" when equal, else where the first byte differs: a whole image in a failure helps no one.
std::string Difference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) {
    return "sizes " + std::to_string(got.size()) + " and " + std::to_string(want.size());
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return "byte " + std::to_string(i) + ": " + std::to_string(got[i]) + " against OpenCV's " +
             std::to_string(want[i]);
    }
  }
  return "";
}

// Reads the source from a buffer of exactly its bytes, rows `pad` bytes apart beyond their
// pixels (a decoder's step), the last row ending at the buffer's end: a read past the last pixel
// is a heap overflow for ASan and valgrind (cv::Mat's allocation has slack).
std::vector<uint8_t> AreaResize(const cv::Mat& src, const ResizeCropGeometry& g, size_t pad = 0) {
  const size_t row = static_cast<size_t>(src.cols) * src.channels();
  const size_t pitch = row + pad;
  auto pixels = std::make_unique<uint8_t[]>(pitch * (src.rows - 1) + row);
  for (int y = 0; y < src.rows; ++y) std::memcpy(pixels.get() + y * pitch, src.ptr(y), row);
  std::vector<uint8_t> out(static_cast<size_t>(g.out_width) * g.out_height * src.channels());
  AreaResizeCrop(g, pixels.get(), pitch, src.channels(), out.data());
  return out;
}

// Noise over the full byte range, so that every rounding and saturation case is reached.
cv::Mat Noise(int width, int height, int channels, uint32_t seed) {
  cv::Mat m(height, width, CV_MAKETYPE(CV_8U, channels));
  cv::RNG rng(seed);
  rng.fill(m, cv::RNG::UNIFORM, 0, 256);
  return m;
}

TEST(AreaResizeTest, PreparationGeometryEqualsOpenCvOnPhotos) {
  // 500x375 to 341x256, center crop 256: the benchmarks' JPEGs at resize=256,crop=256.
  const ResizeCropGeometry g{500, 375, 341, 256, 42, 0, 256, 256};
  ASSERT_TRUE(AreaResizeApplies(g, 3));
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    const cv::Mat photo = MakePhoto(500, 375, seed);
    ASSERT_EQ(Difference(AreaResize(photo, g), OpenCvResizeCrop(photo, g)), "") << "seed " << seed;
    cv::Mat gray;
    cv::cvtColor(photo, gray, cv::COLOR_BGR2GRAY);
    ASSERT_EQ(Difference(AreaResize(gray, g), OpenCvResizeCrop(gray, g)), "") << "gray " << seed;
  }
  // Portrait, and a window that is not centered.
  const ResizeCropGeometry portrait{375, 500, 256, 341, 0, 85, 256, 224};
  const cv::Mat photo = MakePhoto(375, 500, 9);
  EXPECT_EQ(Difference(AreaResize(photo, portrait), OpenCvResizeCrop(photo, portrait)), "");
}

TEST(AreaResizeTest, RandomGeometriesEqualOpenCvByteForByte) {
  std::mt19937 rng(20261129);
  int compared = 0, refused = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    const int channels = 1 + static_cast<int>(rng() % 4);
    const int sw = 1 + static_cast<int>(rng() % 300), sh = 1 + static_cast<int>(rng() % 300);
    const int rw = 1 + static_cast<int>(rng() % sw), rh = 1 + static_cast<int>(rng() % sh);
    const int ow = 1 + static_cast<int>(rng() % rw), oh = 1 + static_cast<int>(rng() % rh);
    const int cx = static_cast<int>(rng() % (rw - ow + 1));
    const int cy = static_cast<int>(rng() % (rh - oh + 1));
    const ResizeCropGeometry g{sw, sh, rw, rh, cx, cy, ow, oh};
    if (!AreaResizeApplies(g, channels)) {
      ++refused;  // a copy or an integer factor both ways: cv::resize does those
      continue;
    }
    const cv::Mat src = Noise(sw, sh, channels, static_cast<uint32_t>(trial));
    ASSERT_EQ(Difference(AreaResize(src, g), OpenCvResizeCrop(src, g)), "")
        << sw << "x" << sh << " -> " << rw << "x" << rh << " window " << ow << "x" << oh << " at ("
        << cx << "," << cy << "), " << channels << " channels";
    ++compared;
  }
  EXPECT_GT(compared, 1400);  // the refusals are rare: equal sizes or integer factors both ways
  EXPECT_LT(refused, 100);
}

TEST(AreaResizeTest, PaddedRowsAndWindowsAtEveryCorner) {
  std::mt19937 rng(7);
  for (int channels = 1; channels <= 4; ++channels) {
    const cv::Mat src = Noise(97, 61, channels, static_cast<uint32_t>(channels));
    const int rw = 41, rh = 29, ow = 17, oh = 11;
    for (const auto& [cx, cy] : {std::pair{0, 0}, {rw - ow, 0}, {0, rh - oh}, {rw - ow, rh - oh}}) {
      const ResizeCropGeometry g{97, 61, rw, rh, cx, cy, ow, oh};
      ASSERT_TRUE(AreaResizeApplies(g, channels));
      const std::vector<uint8_t> want = OpenCvResizeCrop(src, g);
      for (const size_t pad : {size_t{0}, size_t{1}, size_t{3}, size_t{13}, size_t{rng() % 64}}) {
        ASSERT_EQ(Difference(AreaResize(src, g, pad), want), "")
            << channels << " channels, window at (" << cx << "," << cy << "), pad " << pad;
      }
    }
  }
}

TEST(AreaResizeTest, LargeFactorsAndOneAxisUnscaled) {
  for (const ResizeCropGeometry& g : {ResizeCropGeometry{4000, 3000, 333, 250, 10, 0, 300, 250},
                                      ResizeCropGeometry{640, 480, 640, 256, 0, 0, 640, 256},
                                      ResizeCropGeometry{1001, 751, 7, 5, 0, 0, 7, 5},
                                      ResizeCropGeometry{300, 200, 299, 199, 1, 1, 297, 197}}) {
    ASSERT_TRUE(AreaResizeApplies(g, 3));
    const cv::Mat src = Noise(g.src_width, g.src_height, 3, 7);
    EXPECT_EQ(Difference(AreaResize(src, g), OpenCvResizeCrop(src, g)), "")
        << g.src_width << "x" << g.src_height << " -> " << g.resized_width << "x"
        << g.resized_height;
  }
}

TEST(AreaResizeTest, RefusesWhatOpenCvDoesOtherwise) {
  // Integer factors both ways (OpenCV's resizeAreaFast_), equal sizes (a copy), enlarging either
  // way (bilinear emulation), and windows outside the resized image.
  EXPECT_FALSE(AreaResizeApplies({400, 300, 200, 150, 0, 0, 200, 150}, 3));
  EXPECT_FALSE(AreaResizeApplies({400, 300, 400, 300, 0, 0, 400, 300}, 3));
  EXPECT_FALSE(AreaResizeApplies({400, 300, 500, 200, 0, 0, 500, 200}, 3));
  EXPECT_FALSE(AreaResizeApplies({400, 300, 300, 301, 0, 0, 300, 301}, 3));
  EXPECT_FALSE(AreaResizeApplies({400, 300, 300, 200, 1, 0, 300, 200}, 3));
  EXPECT_FALSE(AreaResizeApplies({400, 300, 300, 200, 0, 0, 0, 200}, 3));
  EXPECT_FALSE(AreaResizeApplies({400, 300, 300, 200, 0, 0, 300, 200}, 5));
  // An integer factor one way only is the general path in OpenCV too.
  EXPECT_TRUE(AreaResizeApplies({400, 300, 200, 200, 0, 0, 200, 200}, 3));
}

}  // namespace
}  // namespace carpool
