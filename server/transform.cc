#include "server/transform.h"

#include <fmt/core.h>

#include <bit>
#include <charconv>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common/splitmix.h"

namespace carpool {
namespace {

constexpr std::array<float, 3> kImagenetMean = {0.485f, 0.456f, 0.406f};
constexpr std::array<float, 3> kImagenetStd = {0.229f, 0.224f, 0.225f};
constexpr int kMaxChannels = 4;

constexpr std::string_view kValidSteps =
    "valid steps: random_crop(N), center_crop(N), flip, normalize(imagenet), normalize(mean,std), "
    "normalize(m0,m1,m2,s0,s1,s2), uint8, float32, float16, nchw, nhwc; separate them with '|'";

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

Status StepError(std::string_view text, std::string_view step, std::string_view why) {
  return Status::InvalidArgument(
      fmt::format("transform \"{}\": step \"{}\" {}; {}", text, step, why, kValidSteps));
}

// Parses the comma-separated float list of normalize(...) into the spec.
Status ParseNormalize(std::string_view text, std::string_view step, std::string_view args,
                      TransformSpec& spec) {
  if (args == "imagenet") {
    spec.normalize_channels = 3;
    spec.mean = kImagenetMean;
    spec.std = kImagenetStd;
    return Status::OK();
  }
  std::vector<float> values;
  size_t pos = 0;
  while (pos <= args.size()) {
    size_t comma = args.find(',', pos);
    if (comma == std::string_view::npos) comma = args.size();
    std::string_view item = Trim(args.substr(pos, comma - pos));
    pos = comma + 1;
    float v = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size()) {
      return StepError(text, step, fmt::format("has \"{}\", which is not a number", item));
    }
    values.push_back(v);
  }
  if (values.size() != 2 && values.size() != 6) {
    return StepError(text, step,
                     fmt::format("has {} numbers; give imagenet, 2 (mean,std for one channel) or "
                                 "6 (three means, three stds)",
                                 values.size()));
  }
  const int c = static_cast<int>(values.size() / 2);
  spec.normalize_channels = c;
  spec.mean = {};
  spec.std = {};
  for (int i = 0; i < c; ++i) {
    spec.mean[i] = values[i];
    spec.std[i] = values[c + i];
    if (!(spec.std[i] > 0)) {
      return StepError(text, step, fmt::format("has std {}; every std must be > 0", values[c + i]));
    }
  }
  return Status::OK();
}

// A draw in [0, range): the high 64 bits of r * range. The bias is below range / 2^64.
int Below(uint64_t r, int range) {
  return static_cast<int>((static_cast<unsigned __int128>(r) * static_cast<uint64_t>(range)) >> 64);
}

// The table values of kLanes output elements in one store. Why: with a store per element (and
// the byte source reloaded after each, as uint8_t may alias the output), 224x224x3 float32 took
// about three times as long in nchw, 2.5 times in nhwc.
template <typename T>
constexpr int kLanes = 0;

// uint8_t: 8 bytes gathered into one 64-bit word, on any little-endian target.
template <>
constexpr int kLanes<uint8_t> = std::endian::native == std::endian::little ? 8 : 0;

template <typename... B>
inline void StoreVector(uint8_t* out, B... bytes) {
  uint64_t word = 0;
  int shift = 0;
  ((word |= static_cast<uint64_t>(bytes) << shift, shift += 8), ...);
  std::memcpy(out, &word, sizeof word);
}

#if defined(__SSE2__)
// float32 and float16: one 16-byte SSE2 vector.
template <>
constexpr int kLanes<float> = 4;
template <>
constexpr int kLanes<uint16_t> = 8;

inline void StoreVector(float* out, float a, float b, float c, float d) {
  _mm_storeu_ps(out, _mm_setr_ps(a, b, c, d));
}

template <typename... H>
inline void StoreVector(uint16_t* out, H... halves) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                   _mm_setr_epi16(static_cast<int16_t>(halves)...));
}
#endif

// Store kJ of a group of kLanes pixels (a vector, or a word for uint8): in NCHW channel kJ of each
// pixel, in plane kJ; in NHWC the group's elements kJ * kLanes onward, in order.
template <typename T, Layout kLayout, int kC, int kJ, size_t... kI>
inline void StoreGroupVector(const T* lut, const uint8_t* px, ptrdiff_t step, T* out, size_t plane,
                             std::index_sequence<kI...>) {
  auto value = [&](int pixel, int c) { return lut[c * 256 + px[pixel * step + c]]; };
  constexpr int kL = kLanes<T>;
  if constexpr (kLayout == Layout::kNCHW) {
    StoreVector(out + kJ * plane, value(static_cast<int>(kI), kJ)...);
  } else {
    StoreVector(out + kJ * kL,
                value(static_cast<int>(kJ * kL + kI) / kC, static_cast<int>(kJ * kL + kI) % kC)...);
  }
}

