// Format sniffing, header reading, JPEG through TurboJPEG, and the imgcodecs fallback. PNG is in
// image_codec_png.cc.
#include "server/image_codec.h"

#include <fmt/core.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <opencv2/imgproc.hpp>
#if CARPOOL_HAVE_IMGCODECS
#include <opencv2/imgcodecs.hpp>
#endif

namespace carpool {
namespace {

struct TjHandleDeleter {
  void operator()(void* handle) const { tjDestroy(handle); }
};
using TjHandle = std::unique_ptr<void, TjHandleDeleter>;

struct TjBufferDeleter {
  void operator()(unsigned char* buffer) const { tjFree(buffer); }
};

int ReadBigEndian16(const uint8_t* p) { return (p[0] << 8) | p[1]; }
uint32_t ReadBigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

bool StartsWith(std::span<const uint8_t> d, std::string_view magic, size_t offset = 0) {
  return d.size() >= offset + magic.size() &&
         std::memcmp(d.data() + offset, magic.data(), magic.size()) == 0;
}

bool IsStartOfFrame(uint8_t marker) {
  // SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC).
  return marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
}

// Walks the JPEG marker segments up to the first scan, taking the frame size from the SOF, then
// checks that an end-of-image marker follows the first scan.
Result<ImageHeader> ReadJpegHeader(std::span<const uint8_t> d) {
  ImageHeader header{ImageFormat::kJpeg, 0, 0, 0};
  size_t pos = 2;
  while (true) {
    while (pos < d.size() && d[pos] == 0xFF && pos + 1 < d.size() && d[pos + 1] == 0xFF) ++pos;
    if (pos + 4 > d.size()) {
      return Status::Corruption(
          fmt::format("JPEG truncated in its headers at byte {} of {}", pos, d.size()));
    }
    if (d[pos] != 0xFF) {
      return Status::Corruption(
          fmt::format("JPEG has no marker at byte {} (found 0x{:02X})", pos, d[pos]));
    }
    const uint8_t marker = d[pos + 1];
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {  // parameterless markers
      pos += 2;
      continue;
    }
    if (marker == 0xD9) return Status::Corruption("JPEG ends before its first scan");
    const size_t length = static_cast<size_t>(ReadBigEndian16(&d[pos + 2]));
    if (length < 2 || pos + 2 + length > d.size()) {
      return Status::Corruption(
          fmt::format("JPEG segment 0x{:02X} at byte {} has length {} past the end ({} bytes)",
                      marker, pos, length, d.size()));
    }
    if (IsStartOfFrame(marker)) {
      if (length < 8) return Status::Corruption("JPEG frame header is too short");
      header.height = ReadBigEndian16(&d[pos + 5]);
      header.width = ReadBigEndian16(&d[pos + 7]);
      header.components = d[pos + 9];
      header.sof = marker;
      if (length < 8 + 3 * static_cast<size_t>(header.components)) {
        return Status::Corruption(fmt::format(
            "JPEG frame header of {} bytes is too short for its {} components", length,
            header.components));
      }
      const uint8_t* component = &d[pos + 10];
      const bool rgb_ids = header.components == 3 && component[0] == 'R' && component[3] == 'G' &&
                           component[6] == 'B';
      header.rgb_coded = header.rgb_coded || rgb_ids;
      for (int c = 0; c < std::min(header.components, 4); ++c) {
        header.sampling[c] = component[3 * c + 1];
      }
      if (header.height == 0 || header.width == 0) {
        return Status::Corruption(fmt::format(
            "JPEG frame header gives size {}x{}; a zero size (DNL marker) is not supported",
            header.width, header.height));
      }
      if (header.width > kMaxImageSide || header.height > kMaxImageSide) {
        return Status::Corruption(
            fmt::format("JPEG frame header gives size {}x{}; expected at most {} per side",
                        header.width, header.height, kMaxImageSide));
      }
    }
    // Adobe APP14 with transform 0: three components are RGB, not YCbCr.
    if (marker == 0xEE && length >= 14 && std::memcmp(&d[pos + 4], "Adobe", 5) == 0 &&
        d[pos + 2 + 11] == 0) {
      header.rgb_coded = true;
    }
    if (marker == 0xDA) {  // start of scan: entropy-coded data follows
      // One interleaved scan holds every component; otherwise more scans follow.
      header.single_scan = length >= 3 && d[pos + 4] == header.components;
      break;
    }
    pos += 2 + length;
  }
  if (header.width == 0) return Status::Corruption("JPEG has a scan but no frame header (SOF)");
  // Inside entropy-coded data 0xFF is always followed by 0x00 or a restart marker, so the first
  // FF D9 after the scan header is the end of the image.
  for (const uint8_t* p = d.data() + pos; p + 1 < d.data() + d.size(); ++p) {
    p = static_cast<const uint8_t*>(std::memchr(p, 0xFF, d.data() + d.size() - 1 - p));
    if (p == nullptr) break;
    if (p[1] == 0xD9) return header;
    if (p[1] == 0xDA && p != d.data() + pos) header.single_scan = false;  // a later scan
  }
  return Status::Corruption(
      fmt::format("JPEG is truncated: no end-of-image marker in its {} bytes", d.size()));
}

Result<ImageHeader> ReadPngHeader(std::span<const uint8_t> d) {
  if (d.size() < 26 || !StartsWith(d, "IHDR", 12)) {
    return Status::Corruption(fmt::format("PNG of {} bytes has no IHDR header", d.size()));
  }
  const uint32_t w = ReadBigEndian32(&d[16]);
  const uint32_t h = ReadBigEndian32(&d[20]);
  if (w == 0 || h == 0 || w > kMaxImageSide || h > kMaxImageSide) {
    return Status::Corruption(
        fmt::format("PNG header gives size {}x{}; expected 1..{} per side", w, h, kMaxImageSide));
  }
  // Colour type (byte 25): 0 gray, 2 RGB, 3 palette, 4 gray + alpha, 6 RGBA.
  static constexpr int kChannels[7] = {1, 0, 3, 3, 2, 0, 4};
  const int components = d[25] <= 6 ? kChannels[d[25]] : 0;
  if (components == 0) {
    return Status::Corruption(
        fmt::format("PNG header gives colour type {}; expected 0, 2, 3, 4 or 6", d[25]));
  }
  return ImageHeader{ImageFormat::kPng, static_cast<int>(w), static_cast<int>(h), components};
}

// OpenCV imgcodecs' CMYK conversion (icvCvt_CMYK2BGR_8u_C4C3R and ..._C4C1R in its utils.cpp),
// so that CMYK and YCCK JPEGs give its bytes; RGB order here. libjpeg's CMYK output is Adobe's
// inverted CMYK, which the formula expects.
cv::Mat ConvertCmyk(const cv::Mat& cmyk, int channels) {
  constexpr int kShift = 14;
  constexpr int kRed = static_cast<int>(0.299 * (1 << kShift) + 0.5);
  constexpr int kGreen = static_cast<int>(0.587 * (1 << kShift) + 0.5);
  constexpr int kBlue = (1 << kShift) - kRed - kGreen;
  cv::Mat out(cmyk.rows, cmyk.cols, channels == 1 ? CV_8UC1 : CV_8UC3);
  for (int y = 0; y < cmyk.rows; ++y) {
    const uint8_t* src = cmyk.ptr<uint8_t>(y);
    uint8_t* dst = out.ptr<uint8_t>(y);
    for (int x = 0; x < cmyk.cols; ++x, src += 4) {
      const int k = src[3];
      const int r = k - (((255 - src[0]) * k) >> 8);
      const int g = k - (((255 - src[1]) * k) >> 8);
      const int b = k - (((255 - src[2]) * k) >> 8);
      if (channels == 1) {
        dst[x] = static_cast<uint8_t>((b * kBlue + g * kGreen + r * kRed + (1 << (kShift - 1))) >>
                                      kShift);
      } else {
        dst[3 * x] = static_cast<uint8_t>(r);
        dst[3 * x + 1] = static_cast<uint8_t>(g);
        dst[3 * x + 2] = static_cast<uint8_t>(b);
      }
    }
  }
  return out;
}

Result<cv::Mat> DecodeWithImgcodecs([[maybe_unused]] std::span<const uint8_t> encoded,
                                    ImageFormat format, [[maybe_unused]] int channels) {
#if CARPOOL_HAVE_IMGCODECS
  cv::Mat image;
  try {
    const cv::Mat buffer(1, static_cast<int>(encoded.size()), CV_8UC1,
                         const_cast<uint8_t*>(encoded.data()));
    // EXIF orientation is ignored, as PIL-based loaders (torchvision ImageFolder) do.
    image = cv::imdecode(buffer, (channels == 1 ? cv::IMREAD_GRAYSCALE : cv::IMREAD_COLOR) |
                                     cv::IMREAD_IGNORE_ORIENTATION);
    if (!image.empty() && channels == 3) cv::cvtColor(image, image, cv::COLOR_BGR2RGB);
  } catch (const std::exception& e) {
    return Status::Corruption(fmt::format("OpenCV imgcodecs failed on a {} of {} bytes: {}",
                                          ImageFormatName(format), encoded.size(), e.what()));
  }
  if (image.empty()) {
    return Status::Corruption(
        fmt::format("OpenCV could not decode the {} bytes (format: {}; not a supported image, or "
                    "damaged)",
                    encoded.size(), ImageFormatName(format)));
  }
  if (image.type() != (channels == 1 ? CV_8UC1 : CV_8UC3)) {
    return Status::Internal(fmt::format("imgcodecs returned OpenCV type {}", image.type()));
  }
  return image;
#else
  if (format == ImageFormat::kUnknown) {
    return Status::Corruption(fmt::format(
        "record of {} bytes is not a JPEG or PNG (no known image signature); this build decodes "
        "only JPEG and PNG",
        encoded.size()));
  }
  return Status::InvalidArgument(fmt::format(
      "{} images are not supported by this build of carpool (built without OpenCV imgcodecs, "
      "e.g. the portable bundle); convert the dataset to JPEG or PNG, or use a build with "
      "-DCARPOOL_WITH_IMGCODECS=ON",
      ImageFormatName(format)));
#endif
}

}  // namespace

ImageFormat SniffImageFormat(std::span<const uint8_t> d) {
  if (StartsWith(d, "\xFF\xD8")) return ImageFormat::kJpeg;
  if (StartsWith(d, "\x89PNG\r\n\x1A\n")) return ImageFormat::kPng;
  if (StartsWith(d, "BM")) return ImageFormat::kBmp;
  if (StartsWith(d, "GIF87a") || StartsWith(d, "GIF89a")) return ImageFormat::kGif;
  if (StartsWith(d, "RIFF") && StartsWith(d, "WEBP", 8)) return ImageFormat::kWebp;
  if (StartsWith(d, std::string_view("II*\0", 4)) || StartsWith(d, std::string_view("MM\0*", 4))) {
    return ImageFormat::kTiff;
  }
  if (d.size() >= 2 && d[0] == 'P' && d[1] >= '1' && d[1] <= '7') return ImageFormat::kPnm;
  if (StartsWith(d, std::string_view("\0\0\0\x0CjP  \r\n\x87\n", 12)) ||
      StartsWith(d, "\xFF\x4F\xFF\x51")) {
    return ImageFormat::kJpeg2000;
  }
  if (StartsWith(d, "\x76\x2F\x31\x01")) return ImageFormat::kExr;
  return ImageFormat::kUnknown;
}

std::string_view ImageFormatName(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kBmp:
      return "BMP";
    case ImageFormat::kGif:
      return "GIF";
    case ImageFormat::kWebp:
      return "WebP";
    case ImageFormat::kTiff:
      return "TIFF";
    case ImageFormat::kPnm:
      return "PNM";
    case ImageFormat::kJpeg2000:
      return "JPEG 2000";
    case ImageFormat::kExr:
      return "OpenEXR";
    case ImageFormat::kUnknown:
      break;
  }
  return "unknown format";
}

