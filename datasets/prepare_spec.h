// The prepare spec: the deterministic, expensive part of loading a sample, done once into the
// cache. Text form "resize=256,crop=256" (shorter side to 256, then a 256x256 center crop), or
// "raw" (the record's bytes as they are, e.g. IDX images). Thread-compatible value type.
#ifndef CARPOOL_DATASETS_PREPARE_SPEC_H_
#define CARPOOL_DATASETS_PREPARE_SPEC_H_

#include <string>
#include <string_view>

#include "carpool/status.h"

namespace carpool {

struct PrepareSpec {
  bool raw = false;  // keep the record's bytes; resize/crop must be 0
  int resize = 0;    // shorter side in pixels; 0 keeps the decoded size
  int crop = 0;      // square center crop in pixels; 0 means none
  int channels = 3;  // 3 (RGB) or 1 (grayscale); for raw, what the record holds
  // "decode=gpu": the pixels GPU decode gives (docs/gpu.md "GPU decode"): JPEGs decoded at full
  // size with replicated chroma (nvJPEG's hardware output, libjpeg-turbo's fast upsampling),
  // resized by carpool's exact box filter (server/exact_resize.h). Keyed apart from the CPU spec
  // of the same files, so a job's pixels never depend on which decoder served it. The server
  // sets it for GPU jobs when it decodes on their GPU; RGB (channels=3), never raw.
  bool gpu_decode = false;

  // Canonical text, parseable by ParsePrepareSpec: "raw", "raw,channels=1",
  // "resize=256,crop=256", "resize=256,crop=256,channels=1", "resize=256,crop=256,decode=gpu".
  std::string ToString() const;
  bool operator==(const PrepareSpec&) const = default;
};

inline constexpr int kMaxPrepareSide = 8192;

// Accepts comma-separated key=value items in any order: resize=N, crop=N, channels=1|3,
// decode=cpu|gpu, and the bare word "raw". Errors name the bad item and the accepted form.
Result<PrepareSpec> ParsePrepareSpec(std::string_view text);

}  // namespace carpool

#endif  // CARPOOL_DATASETS_PREPARE_SPEC_H_
