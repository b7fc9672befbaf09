// PNG through libpng (image_codec.h). libpng reports errors by longjmp to the setjmp in its
// caller, so each libpng sequence runs in a function whose frame holds only trivial objects:
// the jump then skips no destructor.
#include <fmt/core.h>
#include <png.h>

#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "server/image_codec.h"

namespace carpool {
namespace {

// What libpng's error callback saw, and the memory it reads from or writes to.
struct PngContext {
  const uint8_t* input = nullptr;
  size_t input_size = 0;
  size_t input_pos = 0;
  std::vector<uint8_t>* output = nullptr;
  char error[160] = "";
};

void OnPngError(png_structp png, png_const_charp message) {
  auto* context = static_cast<PngContext*>(png_get_error_ptr(png));
  std::snprintf(context->error, sizeof(context->error), "%s", message);
  png_longjmp(png, 1);
}

void OnPngWarning(png_structp, png_const_charp) {}  // e.g. a bad ancillary chunk CRC: skipped

void ReadFromMemory(png_structp png, png_bytep out, size_t size) {
  auto* context = static_cast<PngContext*>(png_get_io_ptr(png));
  if (size > context->input_size - context->input_pos) {
    png_error(png, "truncated: the data ends inside a chunk");
  }
  std::memcpy(out, context->input + context->input_pos, size);
  context->input_pos += size;
}

void WriteToMemory(png_structp png, png_bytep data, size_t size) {
  auto* context = static_cast<PngContext*>(png_get_io_ptr(png));
  bool grown = true;
  try {
    context->output->insert(context->output->end(), data, data + size);
  } catch (const std::bad_alloc&) {
    grown = false;
  }
  if (!grown) png_error(png, "out of memory");
}

void FlushMemory(png_structp) {}

struct PngReadStruct {
  png_structp png = nullptr;
  png_infop info = nullptr;
  png_infop end = nullptr;
  ~PngReadStruct() { png_destroy_read_struct(&png, &info, &end); }
};

struct PngWriteStruct {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngWriteStruct() { png_destroy_write_struct(&png, &info); }
};

// The transformations of OpenCV imgcodecs' PngDecoder::readData for an 8-bit 1- or 3-channel
// image, in its order, then the rows. Returns false with context->error set on failure.
bool ReadPngRows(PngReadStruct* s, int channels, png_bytepp rows, size_t row_bytes) {
  if (setjmp(png_jmpbuf(s->png)) != 0) return false;
  png_read_info(s->png, s->info);
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, color_type = 0;
  png_get_IHDR(s->png, s->info, &width, &height, &bit_depth, &color_type, nullptr, nullptr,
               nullptr);
  if (bit_depth == 16) png_set_strip_16(s->png);
  png_set_strip_alpha(s->png);
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(s->png);
  if ((color_type & PNG_COLOR_MASK_COLOR) == 0 && bit_depth < 8) {
    png_set_expand_gray_1_2_4_to_8(s->png);
  }
  // Colour to 3 channels needs nothing: imgcodecs adds png_set_bgr, this decoder returns RGB.
  if (channels == 1) {
    png_set_rgb_to_gray(s->png, PNG_ERROR_ACTION_NONE, 0.299, 0.587);
  } else if ((color_type & PNG_COLOR_MASK_COLOR) == 0) {
    png_set_gray_to_rgb(s->png);
  }
  png_set_interlace_handling(s->png);
  png_read_update_info(s->png, s->info);
  if (png_get_rowbytes(s->png, s->info) != row_bytes ||
      png_get_channels(s->png, s->info) != channels) {
    png_error(s->png, "unexpected row layout after the transformations");
  }
  png_read_image(s->png, rows);
  png_read_end(s->png, s->end);
  return true;
}

struct PngLayout {
  int width = 0;
  int height = 0;
  int bit_depth = 8;
  int color_type = PNG_COLOR_TYPE_GRAY;
  bool interlaced = false;
  std::vector<png_color> palette;
  std::vector<uint8_t> palette_alpha;  // tRNS: one alpha a palette entry, when any is not 255
  std::vector<uint8_t> rows;           // height rows of PNG-packed, big-endian samples
  size_t row_bytes = 0;
};

bool WritePngRows(PngWriteStruct* s, const PngLayout* layout, png_bytepp rows) {
  if (setjmp(png_jmpbuf(s->png)) != 0) return false;
  png_set_compression_level(s->png, 6);
  png_set_IHDR(s->png, s->info, layout->width, layout->height, layout->bit_depth,
               layout->color_type, layout->interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!layout->palette.empty()) {
    png_set_PLTE(s->png, s->info, layout->palette.data(), static_cast<int>(layout->palette.size()));
  }
  if (!layout->palette_alpha.empty()) {
    png_set_tRNS(s->png, s->info, layout->palette_alpha.data(),
                 static_cast<int>(layout->palette_alpha.size()), nullptr);
  }
  png_write_info(s->png, s->info);
  png_write_image(s->png, rows);
  png_write_end(s->png, s->info);
  return true;
}

// The image's samples in PNG's layout: RGB order, 16-bit big-endian, low gray depths packed
// from each sample's high bits, or palette indices.
Result<PngLayout> ToPngLayout(const cv::Mat& image, ChannelOrder order,
                              const PngEncodeOptions& options) {
  const int channels = image.channels();
  const bool wide = image.depth() == CV_16U;
  PngLayout layout;
  layout.width = image.cols;
  layout.height = image.rows;
  layout.bit_depth = wide ? 16 : options.gray_bits;
  layout.interlaced = options.interlaced;
  static constexpr int kColorTypes[5] = {0, PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA,
                                         PNG_COLOR_TYPE_RGB, PNG_COLOR_TYPE_RGB_ALPHA};
  layout.color_type = options.palette ? PNG_COLOR_TYPE_PALETTE : kColorTypes[channels];
  const int sample_bits = options.palette ? 8 : layout.bit_depth;
  const int row_samples = options.palette ? image.cols : image.cols * channels;
  layout.row_bytes = (static_cast<size_t>(row_samples) * sample_bits + 7) / 8;
  layout.rows.assign(layout.row_bytes * image.rows, 0);
  const bool swap = order == ChannelOrder::kBgr && channels >= 3;
  std::unordered_map<uint32_t, uint8_t> palette_index;
  for (int y = 0; y < image.rows; ++y) {
    uint8_t* row = layout.rows.data() + layout.row_bytes * y;
    for (int x = 0; x < image.cols; ++x) {
      uint32_t pixel[4] = {0, 0, 0, 255};
      for (int c = 0; c < channels; ++c) {
        const int from = swap && c < 3 ? 2 - c : c;
        pixel[c] = wide ? image.ptr<uint16_t>(y)[x * channels + from]
                        : image.ptr<uint8_t>(y)[x * channels + from];
      }
      if (options.palette) {
        const uint32_t key = pixel[0] | (pixel[1] << 8) | (pixel[2] << 16) | (pixel[3] << 24);
        auto [it, added] =
            palette_index.try_emplace(key, static_cast<uint8_t>(palette_index.size()));
        if (added) {
          if (palette_index.size() > 256) {
            return Status::InvalidArgument(
                fmt::format("PNG palette encode of a {}x{} image with over 256 colours", image.cols,
                            image.rows));
          }
          layout.palette.push_back(png_color{static_cast<png_byte>(pixel[0]),
                                             static_cast<png_byte>(pixel[1]),
                                             static_cast<png_byte>(pixel[2])});
          layout.palette_alpha.push_back(static_cast<uint8_t>(pixel[3]));
        }
        row[x] = it->second;
        continue;
      }
      for (int c = 0; c < channels; ++c) {
        const size_t i = static_cast<size_t>(x) * channels + c;
        if (wide) {
          row[2 * i] = static_cast<uint8_t>(pixel[c] >> 8);
          row[2 * i + 1] = static_cast<uint8_t>(pixel[c]);
        } else {
          const int bits = layout.bit_depth;  // 8, or 1/2/4 for one channel
          const size_t bit = i * bits;
          row[bit / 8] |= static_cast<uint8_t>((pixel[c] >> (8 - bits)) << (8 - bits - bit % 8));
        }
      }
    }
  }
  bool any_transparent = false;
  for (uint8_t alpha : layout.palette_alpha) any_transparent |= alpha != 255;
  if (!any_transparent) layout.palette_alpha.clear();
  return layout;
}

}  // namespace

Result<cv::Mat> DecodePng(std::span<const uint8_t> encoded, int channels) {
  if (channels != 1 && channels != 3) {
    return Status::InvalidArgument(
        fmt::format("PNG decode to {} channels; expected 1 or 3", channels));
  }
  Result<ImageHeader> header = ReadImageHeader(encoded);
  if (!header.ok()) return header.status();
  if (header->format != ImageFormat::kPng) {
    return Status::Corruption(fmt::format("record of {} bytes is not a PNG (format: {})",
                                          encoded.size(), ImageFormatName(header->format)));
  }
  cv::Mat out(header->height, header->width, channels == 1 ? CV_8UC1 : CV_8UC3);
  std::vector<png_bytep> rows(header->height);
  for (int y = 0; y < header->height; ++y) rows[y] = out.ptr<uint8_t>(y);
  PngContext context;
  context.input = encoded.data();
  context.input_size = encoded.size();
  PngReadStruct s;
  s.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &context, OnPngError, OnPngWarning);
  if (s.png != nullptr) s.info = png_create_info_struct(s.png);
  if (s.png != nullptr) s.end = png_create_info_struct(s.png);
  if (s.info == nullptr || s.end == nullptr) return Status::Internal("libpng: out of memory");
  png_set_read_fn(s.png, &context, ReadFromMemory);
  // The header check has bounded the size; the limits keep libpng's own checks consistent.
  png_set_user_limits(s.png, kMaxImageSide, kMaxImageSide);
  if (!ReadPngRows(&s, channels, rows.data(), out.step)) {
    return Status::Corruption(fmt::format("PNG of {}x{} ({} bytes) does not decode: {}",
                                          header->width, header->height, encoded.size(),
                                          context.error));
  }
  return out;
}