bool HaveImgcodecs() { return CARPOOL_HAVE_IMGCODECS != 0; }

Result<ImageHeader> ReadImageHeader(std::span<const uint8_t> encoded) {
  if (encoded.empty()) return Status::Corruption("record is empty (0 bytes)");
  const ImageFormat format = SniffImageFormat(encoded);
  if (format == ImageFormat::kJpeg) return ReadJpegHeader(encoded);
  if (format == ImageFormat::kPng) return ReadPngHeader(encoded);
  return ImageHeader{format, 0, 0, 0};
}

Result<cv::Mat> DecodeJpeg(std::span<const uint8_t> encoded, int channels, int factor,
                           bool fast_upsample) {
  if (channels != 1 && channels != 3) {
    return Status::InvalidArgument(
        fmt::format("JPEG decode to {} channels; expected 1 or 3", channels));
  }
  if (factor != 1 && factor != 2 && factor != 4 && factor != 8) {
    return Status::InvalidArgument(
        fmt::format("JPEG reduction factor {}; expected 1, 2, 4 or 8", factor));
  }
  Result<ImageHeader> header = ReadImageHeader(encoded);
  if (!header.ok()) return header.status();
  if (header->format != ImageFormat::kJpeg) {
    return Status::Corruption(fmt::format("record of {} bytes is not a JPEG (format: {})",
                                          encoded.size(), ImageFormatName(header->format)));
  }
  const int width = (header->width + factor - 1) / factor;
  const int height = (header->height + factor - 1) / factor;
  // TurboJPEG takes the largest of its scaling factors (2/1 down to 1/8 in steps of 1/8) whose
  // output fits width x height. That is 1/factor whenever a side is at least 8 pixels.
  int count = 0;
  const tjscalingfactor* factors = tjGetScalingFactors(&count);
  for (int i = 0; factors != nullptr && i < count; ++i) {
    if (TJSCALED(header->width, factors[i]) > width ||
        TJSCALED(header->height, factors[i]) > height)
      continue;
    if (factors[i].num != 1 || factors[i].denom != factor) {
      return Status::InvalidArgument(fmt::format(
          "JPEG of {}x{} cannot be reduced by exactly {} (TurboJPEG would scale by {}/{}); use "
          "factor 1 for images under 8 pixels a side",
          header->width, header->height, factor, factors[i].num, factors[i].denom));
    }
    break;
  }
  const bool cmyk = header->components == 4;  // CMYK or YCCK: libjpeg outputs CMYK
  cv::Mat out(height, width, cmyk ? CV_8UC4 : channels == 1 ? CV_8UC1 : CV_8UC3);
  const int pixel_format = cmyk ? TJPF_CMYK : channels == 1 ? TJPF_GRAY : TJPF_RGB;
  TjHandle tj(tjInitDecompress());
  if (tj == nullptr) {
    return Status::Internal(fmt::format("TurboJPEG init failed: {}", tjGetErrorStr2(nullptr)));
  }
  // Warnings (a corrupt Huffman code, extraneous bytes) still give an image, as in imgcodecs.
  if (tjDecompress2(tj.get(), encoded.data(), encoded.size(), out.data, width,
                    static_cast<int>(out.step), height, pixel_format,
                    TJFLAG_LIMITSCANS |
                        (fast_upsample ? TJFLAG_FASTUPSAMPLE | TJFLAG_ACCURATEDCT : 0)) != 0 &&
      tjGetErrorCode(tj.get()) != TJERR_WARNING) {
    return Status::Corruption(fmt::format("JPEG of {}x{} ({} bytes) does not decode: {}",
                                          header->width, header->height, encoded.size(),
                                          tjGetErrorStr2(tj.get())));
  }
  if (cmyk) return ConvertCmyk(out, channels);
  return out;
}

