#include "server/prepare.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

namespace carpool {
namespace {

enum class Codec { kJpeg, kPng, kOther };

// What the encoded header says. width/height are 0 when the format has no cheap header parse.
struct SourceInfo {
  Codec codec = Codec::kOther;
  int width = 0;
  int height = 0;
};

// Where the prepared pixels come from: resize the decoded image to resized_*, then copy the
// out_* window at (crop_x, crop_y).
struct Geometry {
  int resized_width = 0;
  int resized_height = 0;
  int crop_x = 0;
  int crop_y = 0;
  int out_width = 0;
  int out_height = 0;
};

// Sources larger than this per side are refused before decoding (decompression bombs).
constexpr int kMaxSourceSide = 1 << 15;

int ReadBigEndian16(const uint8_t* p) { return (p[0] << 8) | p[1]; }
uint32_t ReadBigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

bool IsStartOfFrame(uint8_t marker) {
  // SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC).
  return marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
}

// Walks the JPEG marker segments up to the first SOF for the frame size, then checks that an
// end-of-image marker follows the first scan: libjpeg pads a truncated file with gray and only
// warns, so without this check a cut-off file would be cached as a valid image.
Result<SourceInfo> ProbeJpeg(std::span<const uint8_t> d) {
  SourceInfo info{Codec::kJpeg, 0, 0};
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
      info.height = ReadBigEndian16(&d[pos + 5]);
      info.width = ReadBigEndian16(&d[pos + 7]);
      if (info.height == 0 || info.width == 0) {
        return Status::Corruption(fmt::format(
            "JPEG frame header gives size {}x{}; a zero size (DNL marker) is not supported",
            info.width, info.height));
      }
      if (info.width > kMaxSourceSide || info.height > kMaxSourceSide) {
        return Status::Corruption(
            fmt::format("JPEG frame header gives size {}x{}; expected at most "
                        "{} per side",
                        info.width, info.height, kMaxSourceSide));
      }
    }
    if (marker == 0xDA) break;  // start of scan: entropy-coded data follows
    pos += 2 + length;
  }
  if (info.width == 0) return Status::Corruption("JPEG has a scan but no frame header (SOF)");
  // Inside entropy-coded data 0xFF is always followed by 0x00 or a restart marker, so the first
  // FF D9 after the scan header is the end of the image.
  for (const uint8_t* p = d.data() + pos; p + 1 < d.data() + d.size(); ++p) {
    p = static_cast<const uint8_t*>(std::memchr(p, 0xFF, d.data() + d.size() - 1 - p));
    if (p == nullptr) break;
    if (p[1] == 0xD9) return info;
  }
  return Status::Corruption(
      fmt::format("JPEG is truncated: no end-of-image marker in its {} bytes", d.size()));
}

Result<SourceInfo> ProbeSource(std::span<const uint8_t> d) {
  if (d.empty()) return Status::Corruption("record is empty (0 bytes)");
  if (d.size() >= 2 && d[0] == 0xFF && d[1] == 0xD8) return ProbeJpeg(d);
  static constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (d.size() >= 8 && std::memcmp(d.data(), kPngSignature, 8) == 0) {
    if (d.size() < 24 || std::memcmp(&d[12], "IHDR", 4) != 0) {
      return Status::Corruption(fmt::format("PNG of {} bytes has no IHDR header", d.size()));
    }
    const uint32_t w = ReadBigEndian32(&d[16]);
    const uint32_t h = ReadBigEndian32(&d[20]);
    if (w == 0 || h == 0 || w > kMaxSourceSide || h > kMaxSourceSide) {
      return Status::Corruption(fmt::format("PNG header gives size {}x{}; expected 1..{} per side",
                                            w, h, kMaxSourceSide));
    }
    return SourceInfo{Codec::kPng, static_cast<int>(w), static_cast<int>(h)};
  }
  return SourceInfo{};
}

Status CheckSpec(const PrepareSpec& spec) {
  if (spec.channels != 1 && spec.channels != 3) {
    return Status::InvalidArgument(
        fmt::format("prepare spec \"{}\": channels must be 1 or 3", spec.ToString()));
  }
  if (spec.raw && (spec.resize > 0 || spec.crop > 0)) {
    return Status::InvalidArgument(fmt::format(
        "prepare spec \"{}\": raw cannot be combined with resize or crop", spec.ToString()));
  }
  if (spec.resize < 0 || spec.crop < 0) {
    return Status::InvalidArgument(fmt::format(
        "prepare spec: resize={} crop={} must not be negative", spec.resize, spec.crop));
  }
  return Status::OK();
}

