#include "server/transform.h"

#include <fmt/core.h>
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>

namespace carpool {
namespace {

TransformSpec Parse(std::string_view text) {
  Result<TransformSpec> spec = ParseTransformSpec(text);
  EXPECT_TRUE(spec.ok()) << text << ": " << spec.status().ToString();
  return spec.ok() ? *spec : TransformSpec{};
}

// A prepared image whose byte at (y, x, c) is (y * width + x) * channels + c + 1.
PreparedImage Ramp(int height, int width, int channels) {
  PreparedImage image{{height, width, channels}, std::vector<uint8_t>(height * width * channels)};
  for (size_t i = 0; i < image.pixels.size(); ++i) image.pixels[i] = static_cast<uint8_t>(i + 1);
  return image;
}

template <typename T>
std::vector<T> Apply(const TransformSpec& spec, const PreparedView& src, uint64_t seed) {
  Result<ImageShape> shape = TransformedShape(spec, src.shape);
  EXPECT_TRUE(shape.ok()) << shape.status().ToString();
  EXPECT_EQ(DTypeBytes(spec.dtype), sizeof(T));
  std::vector<T> out(shape->elements());
  EXPECT_TRUE(ApplyTransform(spec, src, seed, out.data()).ok());
  return out;
}

// 1-4 channels, 1..max_height x 1..max_width, every byte drawn from rng.
PreparedImage RandomImage(std::mt19937& rng, int max_height, int max_width) {
  const int channels = 1 + static_cast<int>(rng() % 4);
  const int height = 1 + static_cast<int>(rng() % max_height);
  const int width = 1 + static_cast<int>(rng() % max_width);
  PreparedImage img{{height, width, channels},
                    std::vector<uint8_t>(static_cast<size_t>(height) * width * channels)};
  for (uint8_t& b : img.pixels) b = static_cast<uint8_t>(rng());
  return img;
}

// A seed whose draw has the given flip, so the tests do not depend on particular seed values.
uint64_t SeedWithFlip(const TransformSpec& spec, const PreparedShape& in, bool flip) {
  for (uint64_t seed = 1;; ++seed) {
    if (DrawCropWindow(spec, in, seed).flip == flip) return seed;
  }
}

TEST(TransformTest, ParsesTheIssueExample) {
  TransformSpec spec = Parse("random_crop(224)|flip|normalize(imagenet)|float16|nchw");
  EXPECT_EQ(spec.crop, CropMode::kRandom);
  EXPECT_EQ(spec.crop_size, 224);
  EXPECT_TRUE(spec.flip);
  EXPECT_TRUE(spec.normalize);
  EXPECT_EQ(spec.normalize_channels, 3);
  EXPECT_FLOAT_EQ(spec.mean[0], 0.485f);
  EXPECT_FLOAT_EQ(spec.std[2], 0.225f);
  EXPECT_EQ(spec.dtype, DType::kFloat16);
  EXPECT_EQ(spec.layout, Layout::kNCHW);
}

TEST(TransformTest, Defaults) {
  TransformSpec identity = Parse("");
  EXPECT_EQ(identity.dtype, DType::kUint8);
  EXPECT_EQ(identity.layout, Layout::kNHWC);
  EXPECT_EQ(identity.crop, CropMode::kNone);
  EXPECT_EQ(Parse("center_crop(8)").dtype, DType::kUint8);
  EXPECT_EQ(Parse("normalize(imagenet)").dtype, DType::kFloat32);
  EXPECT_EQ(Parse("normalize(imagenet)").layout, Layout::kNCHW);
  EXPECT_EQ(Parse("float16").layout, Layout::kNCHW);
  EXPECT_EQ(Parse("float32|nhwc").layout, Layout::kNHWC);
  EXPECT_EQ(Parse("uint8|nchw").layout, Layout::kNCHW);
  TransformSpec gray = Parse(" nchw | normalize(0.2860, 0.3530) ");
  EXPECT_EQ(gray.normalize_channels, 1);
  EXPECT_FLOAT_EQ(gray.mean[0], 0.2860f);
  EXPECT_FLOAT_EQ(gray.std[0], 0.3530f);
}

TEST(TransformTest, ToStringRoundTrips) {
  for (std::string_view text :
       {"", "flip", "center_crop(3)|uint8|nchw", "random_crop(224)|flip|normalize(imagenet)",
        "normalize(0.286,0.353)|float16|nhwc", "normalize(0.1,0.2,0.3,0.4,0.5,0.6)"}) {
    TransformSpec spec = Parse(text);
    EXPECT_EQ(Parse(spec.ToString()), spec) << text << " -> " << spec.ToString();
  }
  EXPECT_EQ(Parse("random_crop(224)|flip|normalize(imagenet)").ToString(),
            "random_crop(224)|flip|normalize(imagenet)|float32|nchw");
}

TEST(TransformTest, ParseErrorsNameTheStepAndListValidOnes) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"rotate(5)", "\"rotate(5)\" is unknown"},
      {"flip|Flip", "\"Flip\" is unknown"},
      {"random_crop(0)", "needs a size"},
      {"random_crop(abc)", "needs a size"},
      {"random_crop(3", "no closing"},
      {"random_crop", "needs arguments"},
      {"flip(1)", "takes no arguments"},
      {"flip|flip", "is repeated"},
      {"center_crop(3)|random_crop(3)", "repeats a crop"},
      {"float32|float16", "repeats the dtype"},
      {"nchw|nhwc", "repeats the layout"},
      {"flip|", "is empty"},
      {"normalize(1,2,3)", "has 3 numbers"},
      {"normalize(0.5,x)", "\"x\", which is not a number"},
      {"normalize(0.5,0)", "every std must be > 0"},
      {"normalize(imagenet)|uint8", "uint8 cannot hold"},
  };
  for (const auto& [text, want] : cases) {
    Result<TransformSpec> spec = ParseTransformSpec(text);
    ASSERT_FALSE(spec.ok()) << text;
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(spec.status().message().find(want), std::string::npos)
        << text << ": " << spec.status().message();
  }
  EXPECT_NE(ParseTransformSpec("blur").status().message().find("valid steps: random_crop(N)"),
            std::string::npos);
}