Status CheckGpuDecodable(const ImageHeader& h) {
  auto refuse = [&](std::string_view why) {
    return Status::InvalidArgument(fmt::format("{}x{} {}: decoded on the CPU", h.width, h.height,
                                               why));
  };
  if (h.format != ImageFormat::kJpeg) return refuse(ImageFormatName(h.format));
  if (h.sof == 0xC2 || h.sof == 0xC6 || h.sof == 0xCA || h.sof == 0xCE) {
    return refuse("progressive JPEG");
  }
  if (h.sof == 0xC3 || h.sof == 0xC7 || h.sof == 0xCB || h.sof == 0xCF) {
    return refuse("lossless JPEG");
  }
  if (h.sof != 0xC0 && h.sof != 0xC1) return refuse(fmt::format("JPEG with SOF 0x{:02X}", h.sof));
  if (h.components != 3) return refuse(fmt::format("JPEG of {} components", h.components));
  if (h.rgb_coded) return refuse("RGB-coded JPEG");
  const uint8_t y = h.sampling[0];
  if ((y != 0x11 && y != 0x21 && y != 0x22 && y != 0x12) || h.sampling[1] != 0x11 ||
      h.sampling[2] != 0x11) {
    return refuse(fmt::format("JPEG with sampling factors {:02X} {:02X} {:02X}", y,
                              h.sampling[1], h.sampling[2]));
  }
  if (!h.single_scan) return refuse("JPEG of several scans");
  return Status::OK();
}

