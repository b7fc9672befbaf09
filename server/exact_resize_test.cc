#include "server/exact_resize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <random>
#include <vector>

#include "server/prepare.h"
#include "server/test_images.h"

namespace carpool {
namespace {

ResizeCropGeometry Plain(int sw, int sh, int rw, int rh) {
  return {sw, sh, rw, rh, 0, 0, rw, rh};
}

std::vector<uint8_t> Resize(const cv::Mat& src, const ResizeCropGeometry& g) {
  std::vector<uint8_t> out(static_cast<size_t>(g.out_width) * g.out_height * src.channels());
  ExactResizeCrop(g, src.data, src.step, src.channels(), out.data());
  return out;
}

// The definition, written apart from the header: each output pixel the area-weighted mean of the
// source pixels its footprint covers, in double precision, rounded half up.
double AreaMean(const cv::Mat& src, const ResizeCropGeometry& g, int ox, int oy, int c) {
  const double sx = static_cast<double>(g.src_width) / g.resized_width;
  const double sy = static_cast<double>(g.src_height) / g.resized_height;
  const double x0 = (ox + g.crop_x) * sx, x1 = x0 + sx, y0 = (oy + g.crop_y) * sy, y1 = y0 + sy;
  double sum = 0;
  for (int j = static_cast<int>(std::floor(y0)); j < y1 && j < src.rows; ++j) {
    const double wy = std::min<double>(y1, j + 1) - std::max<double>(y0, j);
    for (int i = static_cast<int>(std::floor(x0)); i < x1 && i < src.cols; ++i) {
      const double wx = std::min<double>(x1, i + 1) - std::max<double>(x0, i);
      sum += wx * wy * src.ptr<uint8_t>(j)[i * src.channels() + c];
    }
  }
  return sum / (sx * sy);
}

TEST(ExactResizeTest, AConstantImageStaysConstant) {
  for (auto [sw, sh, rw, rh] : {std::array{500, 375, 341, 256}, std::array{7, 5, 13, 11},
                                std::array{256, 256, 256, 256}, std::array{1000, 3, 17, 2}}) {
    cv::Mat src(sh, sw, CV_8UC3, cv::Scalar(200, 7, 255));
    const std::vector<uint8_t> out = Resize(src, Plain(sw, sh, rw, rh));
    for (size_t k = 0; k < out.size(); k += 3) {
      ASSERT_EQ(out[k], 200);
      ASSERT_EQ(out[k + 1], 7);
      ASSERT_EQ(out[k + 2], 255);
    }
  }
}

TEST(ExactResizeTest, AnIntegerShrinkIsTheBlockMeanRoundedHalfUp) {
  cv::Mat src(4, 4, CV_8UC1);
  const uint8_t values[16] = {0, 1, 10, 10, 0, 0, 10, 11, 255, 254, 3, 4, 255, 255, 5, 6};
  std::copy(values, values + 16, src.data);
  const std::vector<uint8_t> out = Resize(src, Plain(4, 4, 2, 2));
  // (0+1+0+0)/4 = 0.25 -> 0; (10+10+10+11)/4 = 10.25 -> 10; 1019/4 = 254.75 -> 255; 18/4 = 4.5 -> 5
  EXPECT_EQ(out, (std::vector<uint8_t>{0, 10, 255, 5}));
}

// Against the definition in floating point: equal except where double rounding lands on the
// other side of a .5 (at most 1 level, and rarely).
TEST(ExactResizeTest, EqualsTheAreaMeanOverShrinksAndEnlargements) {
  const cv::Mat photo = MakePhoto(123, 77, 3);
  for (auto [rw, rh] : {std::pair{41, 26}, std::pair{100, 63}, std::pair{123, 77},
                        std::pair{200, 125}, std::pair{7, 5}}) {
    const ResizeCropGeometry g = Plain(photo.cols, photo.rows, rw, rh);
    const std::vector<uint8_t> out = Resize(photo, g);
    int off_by_one = 0;
    for (int y = 0; y < rh; ++y) {
      for (int x = 0; x < rw; ++x) {
        for (int c = 0; c < 3; ++c) {
          const double want = std::floor(AreaMean(photo, g, x, y, c) + 0.5);
          const int got = out[(static_cast<size_t>(y) * rw + x) * 3 + c];
          ASSERT_LE(std::abs(got - want), 1.0) << rw << "x" << rh << " at " << x << "," << y;
          off_by_one += got != want;
        }
      }
    }
    EXPECT_LE(off_by_one, rw * rh * 3 / 1000 + 1) << rw << "x" << rh;
  }
}

// Shrinking, it is what OpenCV's INTER_AREA computes in floating point, within one level.
TEST(ExactResizeTest, ShrinkingIsOpenCvAreaWithinOneLevel) {
  const cv::Mat photo = MakePhoto(500, 375, 9);
  cv::Mat area;
  cv::resize(photo, area, cv::Size(341, 256), 0, 0, cv::INTER_AREA);
  const std::vector<uint8_t> out = Resize(photo, Plain(500, 375, 341, 256));
  const cv::Mat ours(256, 341, CV_8UC3, const_cast<uint8_t*>(out.data()));
  EXPECT_LE(cv::norm(ours, area, cv::NORM_INF), 1.0);
}

// The crop window is the same pixels as resizing everything and cutting the window out.
TEST(ExactResizeTest, TheCropIsAWindowOfTheWholeResize) {
  const cv::Mat photo = MakePhoto(333, 250, 5);
  const ResizeCropGeometry whole = Plain(333, 250, 300, 225);
  const std::vector<uint8_t> all = Resize(photo, whole);
  ResizeCropGeometry cropped = whole;
  cropped.crop_x = 38;
  cropped.crop_y = 12;
  cropped.out_width = cropped.out_height = 200;
  const std::vector<uint8_t> window = Resize(photo, cropped);
  for (int y = 0; y < 200; ++y) {
    for (int x = 0; x < 200 * 3; ++x) {
      ASSERT_EQ(window[static_cast<size_t>(y) * 600 + x],
                all[(static_cast<size_t>(y) + 12) * 900 + 38 * 3 + x]);
    }
  }
}

TEST(ExactResizeTest, ResizeCropForFollowsThePrepareSpec) {
  PrepareSpec spec;
  spec.resize = 256;
  spec.crop = 224;
  Result<ResizeCropGeometry> g = ResizeCropFor(spec, 500, 375);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->resized_width, 341);  // 500 * 256 / 375 = 341.33
  EXPECT_EQ(g->resized_height, 256);
  EXPECT_EQ(g->crop_x, (341 - 224) / 2);
  EXPECT_EQ(g->crop_y, 16);
  EXPECT_EQ(g->out_width, 224);
  spec.crop = 300;
  EXPECT_EQ(ResizeCropFor(spec, 500, 375).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace carpool