TEST(TransformTest, IdentityAndCenterCropAreExact) {
  const PreparedImage img = Ramp(3, 4, 3);
  EXPECT_EQ(Apply<uint8_t>(Parse(""), img.view(), 1), img.pixels);
  // center_crop(2) of 3x4: rows 0..1 ((3-2)/2 = 0), columns 1..2.
  const std::vector<uint8_t> want = {4, 5, 6, 7, 8, 9, 16, 17, 18, 19, 20, 21};
  EXPECT_EQ(Apply<uint8_t>(Parse("center_crop(2)"), img.view(), 1), want);
}

TEST(TransformTest, FlipMirrorsColumns) {
  const PreparedImage img = Ramp(2, 3, 3);
  const TransformSpec spec = Parse("flip");
  const std::vector<uint8_t> mirrored = {7,  8,  9,  4,  5,  6,  1,  2,  3,
                                         16, 17, 18, 13, 14, 15, 10, 11, 12};
  EXPECT_EQ(Apply<uint8_t>(spec, img.view(), SeedWithFlip(spec, img.shape, true)), mirrored);
  EXPECT_EQ(Apply<uint8_t>(spec, img.view(), SeedWithFlip(spec, img.shape, false)), img.pixels);
  // nchw, flipped: channel planes of the mirrored image.
  const TransformSpec planar = Parse("flip|nchw");
  const std::vector<uint8_t> planes = {7,  4,  1,  16, 13, 10, 8,  5,  2,
                                       17, 14, 11, 9,  6,  3,  18, 15, 12};
  EXPECT_EQ(Apply<uint8_t>(planar, img.view(), SeedWithFlip(planar, img.shape, true)), planes);
}