// A group's kLanes pixels make kC stores in either layout.
template <typename T, Layout kLayout, int kC, size_t... kJ>
inline void StoreGroup(const T* lut, const uint8_t* px, ptrdiff_t step, T* out, size_t plane,
                       std::index_sequence<kJ...>) {
  (StoreGroupVector<T, kLayout, kC, static_cast<int>(kJ)>(lut, px, step, out, plane,
                                                          std::make_index_sequence<kLanes<T>>{}),
   ...);
}

// One pass over the crop window: lut[c * 256 + v] holds the output value for channel c and byte
// v, so normalize and the dtype conversion cost one load per element.
template <typename T, Layout kLayout, int kC>
void TransformWindow(const PreparedView& src, const CropWindow& w, const T* lut, T* dst) {
  const size_t src_stride = static_cast<size_t>(src.shape.width) * kC;
  const size_t plane = static_cast<size_t>(w.height) * w.width;
  const ptrdiff_t step = w.flip ? -kC : kC;
  for (int y = 0; y < w.height; ++y) {
    const uint8_t* row = src.data + (w.y + y) * src_stride + static_cast<size_t>(w.x) * kC;
    const uint8_t* px = w.flip ? row + static_cast<size_t>(w.width - 1) * kC : row;
    T* out = dst + static_cast<size_t>(y) * w.width * (kLayout == Layout::kNHWC ? kC : 1);
    int x = 0;
    if constexpr ((kLanes<T>) > 0) {
      constexpr int kL = kLanes<T>;
      for (; x + kL <= w.width; x += kL, px += kL * step) {
        T* at = out + static_cast<size_t>(x) * (kLayout == Layout::kNHWC ? kC : 1);
        StoreGroup<T, kLayout, kC>(lut, px, step, at, plane, std::make_index_sequence<kC>{});
      }
    }
    for (; x < w.width; ++x, px += step) {
      if constexpr (kLayout == Layout::kNHWC) {
        for (int c = 0; c < kC; ++c) out[x * kC + c] = lut[c * 256 + px[c]];
      } else {
        for (int c = 0; c < kC; ++c) out[c * plane + x] = lut[c * 256 + px[c]];
      }
    }
  }
}

template <typename T, Layout kLayout>
void DispatchChannels(const PreparedView& src, const CropWindow& w, const T* lut, T* dst) {
  switch (src.shape.channels) {
    case 1:
      return TransformWindow<T, kLayout, 1>(src, w, lut, dst);
    case 2:
      return TransformWindow<T, kLayout, 2>(src, w, lut, dst);
    case 3:
      return TransformWindow<T, kLayout, 3>(src, w, lut, dst);
    default:
      return TransformWindow<T, kLayout, 4>(src, w, lut, dst);
  }
}

template <typename T>
void Run(const TransformSpec& spec, const PreparedView& src, const CropWindow& w, const T* lut,
         void* dst) {
  if (spec.layout == Layout::kNHWC) {
    DispatchChannels<T, Layout::kNHWC>(src, w, lut, static_cast<T*>(dst));
  } else {
    DispatchChannels<T, Layout::kNCHW>(src, w, lut, static_cast<T*>(dst));
  }
}

// The float value of byte v in channel c, as docs/transforms.md specifies it.
float FloatValue(const TransformSpec& spec, int c, int v) {
  const float unit = static_cast<float>(v) / 255.0f;
  return spec.normalize ? (unit - spec.mean[c]) / spec.std[c] : unit;
}

}  // namespace

std::string TransformSpec::ToString() const {
  std::string out;
  if (crop != CropMode::kNone) {
    out += fmt::format("{}({})|", crop == CropMode::kRandom ? "random_crop" : "center_crop",
                       crop_size);
  }
  if (flip) out += "flip|";
  if (normalize) {
    if (normalize_channels == 3 && mean == kImagenetMean && std == kImagenetStd) {
      out += "normalize(imagenet)|";
    } else if (normalize_channels == 1) {
      out += fmt::format("normalize({},{})|", mean[0], std[0]);
    } else {
      out += fmt::format("normalize({},{},{},{},{},{})|", mean[0], mean[1], mean[2], std[0], std[1],
                         std[2]);
    }
  }
  out += fmt::format("{}|{}", DTypeName(dtype), LayoutName(layout));
  return out;
}

