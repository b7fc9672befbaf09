// libFuzzer target for the prepare spec parser (CARPOOL_BUILD_FUZZERS, clang only;
// docs/fuzzing.md). Whatever the text, the parser must not crash or hit undefined behaviour; a
// spec it accepts must keep the documented bounds, and its canonical text must parse to the same
// spec and be its own canonical text.
#include <cstdlib>
#include <string>
#include <string_view>

#include "datasets/prepare_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using carpool::kMaxPrepareSide;
  auto spec =
      carpool::ParsePrepareSpec(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!spec.ok()) return 0;
  const bool bounded = spec->resize >= 0 && spec->resize <= kMaxPrepareSide && spec->crop >= 0 &&
                       spec->crop <= kMaxPrepareSide &&
                       (spec->channels == 1 || spec->channels == 3) &&
                       (!spec->raw || (spec->resize == 0 && spec->crop == 0)) &&
                       (spec->resize == 0 || spec->crop <= spec->resize);
  if (!bounded) std::abort();
  const std::string text = spec->ToString();
  auto again = carpool::ParsePrepareSpec(text);
  if (!again.ok() || !(*again == *spec) || again->ToString() != text) std::abort();
  return 0;
}