TEST(TransformTest, RandomCropCopiesTheDrawnWindow) {
  const PreparedImage img = Ramp(7, 9, 1);
  const TransformSpec spec = Parse("random_crop(4)|flip");
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const CropWindow w = DrawCropWindow(spec, img.shape, seed);
    ASSERT_GE(w.y, 0);
    ASSERT_LE(w.y + 4, 7);
    ASSERT_GE(w.x, 0);
    ASSERT_LE(w.x + 4, 9);
    const std::vector<uint8_t> got = Apply<uint8_t>(spec, img.view(), seed);
    for (int y = 0; y < 4; ++y) {
      for (int x = 0; x < 4; ++x) {
        const int sx = w.flip ? w.x + 3 - x : w.x + x;
        ASSERT_EQ(got[y * 4 + x], img.pixels[(w.y + y) * 9 + sx]) << "seed " << seed;
      }
    }
  }
}

TEST(TransformTest, DrawsAreDeterministicAndUniform) {
  const PreparedShape in{6, 6, 3};
  const TransformSpec spec = Parse("random_crop(4)|flip");
  constexpr int kDraws = 9000;
  int counts[3][3] = {};
  int flips = 0;
  for (uint32_t id = 0; id < kDraws; ++id) {
    const uint64_t seed = SampleSeed(42, 0, id);
    const CropWindow w = DrawCropWindow(spec, in, seed);
    const CropWindow again = DrawCropWindow(spec, in, SampleSeed(42, 0, id));
    ASSERT_TRUE(w.y == again.y && w.x == again.x && w.flip == again.flip);
    ++counts[w.y][w.x];
    flips += w.flip;
  }
  // 9 equally likely offsets: chi-square with 8 degrees of freedom, 26.12 is the 0.999 quantile.
  double chi2 = 0;
  const double expected = kDraws / 9.0;
  for (auto& row : counts) {
    for (int c : row) chi2 += (c - expected) * (c - expected) / expected;
  }
  EXPECT_LT(chi2, 26.12);
  // Flip is Bernoulli(1/2): 4.5 standard deviations of the count (sqrt(9000) / 2 = 47.4).
  EXPECT_LT(std::abs(flips - kDraws / 2), 4.5 * 47.4);
}

TEST(TransformTest, SeedsSeparateJobsEpochsAndSamples) {
  EXPECT_EQ(SampleSeed(1, 2, 3), SampleSeed(1, 2, 3));
  const std::set<uint64_t> seeds = {SampleSeed(1, 0, 0), SampleSeed(2, 0, 0), SampleSeed(1, 1, 0),
                                    SampleSeed(1, 0, 1), SampleSeed(0, 0, 0)};
  EXPECT_EQ(seeds.size(), 5u);
  // Two jobs on the same sample: their crops differ for most samples.
  const PreparedShape in{256, 256, 3};
  const TransformSpec spec = Parse("random_crop(224)");
  int same = 0;
  for (uint32_t id = 0; id < 1000; ++id) {
    const CropWindow a = DrawCropWindow(spec, in, SampleSeed(7, 0, id));
    const CropWindow b = DrawCropWindow(spec, in, SampleSeed(8, 0, id));
    same += a.y == b.y && a.x == b.x;
  }
  EXPECT_LT(same, 10);  // 1000 / 33^2 = 0.9 expected
}

