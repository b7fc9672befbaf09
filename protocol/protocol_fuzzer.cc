// libFuzzer target for the frame decoder (built only with clang: CARPOOL_BUILD_FUZZERS).
// Anything the decoder accepts must re-encode to the same bytes.
#include <algorithm>
#include <cstdlib>

#include "protocol/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace carpool::protocol;
  auto message = DecodeFrame(std::span<const uint8_t>(data, size));
  if (!message.ok()) return 0;
  auto again = EncodeFrame(*message);
  if (!again.ok() || again->size() != size ||
      !std::equal(again->begin(), again->end(), data)) {
    std::abort();
  }
  return 0;
}