Result<std::vector<uint8_t>> EncodePng(const cv::Mat& image, ChannelOrder order,
                                       const PngEncodeOptions& options) {
  const int depth = image.depth();
  const int channels = image.channels();
  if (image.empty() || (depth != CV_8U && depth != CV_16U) || channels > 4) {
    return Status::InvalidArgument(fmt::format(
        "PNG encode of a {}x{} image of OpenCV type {}; expected non-empty CV_8U or CV_16U with 1 "
        "to 4 channels",
        image.cols, image.rows, image.type()));
  }
  const bool gray_bits_ok =
      options.gray_bits == 8 ||
      ((options.gray_bits == 1 || options.gray_bits == 2 || options.gray_bits == 4) &&
       image.type() == CV_8UC1 && !options.palette);
  if (!gray_bits_ok || (options.palette && image.type() != CV_8UC3 && image.type() != CV_8UC4)) {
    return Status::InvalidArgument(fmt::format(
        "PNG encode options (palette={}, gray_bits={}) do not fit OpenCV type {}; palette needs "
        "CV_8UC3 or CV_8UC4, gray_bits 1/2/4 needs CV_8UC1",
        options.palette, options.gray_bits, image.type()));
  }
  Result<PngLayout> layout = ToPngLayout(image, order, options);
  if (!layout.ok()) return layout.status();
  std::vector<png_bytep> rows(image.rows);
  for (int y = 0; y < image.rows; ++y) rows[y] = layout->rows.data() + layout->row_bytes * y;
  std::vector<uint8_t> out;
  PngContext context;
  context.output = &out;
  PngWriteStruct s;
  s.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &context, OnPngError, OnPngWarning);
  if (s.png != nullptr) s.info = png_create_info_struct(s.png);
  if (s.info == nullptr) return Status::Internal("libpng: out of memory");
  png_set_write_fn(s.png, &context, WriteToMemory, FlushMemory);
  if (!WritePngRows(&s, &*layout, rows.data())) {
    return Status::Internal(fmt::format("PNG encode of a {}x{} image failed: {}", image.cols,
                                        image.rows, context.error));
  }
  return out;
}

}  // namespace carpool
