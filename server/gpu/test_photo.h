// Test images for the GPU decode tests (test-only).
#ifndef CARPOOL_SERVER_GPU_TEST_PHOTO_H_
#define CARPOOL_SERVER_GPU_TEST_PHOTO_H_

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace carpool::gpu {

// A photo-like RGB image: gradients, hard edges and sensor noise (as the bench set's JPEGs).
inline std::vector<uint8_t> Photo(int w, int h, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0, 12);
  std::vector<uint8_t> rgb(size_t(w) * h * 3);
  const int cx = int(rng() % w), cy = int(rng() % h), r = 20 + int(rng() % 80);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const bool disc = (x - cx) * (x - cx) + (y - cy) * (y - cy) < r * r;
      const float base[3] = {255.f * x / w, 255.f * y / h, disc ? 230.f : 40.f};
      for (int c = 0; c < 3; ++c) {
        rgb[(size_t(y) * w + x) * 3 + c] =
            static_cast<uint8_t>(std::clamp(base[c] + noise(rng), 0.f, 255.f));
      }
    }
  }
  return rgb;
}

}  // namespace carpool::gpu

#endif  // CARPOOL_SERVER_GPU_TEST_PHOTO_H_
