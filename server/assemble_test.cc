#include "server/assemble.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace carpool {
namespace {

PreparedImage Filled(int height, int width, uint8_t base) {
  PreparedImage image{{height, width, 3}, std::vector<uint8_t>(height * width * 3)};
  for (size_t i = 0; i < image.pixels.size(); ++i) {
    image.pixels[i] = static_cast<uint8_t>(base + i * 13);
  }
  return image;
}

TransformSpec Parse(std::string_view text) {
  Result<TransformSpec> spec = ParseTransformSpec(text);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return *spec;
}

TEST(AssembleTest, EachImageSitsAtItsOffset) {
  const std::vector<PreparedImage> images = {Filled(8, 10, 0), Filled(8, 10, 50),
                                             Filled(8, 10, 100), Filled(8, 10, 150)};
  std::vector<PreparedView> views;
  std::vector<uint64_t> seeds;
  for (size_t i = 0; i < images.size(); ++i) {
    views.push_back(images[i].view());
    seeds.push_back(SampleSeed(3, 1, static_cast<uint32_t>(i)));
  }
  const TransformSpec spec = Parse("random_crop(5)|flip|normalize(imagenet)|float32|nchw");
  const size_t image_floats = 3 * 5 * 5;
  std::vector<float> batch(images.size() * image_floats + 1, -7.0f);
  Result<ImageShape> shape =
      AssembleBatch(spec, views, seeds, batch.data(), (batch.size() - 1) * sizeof(float));
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  EXPECT_EQ(*shape, (ImageShape{3, 5, 5, DType::kFloat32, Layout::kNCHW}));
  EXPECT_EQ(batch.back(), -7.0f);  // nothing past the batch
  for (size_t i = 0; i < images.size(); ++i) {
    std::vector<float> one(image_floats);
    ASSERT_TRUE(ApplyTransform(spec, views[i], seeds[i], one.data()).ok());
    EXPECT_EQ(std::memcmp(one.data(), batch.data() + i * image_floats, one.size() * 4), 0) << i;
  }
}

TEST(AssembleTest, MixedShapesNeedACrop) {
  const PreparedImage a = Filled(8, 10, 0);
  const PreparedImage b = Filled(8, 12, 0);
  const std::vector<PreparedView> views = {a.view(), b.view()};
  const std::vector<uint64_t> seeds = {1, 2};
  std::vector<uint8_t> dst(2 * 8 * 12 * 3);
  Result<ImageShape> mixed = AssembleBatch(Parse(""), views, seeds, dst.data(), dst.size());
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("batch sample 1 (8x12x3)"), std::string::npos)
      << mixed.status().message();
  Result<ImageShape> cropped =
      AssembleBatch(Parse("center_crop(8)"), views, seeds, dst.data(), dst.size());
  ASSERT_TRUE(cropped.ok()) << cropped.status().ToString();
  EXPECT_EQ(cropped->bytes(), 8u * 8 * 3);
}

TEST(AssembleTest, RejectsBadArgumentsWithoutWriting) {
  const PreparedImage a = Filled(4, 4, 0);
  const std::vector<PreparedView> views = {a.view(), a.view()};
  const std::vector<uint64_t> seeds = {1, 2};
  std::vector<uint8_t> dst(2 * 48, 0xEE);
  const TransformSpec spec = Parse("flip");
  EXPECT_FALSE(AssembleBatch(spec, views, seeds, dst.data(), dst.size() - 1).ok());
  EXPECT_FALSE(AssembleBatch(spec, views, std::span(seeds).first(1), dst.data(), dst.size()).ok());
  EXPECT_FALSE(AssembleBatch(spec, {}, {}, dst.data(), dst.size()).ok());
  EXPECT_FALSE(AssembleBatch(Parse("random_crop(5)"), views, seeds, dst.data(), dst.size()).ok());
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](uint8_t v) { return v == 0xEE; }));
  EXPECT_TRUE(AssembleBatch(spec, views, seeds, dst.data(), dst.size()).ok());
}

}  // namespace
}  // namespace carpool
