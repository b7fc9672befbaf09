#include "server/prepare.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <random>
#if CARPOOL_HAVE_IMGCODECS
#include <opencv2/imgcodecs.hpp>
#endif

#include "server/image_codec.h"
#include "server/test_images.h"

namespace carpool {
namespace {

std::vector<uint8_t> Encode(const cv::Mat& image, const std::string& ext, int quality = 90) {
  Result<std::vector<uint8_t>> out =
      ext == ".jpg"   ? EncodeJpeg(image, ChannelOrder::kBgr, {.quality = quality})
      : ext == ".bmp" ? Result<std::vector<uint8_t>>(EncodeBmp(image))
                      : EncodePng(image, ChannelOrder::kBgr);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : std::vector<uint8_t>{};
}

// Full-resolution RGB or gray, through imgcodecs where the build has it; otherwise through
// image_codec.h, which image_codec_test.cc compares with imgcodecs wherever both are built.
cv::Mat DecodeForReference(const std::vector<uint8_t>& encoded, int channels) {
#if CARPOOL_HAVE_IMGCODECS
  cv::Mat image = cv::imdecode(encoded, (channels == 1 ? cv::IMREAD_GRAYSCALE : cv::IMREAD_COLOR) |
                                            cv::IMREAD_IGNORE_ORIENTATION);
  if (channels == 3) cv::cvtColor(image, image, cv::COLOR_BGR2RGB);
  return image;
#else
  Result<cv::Mat> image = DecodeImage(encoded, channels);
  EXPECT_TRUE(image.ok()) << image.status().ToString();
  return image.ok() ? *image : cv::Mat();
#endif
}

// The reference: full-resolution decode, resize of the shorter side (rounded half up), center
// crop, RGB; written independently of prepare.cc.
cv::Mat Reference(const std::vector<uint8_t>& encoded, int resize, int crop, int channels) {
  cv::Mat image = DecodeForReference(encoded, channels);
  if (resize > 0) {
    const bool portrait = image.cols <= image.rows;
    const double longer = portrait ? image.rows : image.cols;
    const double shorter = portrait ? image.cols : image.rows;
    const int scaled = static_cast<int>(std::floor(longer * resize / shorter + 0.5));
    cv::Size size = portrait ? cv::Size(resize, scaled) : cv::Size(scaled, resize);
    const bool shrink = size.width <= image.cols && size.height <= image.rows;
    if (size != image.size()) {
      cv::resize(image, image, size, 0, 0, shrink ? cv::INTER_AREA : cv::INTER_LINEAR);
    }
  }
  if (crop > 0) {
    image = image(cv::Rect((image.cols - crop) / 2, (image.rows - crop) / 2, crop, crop)).clone();
  }
  return image;
}

PrepareSpec Spec(int resize, int crop, int channels = 3) {
  PrepareSpec spec;
  spec.resize = resize;
  spec.crop = crop;
  spec.channels = channels;
  return spec;
}

cv::Mat AsMat(const PreparedImage& image) {
  return cv::Mat(image.shape.height, image.shape.width,
                 image.shape.channels == 1 ? CV_8UC1 : CV_8UC3,
                 const_cast<uint8_t*>(image.pixels.data()));
}

void ExpectExact(const PreparedImage& got, const cv::Mat& want) {
  ASSERT_EQ(got.shape, (PreparedShape{want.rows, want.cols, want.channels()}));
  EXPECT_EQ(cv::norm(AsMat(got), want, cv::NORM_INF), 0.0);
}

TEST(PrepareTest, ReducedDecodeFactorPicksLargestThatKeepsShorterSide) {
  EXPECT_EQ(ReducedDecodeFactor(Spec(256, 256), 500, 375), 1);  // 375 / 2 < 256
  EXPECT_EQ(ReducedDecodeFactor(Spec(64, 64), 500, 375), 4);    // 375 / 8 = 46 < 64 <= 93
  EXPECT_EQ(ReducedDecodeFactor(Spec(64, 0), 375, 500), 4);     // portrait: same shorter side
  EXPECT_EQ(ReducedDecodeFactor(Spec(256, 224), 1024, 768), 2);
  EXPECT_EQ(ReducedDecodeFactor(Spec(100, 0), 800, 800), 8);
  EXPECT_EQ(ReducedDecodeFactor(Spec(101, 0), 800, 800), 4);
  EXPECT_EQ(ReducedDecodeFactor(Spec(0, 100), 4000, 3000), 1);  // no resize: keep the scale
  EXPECT_EQ(ReducedDecodeFactor(Spec(1, 0), 7, 7), 1);          // under 8 pixels: full decode
  EXPECT_EQ(ReducedDecodeFactor(Spec(1, 0), 8, 3), 2);
  PrepareSpec raw;
  raw.raw = true;
  EXPECT_EQ(ReducedDecodeFactor(raw, 4000, 3000), 1);
}

TEST(PrepareTest, FullDecodeEqualsOpenCvExactly) {
  const std::vector<uint8_t> jpeg = Encode(MakePhoto(300, 200, 1), ".jpg");
  for (const auto& [resize, crop] : {std::pair{160, 160}, {160, 0}, {0, 150}, {0, 0}, {150, 120}}) {
    SCOPED_TRACE(testing::Message() << "resize=" << resize << " crop=" << crop);
    ASSERT_EQ(ReducedDecodeFactor(Spec(resize, crop), 300, 200), 1);
    Result<PreparedImage> got = PrepareSample(Spec(resize, crop), jpeg);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ExpectExact(*got, Reference(jpeg, resize, crop, 3));
  }
}

TEST(PrepareTest, GrayscalePngAndUpscaleEqualOpenCvExactly) {
  const std::vector<uint8_t> jpeg = Encode(MakePhoto(120, 90, 2), ".jpg");
  Result<PreparedImage> gray = PrepareSample(Spec(64, 64, 1), jpeg);
  ASSERT_TRUE(gray.ok()) << gray.status().ToString();
  ExpectExact(*gray, Reference(jpeg, 64, 64, 1));

  const std::vector<uint8_t> png = Encode(MakePhoto(70, 50, 3), ".png");
  Result<PreparedImage> up = PrepareSample(Spec(80, 80), png);  // 50 -> 80: bilinear upscale
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  ExpectExact(*up, Reference(png, 80, 80, 3));
}

TEST(PrepareTest, ProgressiveJpegDecodesAndTruncationIsCaught) {
  Result<std::vector<uint8_t>> encoded =
      EncodeJpeg(MakePhoto(400, 300, 12), ChannelOrder::kBgr, {.quality = 90, .progressive = true});
  ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
  const std::vector<uint8_t>& jpeg = *encoded;
  Result<PreparedImage> full = PrepareSample(Spec(200, 200), jpeg);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  ExpectExact(*full, Reference(jpeg, 200, 200, 3));
  ASSERT_EQ(ReducedDecodeFactor(Spec(64, 64), 400, 300), 4);
  Result<PreparedImage> reduced = PrepareSample(Spec(64, 64), jpeg);
  ASSERT_TRUE(reduced.ok()) << reduced.status().ToString();
  EXPECT_GT(cv::PSNR(AsMat(*reduced), Reference(jpeg, 64, 64, 3)), 35.0);
  const std::vector<uint8_t> cut(jpeg.begin(), jpeg.begin() + jpeg.size() * 3 / 4);
  EXPECT_EQ(PrepareSample(Spec(64, 64), cut).status().code(), StatusCode::kCorruption);
}

TEST(PrepareTest, OutputIsRgb) {
  cv::Mat red(16, 16, CV_8UC3, cv::Scalar(0, 0, 255));  // BGR red
  Result<PreparedImage> got = PrepareSample(Spec(0, 0), Encode(red, ".png"));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->pixels[0], 255);
  EXPECT_EQ(got->pixels[1], 0);
  EXPECT_EQ(got->pixels[2], 0);
}

TEST(PrepareTest, ReducedDecodeIsCloseToFullResolution) {
  const cv::Mat photo = MakePhoto(1000, 750, 4);
  const std::vector<uint8_t> jpeg = Encode(photo, ".jpg");
  for (const auto& [resize, crop, factor] : {std::tuple{64, 64, 8}, {256, 224, 2}, {120, 0, 4}}) {
    SCOPED_TRACE(testing::Message() << "resize=" << resize << " crop=" << crop);
    ASSERT_EQ(ReducedDecodeFactor(Spec(resize, crop), 1000, 750), factor);
    Result<PreparedImage> got = PrepareSample(Spec(resize, crop), jpeg);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    const cv::Mat want = Reference(jpeg, resize, crop, 3);
    ASSERT_EQ(got->shape, (PreparedShape{want.rows, want.cols, 3}));
    cv::Mat diff;
    cv::absdiff(AsMat(*got), want, diff);
    // DCT-domain scaling (and its chroma upsampling) and area averaging are different low-pass
    // filters: they agree on smooth areas and differ at hard colour edges. Measured on this
    // image: PSNR 39-46 dB, mean error 0.6-1.7 levels, under 1% of values off by more than 16.
    EXPECT_GT(cv::PSNR(AsMat(*got), want), 35.0);
    EXPECT_LT(cv::mean(diff)[0], 2.5);
    EXPECT_LT(cv::countNonZero(diff.reshape(1) > 16), static_cast<int>(diff.total() * 3 / 50));
  }
}

TEST(PrepareTest, ShapeForMatchesPrepareAndDoesNotDependOnReduction) {
  // 1001x751 reduces to ceil sizes 126x94; the shape must still come from the full size.
  const std::vector<uint8_t> jpeg = Encode(MakePhoto(1001, 751, 5), ".jpg");
  const PrepareSpec spec = Spec(64, 0);
  ASSERT_EQ(ReducedDecodeFactor(spec, 1001, 751), 8);
  Result<PreparedShape> shape = PreparedShapeFor(spec, jpeg);
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  EXPECT_EQ(*shape, (PreparedShape{64, 85, 3}));  // 1001 * 64 / 751 = 85.3
  std::vector<uint8_t> slot(shape->bytes() + 7, 0xAB);
  Result<PreparedShape> written = PrepareInto(spec, jpeg, slot);
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  EXPECT_EQ(*written, *shape);
  EXPECT_EQ(slot.back(), 0xAB);  // nothing past the image

  std::vector<uint8_t> small(shape->bytes() - 1, 0xAB);
  Result<PreparedShape> too_small = PrepareInto(spec, jpeg, small);
  EXPECT_EQ(too_small.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(std::all_of(small.begin(), small.end(), [](uint8_t b) { return b == 0xAB; }));
}

TEST(PrepareTest, ShapesAgreeWithTheReferenceOverRandomSizes) {
  std::mt19937 rng(13);
  int reduced = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const int w = 40 + static_cast<int>(rng() % 600);
    const int h = 40 + static_cast<int>(rng() % 600);
    const int resize = 8 + static_cast<int>(rng() % (std::min(w, h) - 8));
    const std::vector<uint8_t> jpeg = Encode(MakePhoto(w, h, 100 + trial), ".jpg");
    SCOPED_TRACE(testing::Message() << w << "x" << h << " resize=" << resize);
    reduced += ReducedDecodeFactor(Spec(resize, 0), w, h) > 1;
    Result<PreparedShape> shape = PreparedShapeFor(Spec(resize, 0), jpeg);
    Result<PreparedImage> got = PrepareSample(Spec(resize, 0), jpeg);
    ASSERT_TRUE(shape.ok() && got.ok()) << got.status().ToString();
    const cv::Mat want = Reference(jpeg, resize, 0, 3);
    EXPECT_EQ(*shape, (PreparedShape{want.rows, want.cols, 3}));
    EXPECT_EQ(got->shape, *shape);
  }
  EXPECT_GT(reduced, 5);  // the sizes exercise the reduced path too
}

TEST(PrepareTest, ShapeForOtherFormatsDecodes) {
  const std::vector<uint8_t> bmp = Encode(MakePhoto(40, 30, 6), ".bmp");
  Result<PreparedShape> shape = PreparedShapeFor(Spec(15, 0), bmp);
  if (!HaveImgcodecs()) {  // only imgcodecs decodes BMP: the error names the format
    EXPECT_EQ(shape.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(shape.status().message().find("BMP"), std::string::npos) << shape.status().ToString();
    EXPECT_EQ(PrepareSample(Spec(15, 0), bmp).status().code(), StatusCode::kInvalidArgument);
    return;
  }
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  EXPECT_EQ(*shape, (PreparedShape{15, 20, 3}));
  Result<PreparedImage> got = PrepareSample(Spec(15, 0), bmp);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectExact(*got, Reference(bmp, 15, 0, 3));
}

TEST(PrepareTest, RawRecordsPassThrough) {
  PrepareSpec raw;
  raw.raw = true;
  raw.channels = 1;
  std::vector<uint8_t> record(28 * 28);
  for (size_t i = 0; i < record.size(); ++i) record[i] = static_cast<uint8_t>(i * 7);
  Result<PreparedImage> got = PrepareSample(raw, record, {28, 28, 1});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->shape, (PreparedShape{28, 28, 1}));
  EXPECT_EQ(got->pixels, record);

  EXPECT_EQ(PrepareSample(raw, std::span(record).first(783), {28, 28, 1}).status().code(),
            StatusCode::kCorruption);
  EXPECT_EQ(PrepareSample(raw, record).status().code(), StatusCode::kInvalidArgument);
}

TEST(PrepareTest, BadInputIsCorruption) {
  const std::vector<uint8_t> jpeg = Encode(MakePhoto(64, 48, 7), ".jpg");
  const std::vector<uint8_t> png = Encode(MakePhoto(64, 48, 7), ".png");
  std::vector<uint8_t> garbage(500);
  std::mt19937 rng(8);
  for (uint8_t& b : garbage) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> bad_sof = jpeg;
  for (size_t i = 2; i + 1 < bad_sof.size(); ++i) {
    if (bad_sof[i] == 0xFF && bad_sof[i + 1] == 0xC0) {
      bad_sof[i + 2] = 0xFF;  // segment length far past the end
      break;
    }
  }
  const std::vector<std::pair<std::string, std::vector<uint8_t>>> cases = {
      {"empty", {}},
      {"garbage", garbage},
      {"soi only", {0xFF, 0xD8}},
      {"jpeg headers only", {jpeg.begin(), jpeg.begin() + 100}},
      {"jpeg cut in the scan", {jpeg.begin(), jpeg.begin() + jpeg.size() / 2}},
      {"jpeg without eoi", {jpeg.begin(), jpeg.end() - 2}},
      {"jpeg bad sof length", bad_sof},
      {"png cut", {png.begin(), png.begin() + png.size() / 2}},
      {"png signature only", {png.begin(), png.begin() + 8}},
  };
  for (const auto& [name, bytes] : cases) {
    SCOPED_TRACE(name);
    Result<PreparedImage> got = PrepareSample(Spec(32, 32), bytes);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kCorruption) << got.status().ToString();
    EXPECT_FALSE(got.status().message().empty());
  }
}