TEST(TransformTest, NormalizeValues) {
  PreparedImage img{{1, 2, 3}, {255, 0, 128, 0, 51, 255}};
  const std::vector<float> got = Apply<float>(Parse("normalize(imagenet)|nhwc"), img.view(), 1);
  EXPECT_NEAR(got[0], (1.0 - 0.485) / 0.229, 1e-6);
  EXPECT_NEAR(got[1], (0.0 - 0.456) / 0.224, 1e-6);
  EXPECT_NEAR(got[2], (128 / 255.0 - 0.406) / 0.225, 1e-6);
  EXPECT_NEAR(got[4], (0.2 - 0.456) / 0.224, 1e-6);
  const std::vector<float> unit = Apply<float>(Parse("float32|nhwc"), img.view(), 1);
  EXPECT_EQ(unit[0], 1.0f);
  EXPECT_EQ(unit[1], 0.0f);
  EXPECT_FLOAT_EQ(unit[4], 0.2f);
  PreparedImage gray{{1, 2, 1}, {0, 255}};
  const std::vector<float> g = Apply<float>(Parse("normalize(0.5,0.25)"), gray.view(), 1);
  EXPECT_FLOAT_EQ(g[0], -2.0f);
  EXPECT_FLOAT_EQ(g[1], 2.0f);
}

TEST(TransformTest, FloatToHalfKnownValues) {
  const std::vector<std::pair<float, uint16_t>> cases = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {1.0f, 0x3C00},
      {-2.0f, 0xC000},
      {0.1f, 0x2E66},
      {65504.0f, 0x7BFF},
      {65519.0f, 0x7BFF},
      {65520.0f, 0x7C00},
      {1e10f, 0x7C00},
      {0x1p-14f, 0x0400},
      {0x1p-24f, 0x0001},
      {0x1p-25f, 0x0000},  // tie to even 0
      {0x1.8p-25f, 0x0001},
      {0x1.8p-24f, 0x0002},
      {0x1p-26f, 0x0000},  // 1.5 ulp -> 2
      {1.0f + 0x1p-11f, 0x3C00},
      {1.0f + 0x1.8p-11f, 0x3C01},
      {1.0f + 0x3p-11f, 0x3C02},
      {0x1.ffcp-15f, 0x0400},  // just below the smallest normal rounds up into it
      {std::numeric_limits<float>::infinity(), 0x7C00},
      {-std::numeric_limits<float>::infinity(), 0xFC00},
  };
  for (const auto& [f, h] : cases) EXPECT_EQ(FloatToHalf(f), h) << std::hexfloat << f;
  const uint16_t nan = FloatToHalf(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
}

TEST(TransformTest, HalfRoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const bool is_nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (is_nan) {
      ASSERT_TRUE(std::isnan(f));
    } else {
      ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
    }
  }
  EXPECT_EQ(HalfToFloat(0x3555), 0x1.554p-2f);
  EXPECT_EQ(HalfToFloat(0x0001), 0x1p-24f);
}

#if defined(__FLT16_MAX__)
TEST(TransformTest, FloatToHalfMatchesCompilerFloat16) {
  std::mt19937 rng(12);
  for (int i = 0; i < 2000000; ++i) {
    // Random bit patterns cover every exponent; the mask also hits the half range densely.
    uint32_t bits = static_cast<uint32_t>(rng());
    if (i % 2) bits = (bits & 0x87FFFFFF) | 0x30000000;
    const float f = std::bit_cast<float>(bits);
    if (std::isnan(f)) continue;
    const uint16_t want = std::bit_cast<uint16_t>(static_cast<_Float16>(f));
    ASSERT_EQ(FloatToHalf(f), want) << std::hexfloat << f;
  }
}
#endif

TEST(TransformTest, Float16OutputIsTheRoundedFloat32Output) {
  const PreparedImage img = Ramp(5, 6, 3);
  const auto f32 = Apply<float>(Parse("random_crop(4)|flip|normalize(imagenet)"), img.view(), 9);
  const auto f16 =
      Apply<uint16_t>(Parse("random_crop(4)|flip|normalize(imagenet)|float16"), img.view(), 9);
  ASSERT_EQ(f32.size(), f16.size());
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_EQ(f16[i], FloatToHalf(f32[i])) << i;
}

