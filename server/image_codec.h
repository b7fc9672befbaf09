// JPEG and PNG without OpenCV imgcodecs: libjpeg-turbo's TurboJPEG API and libpng, so that a
// portable bundle does not carry imgcodecs and the GDAL it pulls in (docs/transforms.md
// "Preparation", docs/architecture.md "Packaging"). The decoders return the bytes cv::imdecode
// returns with IMREAD_COLOR or IMREAD_GRAYSCALE, IMREAD_IGNORE_ORIENTATION and, for JPEG,
// IMREAD_REDUCED_*, but in RGB order rather than BGR; image_codec_test.cc proves it byte for byte.
// Other formats go through imgcodecs when the build has it (CMake option CARPOOL_WITH_IMGCODECS).
// Stateless free functions: thread-safe. Never throws: library errors become Status.
#ifndef CARPOOL_SERVER_IMAGE_CODEC_H_
#define CARPOOL_SERVER_IMAGE_CODEC_H_

#include <cstdint>
#include <opencv2/core.hpp>
#include <span>
#include <string_view>
#include <vector>

#include "carpool/status.h"

namespace carpool {

// Images larger than this per side are refused before any pixel is decoded (decompression bombs).
inline constexpr int kMaxImageSide = 1 << 15;

enum class ImageFormat { kUnknown, kJpeg, kPng, kBmp, kGif, kWebp, kTiff, kPnm, kJpeg2000, kExr };

// What an encoded header says, read without decoding pixels. width, height and components are
// 0 for formats other than JPEG and PNG (components: the JPEG frame's, or the PNG's channels).
struct ImageHeader {
  ImageFormat format = ImageFormat::kUnknown;
  int width = 0;
  int height = 0;
  int components = 0;
  // JPEG only: the frame's SOF marker (0xC0 baseline, 0xC1 extended, 0xC2 progressive, ...),
  // each component's sampling factors (h << 4 | v), whether one scan holds the whole image, and
  // whether the colours are coded as RGB rather than YCbCr (Adobe transform 0, or ids 'R','G','B').
  int sof = 0;
  uint8_t sampling[4] = {0, 0, 0, 0};
  bool single_scan = false;
  bool rgb_coded = false;
};

// The format the leading bytes name ("magic number"). Cost: O(1).
ImageFormat SniffImageFormat(std::span<const uint8_t> encoded);
std::string_view ImageFormatName(ImageFormat format);

// True when this build decodes formats other than JPEG and PNG (through OpenCV imgcodecs).
bool HaveImgcodecs();

// Sniffs the format and, for JPEG and PNG, reads the frame size. A JPEG must also have an
// end-of-image marker after its first scan: libjpeg pads a truncated file with gray and only
// warns, so without this check a cut-off file would pass as an image.
// Errors: Corruption for an empty record, unreadable headers, a size of 0 or over
// kMaxImageSide, or a JPEG without end-of-image. Unknown formats are not an error here.
// Cost: O(header bytes) for PNG; for JPEG the marker walk plus one memchr scan of the file.
Result<ImageHeader> ReadImageHeader(std::span<const uint8_t> encoded);

// OK when GPU decode (nvJPEG's hardware and GPU-hybrid backends) takes a JPEG with this header:
// baseline or extended Huffman, one interleaved scan, YCbCr with chroma at 4:4:4, 4:2:2, 4:2:0 or
// 4:4:0. Otherwise InvalidArgument naming what stays on the CPU (progressive, lossless,
// arithmetic, CMYK or gray, another sub-sampling, several scans, RGB-coded). Cost: O(1).
Status CheckGpuDecodable(const ImageHeader& header);

// Decodes a baseline or progressive JPEG to 8-bit RGB (channels 3) or gray (channels 1), scaled
// by 1/factor in the DCT domain (factor 1, 2, 4 or 8; each side rounds up). CMYK and YCCK
// JPEGs are converted as imgcodecs converts them. EXIF orientation is ignored. A stream that
// libjpeg decodes with a warning (e.g. a bad Huffman code) is accepted, as imgcodecs accepts
// it. Progressive files with more than 500 scans are refused (TJFLAG_LIMITSCANS).
// Errors: Corruption for damaged data (ReadImageHeader's checks first); InvalidArgument for
// channels not 1 or 3, a factor not 1/2/4/8, or a factor that TurboJPEG's scale choice cannot
// select exactly (only for images under 8 pixels on both sides).
// Cost: entropy decoding of all of `encoded`, IDCT and colour conversion at the reduced size;
// one allocation of ceil(w/factor) x ceil(h/factor) x channels bytes (x 4/3 more for CMYK).
// fast_upsample: chroma replicated rather than interpolated (TJFLAG_FASTUPSAMPLE), which is what
// nvJPEG's decoders give: the CPU side of GPU decode (PrepareSpec::gpu_decode).
Result<cv::Mat> DecodeJpeg(std::span<const uint8_t> encoded, int channels, int factor = 1,
                           bool fast_upsample = false);

// Decodes a PNG of any colour type, bit depth and interlace to 8-bit RGB (channels 3) or gray
// (channels 1) as imgcodecs does: palette expanded, 16-bit samples cut to their high byte,
// alpha dropped (not composited), gray replicated to RGB, RGB to gray with libpng's
// 0.299/0.587/0.114 weights. Errors: Corruption for damaged or truncated data (a bad CRC of a
// critical chunk, a missing IEND), InvalidArgument for channels not 1 or 3.
// Cost: inflating `encoded` and one pass over w x h pixels; one allocation of w x h x channels.
Result<cv::Mat> DecodePng(std::span<const uint8_t> encoded, int channels);

// Any format, to 8-bit RGB or gray: JPEG and PNG as above (jpeg_factor applies to JPEG only),
// others through imgcodecs when built. Without imgcodecs, a recognised other format is
// InvalidArgument naming the format and saying to convert to JPEG or PNG; bytes of no known
// format are Corruption. Cost: that of the decoder used.
Result<cv::Mat> DecodeImage(std::span<const uint8_t> encoded, int channels, int jpeg_factor = 1,
                            bool jpeg_fast_upsample = false);

// The order of the colour channels in an image handed to an encoder.
enum class ChannelOrder { kRgb, kBgr };

struct JpegEncodeOptions {
  int quality = 95;              // 1..100, as IMWRITE_JPEG_QUALITY (also its default)
  bool subsample_chroma = true;  // 4:2:0, the libjpeg and imgcodecs default; false: 4:4:4
  bool progressive = false;
};

// Encodes CV_8UC1 (a grayscale JPEG) or CV_8UC3 in `order` with libjpeg's accurate integer DCT
// and standard Huffman tables: with the default options, the bytes cv::imencode(".jpg") writes
// at the same quality. Deterministic, unless the TurboJPEG environment variables TJ_OPTIMIZE,
// TJ_ARITHMETIC or TJ_RESTART are set. Errors: InvalidArgument for another type, an empty
// image or a quality outside 1..100. Cost: O(pixels); the output is one allocation.
Result<std::vector<uint8_t>> EncodeJpeg(const cv::Mat& image, ChannelOrder order,
                                        const JpegEncodeOptions& options = {});

struct PngEncodeOptions {
  bool interlaced = false;  // Adam7
  bool palette = false;     // CV_8UC3/CV_8UC4 of at most 256 colours: PLTE, and tRNS for alpha
  int gray_bits = 8;        // CV_8UC1 only: 1, 2, 4 or 8 bits a sample (the high bits are kept)
};

// Encodes CV_8U or CV_16U with 1 (gray), 2 (gray + alpha), 3 (colour) or 4 (colour + alpha)
// channels, colour in `order`, at zlib level 6. Deterministic. Errors: InvalidArgument for
// another type, an empty image or options the image does not fit (palette of over 256 colours).
// Cost: O(pixels) plus deflate; for a palette, one hash-map lookup a pixel.
Result<std::vector<uint8_t>> EncodePng(const cv::Mat& image, ChannelOrder order,
                                       const PngEncodeOptions& options = {});

}  // namespace carpool

#endif  // CARPOOL_SERVER_IMAGE_CODEC_H_