// The shorter side goes to spec.resize; the longer side keeps the aspect ratio, rounded half up.
Result<Geometry> GeometryFor(const PrepareSpec& spec, int src_width, int src_height) {
  Geometry g{src_width, src_height, 0, 0, src_width, src_height};
  if (spec.resize > 0) {
    const int64_t shorter = std::min(src_width, src_height);
    const int64_t longer = std::max(src_width, src_height);
    const int64_t scaled = std::max<int64_t>(1, (longer * spec.resize + shorter / 2) / shorter);
    if (scaled > kMaxPrepareSide) {
      return Status::InvalidArgument(fmt::format(
          "image {}x{} resized to shorter side {} would be {} long, over the limit {}; use a crop "
          "or drop this image",
          src_width, src_height, spec.resize, scaled, kMaxPrepareSide));
    }
    g.resized_width = src_width <= src_height ? spec.resize : static_cast<int>(scaled);
    g.resized_height = src_width <= src_height ? static_cast<int>(scaled) : spec.resize;
  }
  g.out_width = g.resized_width;
  g.out_height = g.resized_height;
  if (spec.crop > 0) {
    if (spec.crop > g.resized_width || spec.crop > g.resized_height) {
      return Status::InvalidArgument(fmt::format(
          "image {}x{} (after resize={}: {}x{}) is smaller than crop={}; use resize >= crop",
          src_width, src_height, spec.resize, g.resized_width, g.resized_height, spec.crop));
    }
    g.crop_x = (g.resized_width - spec.crop) / 2;
    g.crop_y = (g.resized_height - spec.crop) / 2;
    g.out_width = g.out_height = spec.crop;
  }
  return g;
}

Result<cv::Mat> Decode(std::span<const uint8_t> encoded, int channels, int factor) {
  int flags = channels == 1 ? cv::IMREAD_GRAYSCALE : cv::IMREAD_COLOR;
  if (factor == 2)
    flags = channels == 1 ? cv::IMREAD_REDUCED_GRAYSCALE_2 : cv::IMREAD_REDUCED_COLOR_2;
  if (factor == 4)
    flags = channels == 1 ? cv::IMREAD_REDUCED_GRAYSCALE_4 : cv::IMREAD_REDUCED_COLOR_4;
  if (factor == 8)
    flags = channels == 1 ? cv::IMREAD_REDUCED_GRAYSCALE_8 : cv::IMREAD_REDUCED_COLOR_8;
  // EXIF orientation is ignored, as PIL-based loaders (torchvision ImageFolder) do, and so that
  // the decoded size always matches the frame header.
  flags |= cv::IMREAD_IGNORE_ORIENTATION;
  cv::Mat image;
  try {
    const cv::Mat buffer(1, static_cast<int>(encoded.size()), CV_8UC1,
                         const_cast<uint8_t*>(encoded.data()));
    image = cv::imdecode(buffer, flags);
  } catch (const std::exception& e) {
    return Status::Corruption(
        fmt::format("decoder failed on {} bytes: {}", encoded.size(), e.what()));
  }
  if (image.empty()) {
    return Status::Corruption(
        fmt::format("OpenCV could not decode the {} bytes (not a supported image, or damaged)",
                    encoded.size()));
  }
  if (image.type() != (channels == 1 ? CV_8UC1 : CV_8UC3)) {
    return Status::Internal(fmt::format("decoder returned OpenCV type {}", image.type()));
  }
  return image;
}

Result<PreparedShape> PrepareRaw(const PrepareSpec& spec, std::span<const uint8_t> encoded,
                                 std::span<uint8_t>* dst, PreparedShape raw_shape) {
  if (raw_shape.channels == 0) raw_shape.channels = spec.channels;
  if (raw_shape.empty()) {
    return Status::InvalidArgument(fmt::format(
        "prepare spec \"{}\" needs the record's height and width (got {}x{}); pass them from the "
        "source, e.g. the IDX header",
        spec.ToString(), raw_shape.height, raw_shape.width));
  }
  if (raw_shape.bytes() != encoded.size()) {
    return Status::Corruption(fmt::format("raw record is {} bytes, expected {}x{}x{} = {}",
                                          encoded.size(), raw_shape.height, raw_shape.width,
                                          raw_shape.channels, raw_shape.bytes()));
  }
  if (dst != nullptr) {
    if (dst->size() < encoded.size()) {
      return Status::InvalidArgument(fmt::format("destination holds {} bytes, the record needs {}",
                                                 dst->size(), encoded.size()));
    }
    std::memcpy(dst->data(), encoded.data(), encoded.size());
  }
  return raw_shape;
}

// The frame size, from the header when there is one, else by decoding the whole image.
Result<SourceInfo> SourceSize(std::span<const uint8_t> encoded, int channels) {
  Result<SourceInfo> info = ProbeSource(encoded);
  if (!info.ok() || info->width > 0) return info;
  Result<cv::Mat> image = Decode(encoded, channels, 1);
  if (!image.ok()) return image.status();
  return SourceInfo{Codec::kOther, image->cols, image->rows};
}

}  // namespace

