#include "server/test_images.h"

#include <algorithm>
#include <cmath>
#include <opencv2/imgproc.hpp>
#include <random>

namespace carpool {

cv::Mat MakePhoto(int width, int height, uint32_t seed) {
  cv::Mat image(height, width, CV_8UC3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      image.at<cv::Vec3b>(y, x) =
          cv::Vec3b(static_cast<uint8_t>(255 * x / width), static_cast<uint8_t>(255 * y / height),
                    static_cast<uint8_t>(128 + 100 * std::sin(x * 0.05)));
    }
  }
  std::mt19937 rng(seed);
  for (int i = 0; i < 12; ++i) {
    cv::Point a(static_cast<int>(rng() % width), static_cast<int>(rng() % height));
    cv::Scalar color(rng() % 256, rng() % 256, rng() % 256);
    if (i % 2 == 0) {
      cv::rectangle(image, a, a + cv::Point(width / 6, height / 5), color, cv::FILLED);
    } else {
      cv::circle(image, a, height / 8, color, cv::FILLED);
    }
  }
  cv::Mat noise(height, width, CV_8UC3);
  cv::theRNG().state = seed;
  cv::randn(noise, cv::Scalar::all(0), cv::Scalar::all(6));
  cv::add(image, noise, image);
  return image;
}

std::vector<uint8_t> EncodeBmp(const cv::Mat& bgr) {
  const uint32_t row_bytes = (static_cast<uint32_t>(bgr.cols) * 3 + 3) / 4 * 4;
  const uint32_t pixel_bytes = row_bytes * static_cast<uint32_t>(bgr.rows);
  std::vector<uint8_t> out(54 + pixel_bytes, 0);
  auto put32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) out[at + i] = static_cast<uint8_t>(v >> (8 * i));
  };
  out[0] = 'B';
  out[1] = 'M';
  put32(2, static_cast<uint32_t>(out.size()));
  put32(10, 54);  // pixel data offset
  put32(14, 40);  // BITMAPINFOHEADER
  put32(18, static_cast<uint32_t>(bgr.cols));
  put32(22, static_cast<uint32_t>(bgr.rows));  // positive: bottom-up rows
  out[26] = 1;                                 // planes
  out[28] = 24;                                // bits a pixel
  put32(34, pixel_bytes);
  for (int y = 0; y < bgr.rows; ++y) {
    const uint8_t* src = bgr.ptr<uint8_t>(bgr.rows - 1 - y);
    std::copy(src, src + bgr.cols * 3, out.begin() + 54 + static_cast<size_t>(row_bytes) * y);
  }
  return out;
}

}  // namespace carpool
