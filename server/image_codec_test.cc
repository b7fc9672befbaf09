#include "server/image_codec.h"

#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <cstdio>
#include <opencv2/imgproc.hpp>
#include <random>
#include <string>
#include <vector>
#if CARPOOL_HAVE_IMGCODECS
#include <opencv2/imgcodecs.hpp>
#endif

#include "server/test_images.h"

namespace carpool {
namespace {

// One encoded test image and what it is.
struct Sample {
  std::string name;
  std::vector<uint8_t> bytes;
};

std::vector<uint8_t> MustJpeg(const cv::Mat& bgr, const JpegEncodeOptions& options) {
  Result<std::vector<uint8_t>> out = EncodeJpeg(bgr, ChannelOrder::kBgr, options);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : std::vector<uint8_t>{};
}

std::vector<uint8_t> MustPng(const cv::Mat& image, const PngEncodeOptions& options = {}) {
  Result<std::vector<uint8_t>> out = EncodePng(image, ChannelOrder::kBgr, options);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : std::vector<uint8_t>{};
}

// A YCCK JPEG (TurboJPEG's encoding of CMYK pixels): the 4-component path of DecodeJpeg.
std::vector<uint8_t> CmykJpeg(const cv::Mat& bgr, int quality) {
  cv::Mat cmyk(bgr.rows, bgr.cols, CV_8UC4);
  for (int y = 0; y < bgr.rows; ++y) {
    for (int x = 0; x < bgr.cols; ++x) {
      const cv::Vec3b p = bgr.at<cv::Vec3b>(y, x);
      cmyk.at<cv::Vec4b>(y, x) = cv::Vec4b(p[2], p[1], p[0], static_cast<uint8_t>(255 - x % 97));
    }
  }
  tjhandle tj = tjInitCompress();
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(tj, cmyk.data, cmyk.cols, static_cast<int>(cmyk.step), cmyk.rows,
                             TJPF_CMYK, &buffer, &size, TJSAMP_420, quality, TJFLAG_ACCURATEDCT);
  EXPECT_EQ(rc, 0) << tjGetErrorStr2(tj);
  std::vector<uint8_t> out(buffer, buffer + (rc == 0 ? size : 0));
  tjFree(buffer);
  tjDestroy(tj);
  return out;
}

// Sizes from 1x1 to a 4:2:0 MCU-misaligned 1001x751; odd ones exercise partial blocks.
const std::vector<cv::Size> kSizes = {{1, 1}, {7, 5}, {17, 9}, {64, 48}, {333, 250}, {1001, 751}};

std::vector<Sample> JpegSamples() {
  std::vector<Sample> samples;
  for (const cv::Size size : kSizes) {
    const cv::Mat colour = MakePhoto(size.width, size.height, size.width * 31 + size.height);
    cv::Mat gray;
    cv::cvtColor(colour, gray, cv::COLOR_BGR2GRAY);
    for (int quality : {50, 90, 100}) {
      const std::string at = std::to_string(size.width) + "x" + std::to_string(size.height) + " q" +
                             std::to_string(quality);
      samples.push_back({"420 " + at, MustJpeg(colour, {quality, true, false})});
      samples.push_back({"444 " + at, MustJpeg(colour, {quality, false, false})});
      samples.push_back({"420 progressive " + at, MustJpeg(colour, {quality, true, true})});
      samples.push_back({"gray " + at, MustJpeg(gray, {quality, true, false})});
      samples.push_back({"gray progressive " + at, MustJpeg(gray, {quality, true, true})});
      samples.push_back({"ycck " + at, CmykJpeg(colour, quality)});
      Result<ImageHeader> ycck = ReadImageHeader(samples.back().bytes);
      EXPECT_TRUE(ycck.ok() && ycck->components == 4) << samples.back().name;
    }
  }
  return samples;
}

std::vector<Sample> PngSamples() {
  std::vector<Sample> samples;
  for (const cv::Size size : kSizes) {
    if (size.width > 400) continue;  // PNG's transformations do not depend on the size
    const cv::Mat bgr = MakePhoto(size.width, size.height, size.width * 7 + size.height);
    cv::Mat gray, bgra, gray_alpha, wide_bgr, wide_gray, wide_bgra, few_colours, few_bgra;
    cv::cvtColor(bgr, gray, cv::COLOR_BGR2GRAY);
    cv::cvtColor(bgr, bgra, cv::COLOR_BGR2BGRA);
    for (int y = 0; y < bgra.rows; ++y) {
      for (int x = 0; x < bgra.cols; ++x)
        bgra.at<cv::Vec4b>(y, x)[3] = static_cast<uint8_t>(x * 9 + y);
    }
    cv::Mat alpha;
    cv::extractChannel(bgra, alpha, 3);
    cv::merge(std::vector<cv::Mat>{gray, alpha}, gray_alpha);
    bgr.convertTo(wide_bgr, CV_16UC3, 257.0 / 1.0, 0);
    wide_bgr += cv::Scalar::all(77);  // low bytes that are not copies of the high ones
    gray.convertTo(wide_gray, CV_16UC1, 256.0, 129);
    bgra.convertTo(wide_bgra, CV_16UC4, 256.0, 3);
    cv::bitwise_and(bgr, cv::Scalar::all(0xC0), few_colours);  // at most 4^3 = 64 colours
    cv::bitwise_and(bgra, cv::Scalar::all(0xC0), few_bgra);    // at most 4^4 = 256
    const std::string at = std::to_string(size.width) + "x" + std::to_string(size.height);
    samples.push_back({"gray " + at, MustPng(gray)});
    for (int bits : {1, 2, 4}) {
      samples.push_back(
          {"gray " + std::to_string(bits) + "-bit " + at, MustPng(gray, {.gray_bits = bits})});
    }
    samples.push_back({"gray+alpha " + at, MustPng(gray_alpha)});
    samples.push_back({"rgb " + at, MustPng(bgr)});
    samples.push_back({"rgb interlaced " + at, MustPng(bgr, {.interlaced = true})});
    samples.push_back({"rgba " + at, MustPng(bgra)});
    samples.push_back({"palette " + at, MustPng(few_colours, {.palette = true})});
    samples.push_back({"palette+tRNS " + at, MustPng(few_bgra, {.palette = true})});
    samples.push_back({"16-bit gray " + at, MustPng(wide_gray)});
    samples.push_back({"16-bit rgb " + at, MustPng(wide_bgr)});
    samples.push_back({"16-bit rgba interlaced " + at, MustPng(wide_bgra, {.interlaced = true})});
  }
  return samples;
}

// How far two decodes of the same bytes are apart.
struct Difference {
  bool same_shape = false;
  double max_abs = 0;
  double fraction = 0;  // of the bytes that differ
};

Difference Compare(const cv::Mat& got, const cv::Mat& want) {
  Difference d;
  d.same_shape = got.size() == want.size() && got.type() == want.type();
  if (!d.same_shape) return d;
  cv::Mat diff;
  cv::absdiff(got, want, diff);
  d.max_abs = cv::norm(diff.reshape(1), cv::NORM_INF);
  d.fraction =
      static_cast<double>(cv::countNonZero(diff.reshape(1))) / diff.total() / diff.channels();
  return d;
}

#if CARPOOL_HAVE_IMGCODECS
int ImreadFlags(int channels, int factor) {
  static constexpr int kColor[9] = {
      0, cv::IMREAD_COLOR,          cv::IMREAD_REDUCED_COLOR_2, 0, cv::IMREAD_REDUCED_COLOR_4, 0, 0,
      0, cv::IMREAD_REDUCED_COLOR_8};
  static constexpr int kGray[9] = {0,
                                   cv::IMREAD_GRAYSCALE,
                                   cv::IMREAD_REDUCED_GRAYSCALE_2,
                                   0,
                                   cv::IMREAD_REDUCED_GRAYSCALE_4,
                                   0,
                                   0,
                                   0,
                                   cv::IMREAD_REDUCED_GRAYSCALE_8};
  return (channels == 1 ? kGray[factor] : kColor[factor]) | cv::IMREAD_IGNORE_ORIENTATION;
}

cv::Mat Imdecode(const std::vector<uint8_t>& bytes, int channels, int factor) {
  cv::Mat image = cv::imdecode(bytes, ImreadFlags(channels, factor));
  if (!image.empty() && channels == 3) cv::cvtColor(image, image, cv::COLOR_BGR2RGB);
  return image;
}

TEST(ImageCodecTest, JpegEncoderWritesTheBytesOfImencode) {
  int compared = 0;
  for (const cv::Size size : kSizes) {
    const cv::Mat colour = MakePhoto(size.width, size.height, 5);
    cv::Mat gray, rgb;
    cv::cvtColor(colour, gray, cv::COLOR_BGR2GRAY);
    cv::cvtColor(colour, rgb, cv::COLOR_BGR2RGB);
    for (int quality : {50, 90, 95, 100}) {
      for (bool progressive : {false, true}) {
        SCOPED_TRACE(testing::Message()
                     << size << " q" << quality << " progressive=" << progressive);
        const std::vector<int> params = {cv::IMWRITE_JPEG_QUALITY, quality,
                                         cv::IMWRITE_JPEG_PROGRESSIVE, progressive ? 1 : 0};
        for (const cv::Mat& image : {colour, gray}) {
          std::vector<uint8_t> want;
          ASSERT_TRUE(cv::imencode(".jpg", image, want, params));
          EXPECT_EQ(MustJpeg(image, {quality, true, progressive}), want);
          ++compared;
        }
        Result<std::vector<uint8_t>> from_rgb =
            EncodeJpeg(rgb, ChannelOrder::kRgb, {quality, true, progressive});
        ASSERT_TRUE(from_rgb.ok());
        EXPECT_EQ(*from_rgb, MustJpeg(colour, {quality, true, progressive}));
      }
    }
  }
  EXPECT_EQ(compared, static_cast<int>(kSizes.size()) * 4 * 2 * 2);
}

// Every generated JPEG, decoded to RGB and gray at each reduction, gives imgcodecs' bytes.
TEST(ImageCodecTest, JpegDecodeEqualsImgcodecs) {
  int cases = 0, equal = 0, refused = 0;
  for (const Sample& sample : JpegSamples()) {
    ASSERT_FALSE(sample.bytes.empty()) << sample.name;
    for (int channels : {1, 3}) {
      for (int factor : {1, 2, 4, 8}) {
        SCOPED_TRACE(testing::Message()
                     << sample.name << " channels=" << channels << " factor=" << factor);
        Result<cv::Mat> got = DecodeJpeg(sample.bytes, channels, factor);
        const cv::Mat want = Imdecode(sample.bytes, channels, factor);
        ASSERT_FALSE(want.empty());
        if (!got.ok()) {
          // Only where TurboJPEG cannot pick 1/factor: under 8 pixels on both sides.
          EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument) << got.status().ToString();
          EXPECT_TRUE(factor > 1 && want.cols < 8 && want.rows < 8) << got.status().ToString();
          ++refused;
          continue;
        }
        ++cases;
        const Difference d = Compare(*got, want);
        ASSERT_TRUE(d.same_shape) << got->size() << " vs " << want.size();
        EXPECT_EQ(d.max_abs, 0) << d.fraction * 100 << "% of the bytes differ";
        equal += d.max_abs == 0;
      }
    }
  }
  std::printf(
      "JPEG: %d decodes compared with imgcodecs, %d byte-identical; %d refused "
      "(factor TurboJPEG cannot select)\n",
      cases, equal, refused);
  EXPECT_EQ(cases + refused, static_cast<int>(JpegSamples().size()) * 8);
  EXPECT_GT(cases, 700);
}

TEST(ImageCodecTest, PngDecodeEqualsImgcodecs) {
  std::vector<Sample> samples = PngSamples();
  // imgcodecs' own PNGs too (its writer uses other filters and zlib settings).
  const cv::Mat bgr = MakePhoto(70, 50, 3);
  for (const auto& [name, image] :
       {std::pair<std::string, cv::Mat>{"imencode rgb", bgr}, {"imencode 16-bit rgb", cv::Mat()}}) {
    cv::Mat source = image;
    if (source.empty()) bgr.convertTo(source, CV_16UC3, 250.0);
    std::vector<uint8_t> bytes;
    ASSERT_TRUE(cv::imencode(".png", source, bytes));
    samples.push_back({name, bytes});
  }
  int cases = 0, equal = 0;
  for (const Sample& sample : samples) {
    ASSERT_FALSE(sample.bytes.empty()) << sample.name;
    for (int channels : {1, 3}) {
      SCOPED_TRACE(testing::Message() << sample.name << " channels=" << channels);
      Result<cv::Mat> got = DecodePng(sample.bytes, channels);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      const Difference d = Compare(*got, Imdecode(sample.bytes, channels, 1));
      ASSERT_TRUE(d.same_shape);
      EXPECT_EQ(d.max_abs, 0) << d.fraction * 100 << "% of the bytes differ";
      ++cases;
      equal += d.max_abs == 0;
    }
  }
  std::printf("PNG: %d decodes compared with imgcodecs, %d byte-identical\n", cases, equal);
}

TEST(ImageCodecTest, OtherFormatsGoThroughImgcodecs) {
  const cv::Mat bgr = MakePhoto(33, 21, 4);
  Result<cv::Mat> got = DecodeImage(EncodeBmp(bgr), 3);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  EXPECT_EQ(cv::norm(*got, rgb, cv::NORM_INF), 0);
}
#else
TEST(ImageCodecTest, OtherFormatsNameTheFormatWithoutImgcodecs) {
  Result<cv::Mat> got = DecodeImage(EncodeBmp(MakePhoto(33, 21, 4)), 3);
  ASSERT_EQ(got.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("BMP images are not supported"), std::string::npos);
  EXPECT_NE(got.status().message().find("convert the dataset to JPEG or PNG"), std::string::npos);
}
#endif

TEST(ImageCodecTest, SniffsFormatsBySignature) {
  using namespace std::literals;
  auto sniff = [](std::string_view bytes) {
    return SniffImageFormat(
        std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  };
  EXPECT_EQ(sniff("\xFF\xD8\xFF\xE0"), ImageFormat::kJpeg);
  EXPECT_EQ(sniff("\x89PNG\r\n\x1A\n...."), ImageFormat::kPng);
  EXPECT_EQ(sniff("BM...."), ImageFormat::kBmp);
  EXPECT_EQ(sniff("GIF89a"), ImageFormat::kGif);
  EXPECT_EQ(sniff("RIFF\x10\0\0\0WEBPVP8 "sv), ImageFormat::kWebp);
  EXPECT_EQ(sniff("II*\0"sv), ImageFormat::kTiff);
  EXPECT_EQ(sniff("\0\0\0\x0CjP  \r\n\x87\n"sv), ImageFormat::kJpeg2000);
  EXPECT_EQ(sniff("P6\n"), ImageFormat::kPnm);
  EXPECT_EQ(sniff("\x89PN"), ImageFormat::kUnknown);
  EXPECT_EQ(sniff(""), ImageFormat::kUnknown);
  EXPECT_EQ(ImageFormatName(ImageFormat::kWebp), "WebP");
}

// In every build: each generated file decodes, at the size its header gives, at every factor.
TEST(ImageCodecTest, GeneratedFilesDecodeAtEveryFactor) {
  for (const Sample& sample : JpegSamples()) {
    Result<ImageHeader> header = ReadImageHeader(sample.bytes);
    ASSERT_TRUE(header.ok()) << sample.name << ": " << header.status().ToString();
    for (int channels : {1, 3}) {
      for (int factor : {1, 2, 4, 8}) {
        SCOPED_TRACE(testing::Message()
                     << sample.name << " channels=" << channels << " factor=" << factor);
        Result<cv::Mat> got = DecodeJpeg(sample.bytes, channels, factor);
        const cv::Size want((header->width + factor - 1) / factor,
                            (header->height + factor - 1) / factor);
        if (!got.ok()) {
          EXPECT_TRUE(factor > 1 && header->width < 8 && header->height < 8)
              << got.status().ToString();
          continue;
        }
        EXPECT_EQ(got->size(), want);
        EXPECT_EQ(got->channels(), channels);
      }
    }
  }
  for (const Sample& sample : PngSamples()) {
    Result<ImageHeader> header = ReadImageHeader(sample.bytes);
    ASSERT_TRUE(header.ok()) << sample.name << ": " << header.status().ToString();
    for (int channels : {1, 3}) {
      Result<cv::Mat> got = DecodePng(sample.bytes, channels);
      ASSERT_TRUE(got.ok()) << sample.name << ": " << got.status().ToString();
      EXPECT_EQ(got->size(), cv::Size(header->width, header->height)) << sample.name;
      EXPECT_EQ(got->channels(), channels) << sample.name;
    }
  }
}

// The codecs' own contract, in every build: what goes in comes out.
TEST(ImageCodecTest, PngRoundTripsExactly) {
  const cv::Mat bgr = MakePhoto(45, 31, 8);
  cv::Mat rgb, gray, bgra, wide;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  cv::cvtColor(bgr, gray, cv::COLOR_BGR2GRAY);
  cv::cvtColor(bgr, bgra, cv::COLOR_BGR2BGRA);
  bgr.convertTo(wide, CV_16UC3, 256.0, 200);
  for (const auto& [name, image, want] :
       {std::tuple{"rgb", bgr, rgb}, {"rgba", bgra, rgb}, {"16-bit", wide, rgb}}) {
    SCOPED_TRACE(name);
    Result<cv::Mat> got = DecodePng(MustPng(image), 3);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    const Difference d = Compare(*got, want);
    EXPECT_TRUE(d.same_shape && d.max_abs == 0) << d.fraction * 100 << "% of the bytes differ";
  }
  Result<cv::Mat> got = DecodePng(MustPng(gray), 1);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(cv::norm(*got, gray, cv::NORM_INF), 0);
  cv::Mat few;
  cv::bitwise_and(bgr, cv::Scalar::all(0xC0), few);
  got = DecodePng(MustPng(few, {.palette = true}), 3);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  cv::cvtColor(few, rgb, cv::COLOR_BGR2RGB);
  EXPECT_EQ(cv::norm(*got, rgb, cv::NORM_INF), 0);
  got = DecodePng(MustPng(gray, {.gray_bits = 2}), 1);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  cv::Mat two_bit(1, 256, CV_8UC1), want;
  for (int v = 0; v < 256; ++v) two_bit.at<uint8_t>(v) = static_cast<uint8_t>((v >> 6) * 85);
  cv::LUT(gray, two_bit, want);  // the high 2 bits, which libpng scales back by 85
  EXPECT_EQ(cv::norm(*got, want, cv::NORM_INF), 0);
  EXPECT_EQ(EncodePng(MakePhoto(40, 40, 1), ChannelOrder::kBgr, {.palette = true}).status().code(),
            StatusCode::kInvalidArgument);  // far more than 256 colours
}

TEST(ImageCodecTest, JpegRoundTripIsCloseAndReducesToCeilingSizes) {
  const cv::Mat bgr = MakePhoto(201, 99, 9);
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  const std::vector<uint8_t> jpeg = MustJpeg(bgr, {.quality = 95, .subsample_chroma = false});
  Result<cv::Mat> full = DecodeJpeg(jpeg, 3);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  EXPECT_GT(cv::PSNR(*full, rgb), 30.0);
  for (int factor : {2, 4, 8}) {
    Result<cv::Mat> reduced = DecodeJpeg(jpeg, 1, factor);
    ASSERT_TRUE(reduced.ok()) << reduced.status().ToString();
    EXPECT_EQ(reduced->size(), cv::Size((201 + factor - 1) / factor, (99 + factor - 1) / factor));
  }
  EXPECT_EQ(DecodeJpeg(jpeg, 3, 3).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeJpeg(jpeg, 2).status().code(), StatusCode::kInvalidArgument);
  // 3x3 reduced by 2 is 2x2, which TurboJPEG reaches with 5/8 before 1/2.
  EXPECT_EQ(DecodeJpeg(MustJpeg(MakePhoto(3, 3, 1), {}), 3, 2).status().code(),
            StatusCode::kInvalidArgument);
}

// Every strict prefix of a file is Corruption, from both decoders and through DecodeImage.
TEST(ImageCodecTest, TruncatedInputIsCorruption) {
  const cv::Mat bgr = MakePhoto(40, 30, 10);
  const std::vector<Sample> files = {
      {"jpeg", MustJpeg(bgr, {})},
      {"progressive jpeg", MustJpeg(bgr, {.progressive = true})},
      {"png", MustPng(bgr)},
      {"interlaced png", MustPng(bgr, {.interlaced = true})},
  };
  for (const Sample& file : files) {
    for (size_t length = 0; length < file.bytes.size(); ++length) {
      SCOPED_TRACE(testing::Message()
                   << file.name << " cut to " << length << " of " << file.bytes.size());
      const std::span<const uint8_t> cut(file.bytes.data(), length);
      for (int channels : {1, 3}) {
        Result<cv::Mat> got = DecodeImage(cut, channels);
        ASSERT_EQ(got.status().code(), StatusCode::kCorruption) << got.status().ToString();
        ASSERT_FALSE(got.status().message().empty());
      }
    }
  }
}

// Damaged bytes anywhere: never a crash; either an image of the header's size or Corruption.
TEST(ImageCodecTest, MutatedInputNeverCrashes) {
  const cv::Mat bgr = MakePhoto(48, 40, 11);
  std::mt19937 rng(12);
  for (const Sample& file : {Sample{"jpeg", MustJpeg(bgr, {})}, Sample{"png", MustPng(bgr)}}) {
    int failures = 0;
    for (int trial = 0; trial < 400; ++trial) {
      std::vector<uint8_t> bytes = file.bytes;
      for (int k = 0; k < 1 + trial % 4; ++k)
        bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
      Result<ImageHeader> header = ReadImageHeader(bytes);
      Result<cv::Mat> got = DecodeImage(bytes, 3, trial % 2 == 0 ? 1 : 2);
      if (got.ok()) {
        ASSERT_TRUE(header.ok());
        const int factor = header->format == ImageFormat::kJpeg && trial % 2 == 1 ? 2 : 1;
        EXPECT_EQ(got->size(), cv::Size((header->width + factor - 1) / factor,
                                        (header->height + factor - 1) / factor));
      } else {
        ++failures;
        EXPECT_EQ(got.status().code(), StatusCode::kCorruption) << got.status().ToString();
      }
    }
    EXPECT_GT(failures, 0) << file.name;
  }
}

// Encodes with TurboJPEG at a chosen chroma sub-sampling (TJSAMP_*).
std::vector<uint8_t> JpegWithSampling(const cv::Mat& bgr, int sampling) {
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  tjhandle tj = tjInitCompress();
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(tj, rgb.data, rgb.cols, static_cast<int>(rgb.step), rgb.rows,
                             TJPF_RGB, &buffer, &size, sampling, 90, TJFLAG_ACCURATEDCT);
  EXPECT_EQ(rc, 0) << tjGetErrorStr2(tj);
  std::vector<uint8_t> out(buffer, buffer + (rc == 0 ? size : 0));
  tjFree(buffer);
  tjDestroy(tj);
  return out;
}

// What GPU decode takes, from the header alone, and what it leaves to the CPU with the reason.
TEST(ImageCodecTest, CheckGpuDecodableNamesWhatStaysOnTheCpu) {
  const cv::Mat photo = MakePhoto(96, 64, 4);
  for (int sampling : {TJSAMP_444, TJSAMP_422, TJSAMP_420, TJSAMP_440}) {
    Result<ImageHeader> h = ReadImageHeader(JpegWithSampling(photo, sampling));
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_EQ(h->sof, 0xC0);
    EXPECT_TRUE(h->single_scan);
    EXPECT_TRUE(CheckGpuDecodable(*h).ok()) << sampling << ": " << CheckGpuDecodable(*h).ToString();
  }
  cv::Mat gray;
  cv::cvtColor(photo, gray, cv::COLOR_BGR2GRAY);
  struct Case {
    std::vector<uint8_t> bytes;
    const char* why;
  };
  for (const Case& c : {Case{MustJpeg(photo, {.quality = 90, .progressive = true}), "progressive"},
                        Case{JpegWithSampling(photo, TJSAMP_411), "sampling factors 41 11 11"},
                        Case{MustJpeg(gray, {.quality = 90}), "1 components"},
                        Case{CmykJpeg(photo, 90), "4 components"},
                        Case{MustPng(photo), "PNG"}}) {
    Result<ImageHeader> h = ReadImageHeader(c.bytes);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    const Status s = CheckGpuDecodable(*h);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.why;
    EXPECT_NE(s.message().find(c.why), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace carpool