TEST(PrepareTest, MutatedJpegsNeverCrash) {
  const std::vector<uint8_t> jpeg = Encode(MakePhoto(64, 48, 9), ".jpg");
  std::mt19937 rng(10);
  int failures = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<uint8_t> bytes = jpeg;
    for (int k = 0; k < 4; ++k) bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
    Result<PreparedImage> got = PrepareSample(Spec(32, 32), bytes);
    if (got.ok()) {
      EXPECT_EQ(got->shape, (PreparedShape{32, 32, 3}));
    } else {
      ++failures;
      EXPECT_TRUE(got.status().code() == StatusCode::kCorruption ||
                  got.status().code() == StatusCode::kInvalidArgument)
          << got.status().ToString();
    }
  }
  EXPECT_GT(failures, 0);  // header damage must be caught at least sometimes
}

TEST(PrepareTest, SourceSmallerThanCropIsInvalidArgument) {
  const std::vector<uint8_t> png = Encode(MakePhoto(40, 30, 11), ".png");
  Result<PreparedImage> got = PrepareSample(Spec(0, 32), png);
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("smaller than crop=32"), std::string::npos)
      << got.status().ToString();
}

PrepareSpec GpuSpec(int resize, int crop) {
  PrepareSpec spec = Spec(resize, crop);
  spec.gpu_decode = true;
  return spec;
}

