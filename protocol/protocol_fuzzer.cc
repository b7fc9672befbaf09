// libFuzzer target for the frame decoder (CARPOOL_BUILD_FUZZERS, clang only; docs/fuzzing.md).
// Whatever the input, the decoder must not crash, over-read or hit undefined behaviour (ASan,
// UBSan), and a frame it accepts must re-encode to the same bytes and decode to the same message.
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <variant>

#include "protocol/id_set.h"
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
  // A resumed job's id set (decoded by the server): accepted ids are ascending and distinct, and
  // encode again to a set that decodes to the same ids.
  if (const auto* create = std::get_if<CreateJob>(&*message); create && !create->resume_taken.empty()) {
    auto ids = DecodeIdSet(create->resume_taken, 1u << 20);
    if (ids.ok()) {
      if (std::adjacent_find(ids->begin(), ids->end(), std::greater_equal<>()) != ids->end()) {
        std::abort();
      }
      auto back = DecodeIdSet(EncodeIdSet(*ids), ids->size());
      if (!back.ok() || *back != *ids) std::abort();
    }
  }
  return 0;
}