TEST(TransformTest, NchwIsTheTransposeOfNhwc) {
  const PreparedImage img = Ramp(9, 11, 3);
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const auto hwc = Apply<float>(Parse("random_crop(5)|flip|float32|nhwc"), img.view(), seed);
    const auto chw = Apply<float>(Parse("random_crop(5)|flip|float32|nchw"), img.view(), seed);
    for (int c = 0; c < 3; ++c) {
      for (int y = 0; y < 5; ++y) {
        for (int x = 0; x < 5; ++x) {
          ASSERT_EQ(chw[(c * 5 + y) * 5 + x], hwc[(y * 5 + x) * 3 + c]);
        }
      }
    }
  }
}

// Every float32 value is docs/transforms.md's formula, bit for bit, whatever computes it (a table
// today; a faster way must keep this). The uint8 transform with the same crop and flip gives the
// bytes in output order; the reference applies the formula to each in scalar float.
TEST(TransformTest, Float32EqualsTheFormulaBitForBit) {
  std::mt19937 rng(39);
  auto uniform = [&](float lo, float hi) {
    return std::uniform_real_distribution<float>(lo, hi)(rng);
  };
  int compared = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const PreparedImage img = RandomImage(rng, 40, 40);
    const int channels = img.shape.channels, height = img.shape.height, width = img.shape.width;
    std::string steps;
    const int crop = 1 + static_cast<int>(rng() % std::min(height, width));
    if (rng() % 3 == 0) steps += "random_crop(" + std::to_string(crop) + ")|";
    if (rng() % 2 == 0) steps += "flip|";
    const std::string geometry = steps;  // the uint8 twin has the same window and flip
    std::array<float, 3> mean{}, stdev{1, 1, 1};
    const bool normalize = (channels == 1 || channels == 3) && rng() % 4 != 0;
    if (normalize) {
      for (int c = 0; c < channels; ++c) {
        mean[c] = uniform(-1, 2);
        stdev[c] = uniform(0.01f, 3);
      }
      steps += channels == 1 ? fmt::format("normalize({},{})|", mean[0], stdev[0])
                             : fmt::format("normalize({},{},{},{},{},{})|", mean[0], mean[1],
                                           mean[2], stdev[0], stdev[1], stdev[2]);
    }
    const std::string layout = rng() % 2 == 0 ? "nhwc" : "nchw";
    const TransformSpec spec = Parse(steps + "float32|" + layout);
    const TransformSpec bytes_spec = Parse(geometry + "uint8|" + layout);
    const uint64_t seed = rng();
    const std::vector<float> got = Apply<float>(spec, img.view(), seed);
    const std::vector<uint8_t> bytes = Apply<uint8_t>(bytes_spec, img.view(), seed);
    ASSERT_EQ(got.size(), bytes.size());
    const size_t plane = bytes.size() / channels;
    for (size_t i = 0; i < bytes.size(); ++i) {
      const size_t c = layout == "nhwc" ? i % channels : i / plane;
      const float unit = static_cast<float>(bytes[i]) / 255.0f;
      const float want = normalize ? (unit - spec.mean[c]) / spec.std[c] : unit;
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want))
          << steps << layout << ", " << channels << " channels, element " << i << ": " << got[i]
          << " against " << want;
      ++compared;
    }
  }
  EXPECT_GT(compared, 100000);
}