std::vector<uint8_t> EncodeOrFail(const cv::Mat& bgr, const JpegEncodeOptions& options) {
  Result<std::vector<uint8_t>> out = EncodeJpeg(bgr, ChannelOrder::kBgr, options);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : std::vector<uint8_t>{};
}

// decode=gpu: the JPEGs GPU decode takes stay encoded (the encoded tier); progressive JPEGs,
// PNGs and gray JPEGs are prepared on the CPU to the pixels a GPU would give.
TEST(PrepareTest, GpuDecodeKeepsWhatTheGpuDecodesEncodedAndPreparesTheRest) {
  const cv::Mat photo = MakePhoto(500, 375, 21);
  const PrepareSpec spec = GpuSpec(256, 224);
  const PreparedShape pixels{224, 224, 3};
  for (bool subsample : {true, false}) {
    const std::vector<uint8_t> jpeg = EncodeOrFail(photo, {.quality = 90, .subsample_chroma = subsample});
    Result<PreparedShape> shape = PreparedShapeFor(spec, jpeg);
    ASSERT_TRUE(shape.ok()) << shape.status().ToString();
    EXPECT_EQ(shape->encoded_bytes, jpeg.size());
    EXPECT_EQ(shape->pixels(), pixels);
    Result<PreparedImage> stored = PrepareSample(spec, jpeg);
    ASSERT_TRUE(stored.ok()) << stored.status().ToString();
    EXPECT_EQ(stored->shape, *shape);
    EXPECT_EQ(stored->pixels, jpeg);  // the bytes themselves
  }
  cv::Mat gray;
  cv::cvtColor(photo, gray, cv::COLOR_BGR2GRAY);
  for (const std::vector<uint8_t>& other :
       {EncodeOrFail(photo, {.quality = 90, .progressive = true}), Encode(photo, ".png"),
        EncodeOrFail(gray, {.quality = 90})}) {
    Result<PreparedShape> shape = PreparedShapeFor(spec, other);
    ASSERT_TRUE(shape.ok()) << shape.status().ToString();
    EXPECT_EQ(*shape, pixels);  // not encoded
    Result<PreparedImage> prepared = PrepareSample(spec, other);
    ASSERT_TRUE(prepared.ok()) << prepared.status().ToString();
    Result<PreparedImage> on_cpu = PrepareGpuPixelsOnCpu(spec, other);
    ASSERT_TRUE(on_cpu.ok()) << on_cpu.status().ToString();
    EXPECT_EQ(prepared->shape, pixels);
    EXPECT_EQ(prepared->pixels, on_cpu->pixels);
  }
  const std::vector<uint8_t> jpeg = EncodeOrFail(photo, {.quality = 90});
  const std::vector<uint8_t> cut(jpeg.begin(), jpeg.begin() + jpeg.size() / 2);
  EXPECT_EQ(PreparedShapeFor(spec, cut).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(PrepareGpuPixelsOnCpu(Spec(256, 224), jpeg).status().code(),
            StatusCode::kInvalidArgument);  // not a decode=gpu spec
}

// The CPU's decode=gpu pixels: a full-size decode with replicated chroma, resized by the exact box
// filter. Close to the CPU spec's pixels, and not equal to them: they are another prepared sample.
TEST(PrepareTest, GpuPixelsOnCpuAreTheFastUpsampledDecodeResizedExactly) {
  const std::vector<uint8_t> jpeg = EncodeOrFail(MakePhoto(500, 375, 22), {.quality = 90});
  const PrepareSpec spec = GpuSpec(256, 224);
  Result<cv::Mat> decoded = DecodeJpeg(jpeg, 3, 1, /*fast_upsample=*/true);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  Result<ResizeCropGeometry> g = ResizeCropFor(spec, 500, 375);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  std::vector<uint8_t> want(224 * 224 * 3);
  ExactResizeCrop(*g, decoded->data, decoded->step, 3, want.data());
  Result<PreparedImage> got = PrepareGpuPixelsOnCpu(spec, jpeg);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->pixels, want);
  Result<PreparedImage> cpu = PrepareSample(Spec(256, 224), jpeg);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  EXPECT_NE(cpu->pixels, got->pixels);
  EXPECT_GT(cv::PSNR(AsMat(*cpu), AsMat(*got)), 30.0);
}

}  // namespace
}  // namespace carpool
