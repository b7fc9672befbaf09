// Per-job transforms, applied at batch assembly to prepared (uint8 HWC) samples: crop, flip,
// normalize, dtype and layout in one pass. Text form "random_crop(224)|flip|normalize(imagenet)|
// float16|nchw"; docs/transforms.md has the grammar, defaults and the exact random draws.
// Value types and stateless functions: thread-safe.
#ifndef CARPOOL_SERVER_TRANSFORM_H_
#define CARPOOL_SERVER_TRANSFORM_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "carpool/status.h"
#include "carpool/types.h"
#include "server/prepare.h"

namespace carpool {

enum class CropMode : uint8_t { kNone, kRandom, kCenter };
struct TransformSpec {
  CropMode crop = CropMode::kNone;
  int crop_size = 0;
  bool flip = false;  // horizontal, with probability 1/2 per sample
  // out = (v / 255 - mean[c]) / std[c], in float32; mean/std on the 0..1 scale (torchvision).
  bool normalize = false;
  int normalize_channels = 0;  // 1 or 3: how many mean/std pairs were given
  std::array<float, 3> mean{};
  std::array<float, 3> std{};
  DType dtype = DType::kUint8;
  Layout layout = Layout::kNHWC;

  // Canonical text with every field explicit; ParseTransformSpec(ToString()) == *this.
  std::string ToString() const;
  bool operator==(const TransformSpec&) const = default;
};

// Parses '|'-separated steps in any order. Defaults: dtype float32 when normalize is given, else
// uint8; layout nchw for float dtypes, nhwc for uint8. The empty string is the identity (uint8
// nhwc). Errors name the bad step and list the valid ones.
Result<TransformSpec> ParseTransformSpec(std::string_view text);

// The shape of one transformed image.
struct ImageShape {
  int channels = 0;
  int height = 0;
  int width = 0;
  DType dtype = DType::kUint8;
  Layout layout = Layout::kNHWC;

  size_t elements() const {
    return static_cast<size_t>(channels) * static_cast<size_t>(height) * static_cast<size_t>(width);
  }
  size_t bytes() const { return elements() * DTypeBytes(dtype); }
  bool operator==(const ImageShape&) const = default;
};

// The output shape for a prepared sample of shape `in`. A crop larger than the sample, or a
// normalize with a channel count different from the sample's, is InvalidArgument (no padding).
Result<ImageShape> TransformedShape(const TransformSpec& spec, const PreparedShape& in);

// The seed of one delivery: a hash of the job's seed, its epoch and the sample id. Two jobs that
// share a sample draw different crops and flips; a job run again draws the same ones.
uint64_t SampleSeed(uint64_t job_seed, uint32_t epoch, uint32_t sample_id);

// The random decisions for one sample: top-left corner of the crop window and the flip.
struct CropWindow {
  int y = 0;
  int x = 0;
  int height = 0;
  int width = 0;
  bool flip = false;
};

// REQUIRES: TransformedShape(spec, in) is ok. Deterministic in (spec, in, sample_seed); the GPU
// path must draw the same window (see docs/transforms.md for the generator).
CropWindow DrawCropWindow(const TransformSpec& spec, const PreparedShape& in, uint64_t sample_seed);

// Writes the transformed image to dst, which must hold TransformedShape(spec, src.shape)->bytes()
// and be aligned for the dtype. Returns the TransformedShape error, if any, before writing.
// Cost: one table load per output element (uint8 nhwc without flip: a row copy) and one store
// per 4 float32 or 8 float16 elements on SSE2 builds, per 8 uint8 on little-endian ones (tails one
// at a time); about 45 us for 224x224x3 float32 on one core of the development VM.
Status ApplyTransform(const TransformSpec& spec, const PreparedView& src, uint64_t sample_seed,
                      void* dst);

// IEEE 754 binary16 conversions. FloatToHalf rounds to nearest, ties to even; overflow gives
// infinity, NaN stays a (quiet) NaN with its sign.
uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t half);

}  // namespace carpool

#endif  // CARPOOL_SERVER_TRANSFORM_H_
