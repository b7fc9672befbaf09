// Preparation: the deterministic, expensive part of loading one sample, done once into the cache.
// Decode (image_codec.h: JPEG and PNG without imgcodecs), shorter side to spec.resize, center crop spec.crop, RGB or grayscale, uint8
// HWC; or, for a raw spec, the record's bytes as they are. Stateless free functions: thread-safe.
#ifndef CARPOOL_SERVER_PREPARE_H_
#define CARPOOL_SERVER_PREPARE_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "carpool/status.h"
#include "datasets/prepare_spec.h"
#include "server/exact_resize.h"

namespace carpool {

// The shape of a prepared sample: uint8, rows of width * channels bytes, no padding.
struct PreparedShape {
  int height = 0;
  int width = 0;
  int channels = 0;
  // Nonzero for a decode=gpu spec's JPEG that the GPU decodes: the stored bytes are the encoded
  // JPEG, of this length (the encoded tier), and height x width x channels is what its GPU
  // preparation gives. 0: the stored bytes are those pixels.
  uint32_t encoded_bytes = 0;

  size_t bytes() const {  // of the pixels
    return static_cast<size_t>(height) * static_cast<size_t>(width) * static_cast<size_t>(channels);
  }
  size_t stored_bytes() const { return encoded_bytes > 0 ? encoded_bytes : bytes(); }
  bool encoded() const { return encoded_bytes > 0; }
  PreparedShape pixels() const { return {height, width, channels, 0}; }
  bool empty() const { return height <= 0 || width <= 0 || channels <= 0; }
  bool operator==(const PreparedShape&) const = default;
};

// A prepared sample in memory (a cache slot or a PreparedImage). Does not own the bytes.
struct PreparedView {
  const uint8_t* data = nullptr;
  PreparedShape shape;
};

// A prepared sample that owns its bytes.
struct PreparedImage {
  PreparedShape shape;
  std::vector<uint8_t> pixels;

  PreparedView view() const { return {pixels.data(), shape}; }
};

// The shape PrepareInto will produce, read without decoding pixels where possible:
//  - raw: raw_shape, checked against the record length (raw_shape is required, e.g. IDX rows,
//    cols and channels from the file header);
//  - crop > 0: crop x crop x channels (the encoded header is still read and checked, because the
//    source must be at least crop on its shorter side after the resize);
//  - otherwise from the JPEG SOF or PNG IHDR header; other formats are fully decoded;
//  - decode=gpu (spec.gpu_decode): a JPEG the GPU decodes (CheckGpuDecodable) stays encoded, so
//    the shape has encoded_bytes = the record's length; anything else is prepared on the CPU.
// Errors: Corruption for unreadable or truncated data, InvalidArgument for a spec or image that
// cannot be prepared (source smaller than the crop with resize=0, result over kMaxPrepareSide).
Result<PreparedShape> PreparedShapeFor(const PrepareSpec& spec, std::span<const uint8_t> encoded,
                                       PreparedShape raw_shape = {});

// Prepares one sample straight into dst, e.g. a cache slot, and returns the shape written.
// REQUIRES: dst.size() >= PreparedShapeFor(spec, encoded, raw_shape)->stored_bytes(); a smaller dst
// gives InvalidArgument and nothing is written. Never throws: OpenCV exceptions become Status.
Result<PreparedShape> PrepareInto(const PrepareSpec& spec, std::span<const uint8_t> encoded,
                                  std::span<uint8_t> dst, PreparedShape raw_shape = {});

// Convenience for callers without a slot: PreparedShapeFor + PrepareInto into a new buffer.
Result<PreparedImage> PrepareSample(const PrepareSpec& spec, std::span<const uint8_t> encoded,
                                    PreparedShape raw_shape = {});

// A decode=gpu spec's sample prepared on the CPU to the pixels GPU decode gives: full-size decode
// with replicated chroma, then ExactResizeCrop (server/exact_resize.h). Bit-identical to nvJPEG's
// hardware backend followed by the GPU resize; what a CPU job, or a GPU without nvJPEG, uses for
// an encoded sample. InvalidArgument for a spec without gpu_decode. Cost: a full decode.
Result<PreparedImage> PrepareGpuPixelsOnCpu(const PrepareSpec& spec,
                                           std::span<const uint8_t> encoded);

// The resize and crop of `spec` for a source of src_width x src_height (InvalidArgument when the
// result would exceed kMaxPrepareSide or miss the crop). O(1).
Result<ResizeCropGeometry> ResizeCropFor(const PrepareSpec& spec, int src_width, int src_height);

// The JPEG DCT-domain reduction PrepareInto uses for a source of src_width x src_height: the
// largest of 8, 4, 2 that still leaves the shorter side >= the side the resize needs, or 1 (full
// decode) when spec.resize is 0, the source is not much larger or under 8 pixels on its longer
// side, or the spec is raw.
int ReducedDecodeFactor(const PrepareSpec& spec, int src_width, int src_height);

}  // namespace carpool

#endif  // CARPOOL_SERVER_PREPARE_H_