// Every dtype, layout and channel count against a reference written from the definition: output
// (y, x, c) is the table value of the window's byte at (w.y + y, w.x + x', c), x' mirrored under
// flip. Widths 1-70 cover the 4 (float32) and 8 (float16) lanes of a 16-byte store, the 8 bytes
// of uint8's 64-bit word, and every tail after them. The output starts as 0xA5 bytes, so an element
// left unwritten shows; the buffer is exactly the image's size, so an overrun shows under valgrind.
TEST(TransformTest, EveryLayoutEqualsTheDefinition) {
  std::mt19937 rng(40);
  int compared = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const PreparedImage img = RandomImage(rng, 12, 70);
    const int channels = img.shape.channels, height = img.shape.height, width = img.shape.width;
    std::string steps;
    if (rng() % 2 == 0) {
      const int crop = 1 + static_cast<int>(rng() % std::min(height, width));
      steps += (rng() % 2 == 0 ? "random_crop(" : "center_crop(") + std::to_string(crop) + ")|";
    }
    if (rng() % 2 == 0) steps += "flip|";
    const bool normalize = (channels == 1 || channels == 3) && rng() % 2 == 0;
    if (normalize && channels == 3 && rng() % 2 == 0) {
      steps += "normalize(imagenet)|";
    } else if (normalize) {
      std::string numbers;
      for (int i = 0; i < 2 * channels; ++i) {
        const float lo = i < channels ? -1.0f : 0.05f;  // means, then stds (> 0)
        numbers += fmt::format("{}{}", i == 0 ? "" : ",",
                               std::uniform_real_distribution<float>(lo, 2)(rng));
      }
      steps += "normalize(" + numbers + ")|";
    }
    const char* dtypes[] = {"uint8", "float32", "float16"};
    const std::string dtype = dtypes[normalize ? 1 + rng() % 2 : rng() % 3];
    const bool nchw = rng() % 2 == 0;
    const TransformSpec spec = Parse(steps + dtype + (nchw ? "|nchw" : "|nhwc"));
    const uint64_t seed = rng();
    const CropWindow w = DrawCropWindow(spec, img.shape, seed);
    const Result<ImageShape> shape = TransformedShape(spec, img.shape);
    ASSERT_TRUE(shape.ok()) << shape.status().ToString();
    std::vector<uint8_t> got(shape->bytes(), 0xA5);
    ASSERT_TRUE(ApplyTransform(spec, img.view(), seed, got.data()).ok());
    const size_t elem = DTypeBytes(spec.dtype);
    for (int y = 0; y < w.height; ++y) {
      for (int x = 0; x < w.width; ++x) {
        const int sx = w.x + (w.flip ? w.width - 1 - x : x);
        for (int c = 0; c < channels; ++c) {
          const uint8_t v = img.pixels[(static_cast<size_t>(w.y + y) * width + sx) * channels + c];
          const float unit = static_cast<float>(v) / 255.0f;
          const float value = normalize ? (unit - spec.mean[c]) / spec.std[c] : unit;
          uint8_t want[4];
          if (dtype == "uint8") {
            want[0] = v;
          } else if (dtype == "float32") {
            std::memcpy(want, &value, 4);
          } else {
            const uint16_t half = FloatToHalf(value);
            std::memcpy(want, &half, 2);
          }
          const size_t index = nchw ? (static_cast<size_t>(c) * w.height + y) * w.width + x
                                    : (static_cast<size_t>(y) * w.width + x) * channels + c;
          ASSERT_EQ(std::memcmp(got.data() + index * elem, want, elem), 0)
              << spec.ToString() << " on " << height << "x" << width << "x" << channels
              << ", window at (" << w.y << ", " << w.x << ") flip " << w.flip << ": output (" << y
              << ", " << x << ", " << c << ")";
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 50000);
}

TEST(TransformTest, ShapeErrors) {
  const PreparedImage img = Ramp(4, 6, 1);
  Result<ImageShape> shape = TransformedShape(Parse("random_crop(5)"), img.shape);
  EXPECT_EQ(shape.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(shape.status().message().find("crop 5 is larger than the prepared sample 4x6"),
            std::string::npos)
      << shape.status().message();
  EXPECT_EQ(TransformedShape(Parse("normalize(imagenet)"), img.shape).status().code(),
            StatusCode::kInvalidArgument);
  std::vector<uint8_t> dst(64, 0xCD);
  EXPECT_FALSE(ApplyTransform(Parse("center_crop(5)"), img.view(), 1, dst.data()).ok());
  EXPECT_EQ(dst[0], 0xCD);
  Result<ImageShape> ok = TransformedShape(Parse("center_crop(4)|float16"), img.shape);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, (ImageShape{1, 4, 4, DType::kFloat16, Layout::kNCHW}));
  EXPECT_EQ(ok->bytes(), 32u);
}

}  // namespace
}  // namespace carpool