Result<TransformSpec> ParseTransformSpec(std::string_view text) {
  TransformSpec spec;
  bool have_dtype = false;
  bool have_layout = false;
  size_t pos = 0;
  while (!Trim(text).empty() && pos <= text.size()) {
    size_t bar = text.find('|', pos);
    if (bar == std::string_view::npos) bar = text.size();
    const std::string_view step = Trim(text.substr(pos, bar - pos));
    pos = bar + 1;
    if (step.empty()) return StepError(text, step, "is empty");
    std::string_view name = step;
    std::string_view args;
    bool has_args = false;
    if (size_t open = step.find('('); open != std::string_view::npos) {
      if (step.back() != ')') return StepError(text, step, "has no closing ')'");
      name = Trim(step.substr(0, open));
      args = Trim(step.substr(open + 1, step.size() - open - 2));
      has_args = true;
    }
    const bool is_crop = name == "random_crop" || name == "center_crop";
    const bool known = is_crop || name == "normalize" || name == "flip" || name == "uint8" ||
                       name == "float32" || name == "float16" || name == "nchw" || name == "nhwc";
    if (!known) return StepError(text, step, "is unknown");
    if (has_args != (is_crop || name == "normalize")) {
      return StepError(text, step, has_args ? "takes no arguments" : "needs arguments in (...)");
    }
    if (is_crop) {
      if (spec.crop != CropMode::kNone) return StepError(text, step, "repeats a crop");
      int n = 0;
      auto [end, ec] = std::from_chars(args.data(), args.data() + args.size(), n);
      if (ec != std::errc() || end != args.data() + args.size() || n <= 0 || n > kMaxPrepareSide) {
        return StepError(text, step, fmt::format("needs a size in [1, {}]", kMaxPrepareSide));
      }
      spec.crop = name == "random_crop" ? CropMode::kRandom : CropMode::kCenter;
      spec.crop_size = n;
    } else if (name == "flip") {
      if (spec.flip) return StepError(text, step, "is repeated");
      spec.flip = true;
    } else if (name == "normalize") {
      if (spec.normalize) return StepError(text, step, "is repeated");
      spec.normalize = true;
      if (Status s = ParseNormalize(text, step, args, spec); !s.ok()) return s;
    } else if (name == "uint8" || name == "float32" || name == "float16") {
      if (have_dtype) return StepError(text, step, "repeats the dtype");
      have_dtype = true;
      spec.dtype = name == "uint8"     ? DType::kUint8
                   : name == "float32" ? DType::kFloat32
                                       : DType::kFloat16;
    } else {
      if (have_layout) return StepError(text, step, "repeats the layout");
      have_layout = true;
      spec.layout = name == "nchw" ? Layout::kNCHW : Layout::kNHWC;
    }
  }
  if (!have_dtype) spec.dtype = spec.normalize ? DType::kFloat32 : DType::kUint8;
  if (spec.normalize && spec.dtype == DType::kUint8) {
    return Status::InvalidArgument(fmt::format(
        "transform \"{}\": normalize gives negative and fractional values, which uint8 cannot "
        "hold; use float32 or float16",
        text));
  }
  if (!have_layout) spec.layout = spec.dtype == DType::kUint8 ? Layout::kNHWC : Layout::kNCHW;
  return spec;
}

Result<ImageShape> TransformedShape(const TransformSpec& spec, const PreparedShape& in) {
  if (in.empty() || in.channels > kMaxChannels) {
    return Status::InvalidArgument(fmt::format(
        "prepared sample {}x{}x{} cannot be transformed; expected a non-empty image with 1..{} "
        "channels",
        in.height, in.width, in.channels, kMaxChannels));
  }
  ImageShape out{in.channels, in.height, in.width, spec.dtype, spec.layout};
  if (spec.crop != CropMode::kNone) {
    if (spec.crop_size > in.height || spec.crop_size > in.width) {
      return Status::InvalidArgument(fmt::format(
          "transform \"{}\": crop {} is larger than the prepared sample {}x{} (HxW); use a crop "
          "<= the dataset's prepare size",
          spec.ToString(), spec.crop_size, in.height, in.width));
    }
    out.height = out.width = spec.crop_size;
  }
  if (spec.normalize && spec.normalize_channels != in.channels) {
    return Status::InvalidArgument(fmt::format(
        "transform \"{}\": normalize has {} mean/std pairs but the prepared sample has {} "
        "channels; give {}",
        spec.ToString(), spec.normalize_channels, in.channels,
        in.channels == 1 ? "normalize(mean,std)" : "normalize(imagenet) or 6 numbers"));
  }
  return out;
}

