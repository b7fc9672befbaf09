// libFuzzer target for the IDX header parser (CARPOOL_BUILD_FUZZERS, clang only; docs/fuzzing.md).
// Whatever the input, the parser must not crash, over-read or hit undefined behaviour; a header it
// accepts must describe the input exactly, in sizes computed without wrapping, and a raw layout it
// gives must hold exactly one record.
#include <cstdlib>
#include <span>

#include "datasets/idx.h"
#include "datasets/prepare_spec.h"

namespace {

using carpool::IdxHeader;
using U128 = unsigned __int128;

void CheckSizes(const IdxHeader& h) {
  U128 record = 1;
  for (size_t d = 1; d < h.dims.size(); ++d) record *= h.dims[d];
  if (h.dims.empty() || record != h.record_bytes || h.record_bytes > carpool::kMaxIdxRecordBytes ||
      U128{h.count()} * record != h.data_bytes || h.header_bytes != 4 + 4 * h.dims.size()) {
    std::abort();
  }
}

void CheckLayouts(const IdxHeader& h) {
  for (int channels : {1, 3}) {
    carpool::PrepareSpec spec;
    spec.raw = true;
    spec.channels = channels;
    auto layout = carpool::RawRecordLayout(h, spec, "fuzz");
    if (!layout.ok()) continue;
    if (layout->height <= 0 || layout->width <= 0 || layout->channels <= 0 ||
        U128(layout->height) * U128(layout->width) * U128(layout->channels) != h.record_bytes) {
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  auto prefix = carpool::ParseIdxHeaderPrefix(bytes, "fuzz");
  auto whole = carpool::ParseIdxHeader(bytes, "fuzz");
  if (prefix.ok()) {
    CheckSizes(*prefix);
    CheckLayouts(*prefix);
  }
  // The whole-file parse accepts a subset of what the header parse accepts: exact lengths only.
  if (whole.ok()) {
    if (!prefix.ok() || whole->dims != prefix->dims ||
        U128{whole->header_bytes} + whole->data_bytes != size) {
      std::abort();
    }
  }
  return 0;
}