int ReducedDecodeFactor(const PrepareSpec& spec, int src_width, int src_height) {
  if (spec.raw || spec.resize <= 0) return 1;
  const int shorter = std::min(src_width, src_height);
  for (int factor : {8, 4, 2}) {
    // libjpeg rounds a reduced size up; requiring the rounded-down size keeps a margin.
    if (shorter / factor >= spec.resize) return factor;
  }
  return 1;
}

Result<PreparedShape> PreparedShapeFor(const PrepareSpec& spec, std::span<const uint8_t> encoded,
                                       PreparedShape raw_shape) {
  if (Status s = CheckSpec(spec); !s.ok()) return s;
  if (spec.raw) return PrepareRaw(spec, encoded, nullptr, raw_shape);
  Result<SourceInfo> info = SourceSize(encoded, spec.channels);
  if (!info.ok()) return info.status();
  Result<Geometry> g = GeometryFor(spec, info->width, info->height);
  if (!g.ok()) return g.status();
  return PreparedShape{g->out_height, g->out_width, spec.channels};
}

Result<PreparedShape> PrepareInto(const PrepareSpec& spec, std::span<const uint8_t> encoded,
                                  std::span<uint8_t> dst, PreparedShape raw_shape) {
  if (Status s = CheckSpec(spec); !s.ok()) return s;
  if (spec.raw) return PrepareRaw(spec, encoded, &dst, raw_shape);
  Result<SourceInfo> info = ProbeSource(encoded);
  if (!info.ok()) return info.status();
  const int factor =
      info->codec == Codec::kJpeg ? ReducedDecodeFactor(spec, info->width, info->height) : 1;
  Result<cv::Mat> decoded = Decode(encoded, spec.channels, factor);
  if (!decoded.ok()) return decoded.status();
  if (info->width == 0) {  // no cheap header: the decoded image is the truth
    info->width = decoded->cols;
    info->height = decoded->rows;
  }
  const int want_width = (info->width + factor - 1) / factor;
  const int want_height = (info->height + factor - 1) / factor;
  if (decoded->cols != want_width || decoded->rows != want_height) {
    return Status::Corruption(fmt::format(
        "decoded image is {}x{} but its header says {}x{} (reduced by {}: {}x{})", decoded->cols,
        decoded->rows, info->width, info->height, factor, want_width, want_height));
  }
  // The geometry comes from the full-resolution size, so the shape does not depend on the factor.
  Result<Geometry> g = GeometryFor(spec, info->width, info->height);
  if (!g.ok()) return g.status();
  const PreparedShape shape{g->out_height, g->out_width, spec.channels};
  if (dst.size() < shape.bytes()) {
    return Status::InvalidArgument(
        fmt::format("destination holds {} bytes, the prepared {}x{}x{} image needs {}", dst.size(),
                    shape.height, shape.width, shape.channels, shape.bytes()));
  }
  try {
    cv::Mat resized = *decoded;
    if (resized.cols != g->resized_width || resized.rows != g->resized_height) {
      const bool shrink = g->resized_width <= resized.cols && g->resized_height <= resized.rows;
      cv::resize(*decoded, resized, cv::Size(g->resized_width, g->resized_height), 0, 0,
                 shrink ? cv::INTER_AREA : cv::INTER_LINEAR);
    }
    const cv::Mat window = resized(cv::Rect(g->crop_x, g->crop_y, g->out_width, g->out_height));
    cv::Mat out(g->out_height, g->out_width, spec.channels == 1 ? CV_8UC1 : CV_8UC3, dst.data());
    if (spec.channels == 3) {
      cv::cvtColor(window, out, cv::COLOR_BGR2RGB);
    } else {
      window.copyTo(out);
    }
    if (out.data != dst.data()) return Status::Internal("OpenCV reallocated the output buffer");
  } catch (const std::exception& e) {
    return Status::Internal(fmt::format("resize/crop of a {}x{} image failed: {}", decoded->cols,
                                        decoded->rows, e.what()));
  }
  return shape;
}

Result<PreparedImage> PrepareSample(const PrepareSpec& spec, std::span<const uint8_t> encoded,
                                    PreparedShape raw_shape) {
  Result<PreparedShape> shape = PreparedShapeFor(spec, encoded, raw_shape);
  if (!shape.ok()) return shape.status();
  PreparedImage image{*shape, std::vector<uint8_t>(shape->bytes())};
  Result<PreparedShape> written = PrepareInto(spec, encoded, image.pixels, raw_shape);
  if (!written.ok()) return written.status();
  return image;
}

}  // namespace carpool
