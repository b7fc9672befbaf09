// libFuzzer target for the frame decoder (CARPOOL_BUILD_FUZZERS, clang only; docs/fuzzing.md).
// Whatever the input, the decoder must not crash, over-read or hit undefined behaviour (ASan,
// UBSan), and a frame it accepts must re-encode to the same bytes and decode to the same message.
#include <algorithm>
#include <cstdlib>

#include "protocol/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace carpool::protocol;
  auto message = DecodeFrame(std::span<const uint8_t>(data, size));
  if (!message.ok()) return 0;
  auto again = EncodeFrame(*message);
  if (!again.ok() || again->size() != size || !std::equal(again->begin(), again->end(), data)) {
    std::abort();
  }
  auto decoded_again = DecodeFrame(*again);
  if (!decoded_again.ok() || *decoded_again != *message) std::abort();
  return 0;
}
