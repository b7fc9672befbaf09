// Test images for the transform tests: synthetic photos and a BMP writer (test-only; not part of
// carpool_transform).
#ifndef CARPOOL_SERVER_TEST_IMAGES_H_
#define CARPOOL_SERVER_TEST_IMAGES_H_

#include <cstdint>
#include <opencv2/core.hpp>
#include <vector>

namespace carpool {

// A BGR image of smooth gradients, hard-edged shapes and sensor-like noise; depends only on the
// arguments.
cv::Mat MakePhoto(int width, int height, uint32_t seed);

// A 24-bit uncompressed BMP of a CV_8UC3 BGR image: a format that only imgcodecs decodes.
std::vector<uint8_t> EncodeBmp(const cv::Mat& bgr);

}  // namespace carpool

#endif  // CARPOOL_SERVER_TEST_IMAGES_H_