Result<cv::Mat> DecodeImage(std::span<const uint8_t> encoded, int channels, int jpeg_factor,
                            bool jpeg_fast_upsample) {
  if (channels != 1 && channels != 3) {
    return Status::InvalidArgument(fmt::format("decode to {} channels; expected 1 or 3", channels));
  }
  if (encoded.empty()) return Status::Corruption("record is empty (0 bytes)");
  const ImageFormat format = SniffImageFormat(encoded);
  if (format == ImageFormat::kJpeg) {
    return DecodeJpeg(encoded, channels, jpeg_factor, jpeg_fast_upsample);
  }
  if (format == ImageFormat::kPng) return DecodePng(encoded, channels);
  return DecodeWithImgcodecs(encoded, format, channels);
}

Result<std::vector<uint8_t>> EncodeJpeg(const cv::Mat& image, ChannelOrder order,
                                        const JpegEncodeOptions& options) {
  if (image.empty() || (image.type() != CV_8UC1 && image.type() != CV_8UC3)) {
    return Status::InvalidArgument(fmt::format(
        "JPEG encode of a {}x{} image of OpenCV type {}; expected a non-empty CV_8UC1 or CV_8UC3",
        image.cols, image.rows, image.type()));
  }
  if (options.quality < 1 || options.quality > 100) {
    return Status::InvalidArgument(
        fmt::format("JPEG quality {}; expected 1..100", options.quality));
  }
  const bool gray = image.channels() == 1;
  const int pixel_format = gray ? TJPF_GRAY : order == ChannelOrder::kRgb ? TJPF_RGB : TJPF_BGR;
  const int subsampling = gray ? TJSAMP_GRAY : options.subsample_chroma ? TJSAMP_420 : TJSAMP_444;
  // libjpeg's default DCT is the accurate one; TurboJPEG's default is the fast one.
  const int flags = TJFLAG_ACCURATEDCT | (options.progressive ? TJFLAG_PROGRESSIVE : 0);
  TjHandle tj(tjInitCompress());
  if (tj == nullptr) {
    return Status::Internal(fmt::format("TurboJPEG init failed: {}", tjGetErrorStr2(nullptr)));
  }
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  const int rc =
      tjCompress2(tj.get(), image.data, image.cols, static_cast<int>(image.step), image.rows,
                  pixel_format, &buffer, &size, subsampling, options.quality, flags);
  const std::unique_ptr<unsigned char, TjBufferDeleter> owned(buffer);
  if (rc != 0) {
    return Status::Internal(fmt::format("JPEG encode of a {}x{} image failed: {}", image.cols,
                                        image.rows, tjGetErrorStr2(tj.get())));
  }
  return std::vector<uint8_t>(buffer, buffer + size);
}

}  // namespace carpool