uint64_t SampleSeed(uint64_t job_seed, uint32_t epoch, uint32_t sample_id) {
  uint64_t state = job_seed;
  uint64_t mixed = SplitMix64Next(state) ^ ((static_cast<uint64_t>(epoch) << 32) | sample_id);
  return SplitMix64Next(mixed);
}

CropWindow DrawCropWindow(const TransformSpec& spec, const PreparedShape& in,
                          uint64_t sample_seed) {
  uint64_t state = sample_seed;
  const uint64_t ry = SplitMix64Next(state);
  const uint64_t rx = SplitMix64Next(state);
  const uint64_t rflip = SplitMix64Next(state);
  CropWindow w{0, 0, in.height, in.width, spec.flip && (rflip >> 63) != 0};
  if (spec.crop == CropMode::kNone) return w;
  w.height = w.width = spec.crop_size;
  if (spec.crop == CropMode::kRandom) {
    w.y = Below(ry, in.height - spec.crop_size + 1);
    w.x = Below(rx, in.width - spec.crop_size + 1);
  } else {
    w.y = (in.height - spec.crop_size) / 2;
    w.x = (in.width - spec.crop_size) / 2;
  }
  return w;
}

Status ApplyTransform(const TransformSpec& spec, const PreparedView& src, uint64_t sample_seed,
                      void* dst) {
  Result<ImageShape> shape = TransformedShape(spec, src.shape);
  if (!shape.ok()) return shape.status();
  const CropWindow w = DrawCropWindow(spec, src.shape, sample_seed);
  const int c = src.shape.channels;
  switch (spec.dtype) {
    case DType::kUint8: {
      if (spec.layout == Layout::kNHWC && !w.flip) {  // plain row copies
        const size_t row_bytes = static_cast<size_t>(w.width) * c;
        for (int y = 0; y < w.height; ++y) {
          std::memcpy(static_cast<uint8_t*>(dst) + y * row_bytes,
                      src.data + (static_cast<size_t>(w.y + y) * src.shape.width + w.x) * c,
                      row_bytes);
        }
        return Status::OK();
      }
      uint8_t lut[kMaxChannels * 256];
      for (int i = 0; i < c * 256; ++i) lut[i] = static_cast<uint8_t>(i % 256);
      Run<uint8_t>(spec, src, w, lut, dst);
      return Status::OK();
    }
    case DType::kFloat32: {
      float lut[kMaxChannels * 256];
      for (int i = 0; i < c * 256; ++i) lut[i] = FloatValue(spec, i / 256, i % 256);
      Run<float>(spec, src, w, lut, dst);
      return Status::OK();
    }
    case DType::kFloat16: {
      uint16_t lut[kMaxChannels * 256];
      for (int i = 0; i < c * 256; ++i) lut[i] = FloatToHalf(FloatValue(spec, i / 256, i % 256));
      Run<uint16_t>(spec, src, w, lut, dst);
      return Status::OK();
    }
  }
  return Status::Internal("unknown dtype");
}

uint16_t FloatToHalf(float value) {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7FFFFFFF;
  if (abs >= 0x7F800000) {  // infinity or NaN; a NaN keeps its top payload bits and is quieted
    return abs == 0x7F800000 ? (sign | 0x7C00)
                             : static_cast<uint16_t>(sign | 0x7E00 | ((abs >> 13) & 0x3FF));
  }
  if (abs >= 0x477FF000) return sign | 0x7C00;  // >= 65520 rounds to infinity
  uint32_t q = 0;
  uint32_t rem = 0;
  uint32_t halfway = 0;
  if (abs >= 0x38800000) {  // normal half: rebias the exponent, keep the top 10 mantissa bits
    q = ((abs >> 23) - 112) << 10 | ((abs >> 13) & 0x3FF);
    rem = abs & 0x1FFF;
    halfway = 0x1000;
  } else {  // subnormal half: the value in units of 2^-24
    const uint32_t exponent = abs >> 23;
    const uint32_t shift = 126 - exponent;
    if (exponent == 0 || shift > 24) return sign;  // below 2^-25: rounds to zero
    const uint32_t mantissa = (abs & 0x7FFFFF) | 0x800000;
    q = mantissa >> shift;
    rem = mantissa & ((1u << shift) - 1);
    halfway = 1u << (shift - 1);
  }
  if (rem > halfway || (rem == halfway && (q & 1))) ++q;  // a carry into the exponent is right
  return static_cast<uint16_t>(sign | q);
}

float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000) << 16;
  const uint32_t exponent = (half >> 10) & 0x1F;
  const uint32_t mantissa = half & 0x3FF;
  if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000 | (mantissa << 13));
  if (exponent != 0)
    return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in float.
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return sign != 0 ? -magnitude : magnitude;
}

}  // namespace carpool
