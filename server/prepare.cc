#include "server/prepare.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include "server/area_resize.h"
#include "server/exact_resize.h"
#include "server/image_codec.h"

namespace carpool {

// The shorter side goes to spec.resize; the longer side keeps the aspect ratio, rounded half up.
Result<ResizeCropGeometry> ResizeCropFor(const PrepareSpec& spec, int src_width, int src_height) {
  ResizeCropGeometry g{src_width, src_height, src_width, src_height, 0, 0, src_width, src_height};
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

namespace {

Status CheckSpec(const PrepareSpec& spec) {
  if (spec.channels != 1 && spec.channels != 3) {
    return Status::InvalidArgument(
        fmt::format("prepare spec \"{}\": channels must be 1 or 3", spec.ToString()));
  }
  if (spec.raw && (spec.resize > 0 || spec.crop > 0)) {
    return Status::InvalidArgument(fmt::format(
        "prepare spec \"{}\": raw cannot be combined with resize or crop", spec.ToString()));
  }
  if (spec.gpu_decode && (spec.raw || spec.channels != 3)) {
    return Status::InvalidArgument(fmt::format(
        "prepare spec \"{}\": decode=gpu needs RGB images (channels=3, not raw)",
        spec.ToString()));
  }
  if (spec.resize < 0 || spec.crop < 0) {
    return Status::InvalidArgument(fmt::format(
        "prepare spec: resize={} crop={} must not be negative", spec.resize, spec.crop));
  }
  return Status::OK();
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

// InvalidArgument when dst cannot hold the pixels of `shape`.
Status CheckRoom(const PreparedShape& shape, std::span<const uint8_t> dst) {
  if (dst.size() >= shape.bytes()) return Status::OK();
  return Status::InvalidArgument(
      fmt::format("destination holds {} bytes, the prepared {}x{}x{} image needs {}", dst.size(),
                  shape.height, shape.width, shape.channels, shape.bytes()));
}

// The frame size, from the header when there is one, else by decoding the whole image.
Result<ImageHeader> SourceSize(std::span<const uint8_t> encoded, int channels) {
  Result<ImageHeader> header = ReadImageHeader(encoded);
  if (!header.ok() || header->width > 0) return header;
  Result<cv::Mat> image = DecodeImage(encoded, channels);
  if (!image.ok()) return image.status();
  return ImageHeader{header->format, image->cols, image->rows, image->channels()};
}

}  // namespace

int ReducedDecodeFactor(const PrepareSpec& spec, int src_width, int src_height) {
  // Under 8 pixels on both sides TurboJPEG cannot be made to pick 1/factor (image_codec.h).
  if (spec.raw || spec.resize <= 0 || std::max(src_width, src_height) < 8) return 1;
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
  Result<ImageHeader> info = SourceSize(encoded, spec.channels);
  if (!info.ok()) return info.status();
  Result<ResizeCropGeometry> g = ResizeCropFor(spec, info->width, info->height);
  if (!g.ok()) return g.status();
  PreparedShape shape{g->out_height, g->out_width, spec.channels};
  if (spec.gpu_decode && CheckGpuDecodable(*info).ok()) {
    shape.encoded_bytes = static_cast<uint32_t>(encoded.size());
  }
  return shape;
}

namespace {

// decode=gpu on the CPU: full-size decode with replicated chroma, then the exact box filter.
Result<PreparedShape> PrepareGpuPixelsInto(const PrepareSpec& spec,
                                           std::span<const uint8_t> encoded,
                                           std::span<uint8_t> dst) {
  Result<cv::Mat> decoded =
      DecodeImage(encoded, spec.channels, /*jpeg_factor=*/1, /*jpeg_fast_upsample=*/true);
  if (!decoded.ok()) return decoded.status();
  Result<ResizeCropGeometry> g = ResizeCropFor(spec, decoded->cols, decoded->rows);
  if (!g.ok()) return g.status();
  const PreparedShape shape{g->out_height, g->out_width, spec.channels};
  if (Status s = CheckRoom(shape, dst); !s.ok()) return s;
  ExactResizeCrop(*g, decoded->data, decoded->step, spec.channels, dst.data());
  return shape;
}

}  // namespace

Result<PreparedImage> PrepareGpuPixelsOnCpu(const PrepareSpec& spec,
                                           std::span<const uint8_t> encoded) {
  if (!spec.gpu_decode) {
    return Status::InvalidArgument(
        fmt::format("prepare spec \"{}\" is not a decode=gpu spec", spec.ToString()));
  }
  Result<PreparedShape> shape = PreparedShapeFor(spec, encoded);
  if (!shape.ok()) return shape.status();
  PreparedImage image{shape->pixels(), std::vector<uint8_t>(shape->bytes())};
  Result<PreparedShape> written = PrepareGpuPixelsInto(spec, encoded, image.pixels);
  if (!written.ok()) return written.status();
  if (!(*written == image.shape)) {
    return Status::Corruption(fmt::format(
        "decoded image gives {}x{} but its header said {}x{}", written->width, written->height,
        image.shape.width, image.shape.height));
  }
  return image;
}

Result<PreparedShape> PrepareInto(const PrepareSpec& spec, std::span<const uint8_t> encoded,
                                  std::span<uint8_t> dst, PreparedShape raw_shape) {
  if (Status s = CheckSpec(spec); !s.ok()) return s;
  if (spec.raw) return PrepareRaw(spec, encoded, &dst, raw_shape);
  Result<ImageHeader> info = ReadImageHeader(encoded);
  if (!info.ok()) return info.status();
  if (spec.gpu_decode) {
    if (CheckGpuDecodable(*info).ok()) {  // the encoded tier: the GPU decodes it
      // The header just read gives the shape: no second walk of the file.
      Result<ResizeCropGeometry> g = ResizeCropFor(spec, info->width, info->height);
      if (!g.ok()) return g.status();
      const PreparedShape shape{g->out_height, g->out_width, spec.channels,
                                static_cast<uint32_t>(encoded.size())};
      if (dst.size() < encoded.size()) {
        return Status::InvalidArgument(fmt::format(
            "destination holds {} bytes, the encoded JPEG needs {}", dst.size(), encoded.size()));
      }
      std::memcpy(dst.data(), encoded.data(), encoded.size());
      return shape;
    }
    return PrepareGpuPixelsInto(spec, encoded, dst);
  }
  const int factor =
      info->format == ImageFormat::kJpeg ? ReducedDecodeFactor(spec, info->width, info->height) : 1;
  Result<cv::Mat> decoded = DecodeImage(encoded, spec.channels, factor);
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
  Result<ResizeCropGeometry> g = ResizeCropFor(spec, info->width, info->height);
  if (!g.ok()) return g.status();
  const PreparedShape shape{g->out_height, g->out_width, spec.channels};
  if (Status s = CheckRoom(shape, dst); !s.ok()) return s;
  try {
    // OpenCV's general INTER_AREA path, computed for the window only (area_resize.h): same bytes.
    const ResizeCropGeometry area{decoded->cols, decoded->rows, g->resized_width, g->resized_height,
                                  g->crop_x,     g->crop_y,     g->out_width,     g->out_height};
    if (decoded->depth() == CV_8U && decoded->channels() == spec.channels &&
        AreaResizeApplies(area, spec.channels)) {
      AreaResizeCrop(area, decoded->data, decoded->step, spec.channels, dst.data());
      return shape;
    }
    cv::Mat resized = *decoded;
    if (resized.cols != g->resized_width || resized.rows != g->resized_height) {
      const bool shrink = g->resized_width <= resized.cols && g->resized_height <= resized.rows;
      cv::resize(*decoded, resized, cv::Size(g->resized_width, g->resized_height), 0, 0,
                 shrink ? cv::INTER_AREA : cv::INTER_LINEAR);
    }
    const cv::Mat window = resized(cv::Rect(g->crop_x, g->crop_y, g->out_width, g->out_height));
    cv::Mat out(g->out_height, g->out_width, spec.channels == 1 ? CV_8UC1 : CV_8UC3, dst.data());
    window.copyTo(out);  // the decoders return RGB already
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
  PreparedImage image{*shape, std::vector<uint8_t>(shape->stored_bytes())};
  Result<PreparedShape> written = PrepareInto(spec, encoded, image.pixels, raw_shape);
  if (!written.ok()) return written.status();
  return image;
}

}  // namespace carpool
