// The element types and memory layouts of batch images: one definition for the public client API,
// the wire protocol and the server's transforms. The values are the wire values; never renumber.
// Value types and constexpr functions: thread-safe.
#ifndef CARPOOL_TYPES_H_
#define CARPOOL_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace carpool {

enum class DType : uint8_t { kUint8 = 1, kFloat16 = 2, kFloat32 = 3 };
enum class Layout : uint8_t { kNHWC = 1, kNCHW = 2, kRaw = 3 };  // kRaw: opaque records

// Bytes of one element; 0 for a value outside the enum (e.g. an unchecked wire byte). Cost: O(1).
constexpr size_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kUint8:
      return 1;
    case DType::kFloat16:
      return 2;
    case DType::kFloat32:
      return 4;
  }
  return 0;
}

// The name used in transform text and stats ("float16"); "unknown" outside the enum. Cost: O(1).
constexpr std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kUint8:
      return "uint8";
    case DType::kFloat16:
      return "float16";
    case DType::kFloat32:
      return "float32";
  }
  return "unknown";
}

// The name used in transform text and stats ("nchw"); "unknown" outside the enum. Cost: O(1).
constexpr std::string_view LayoutName(Layout layout) {
  switch (layout) {
    case Layout::kNHWC:
      return "nhwc";
    case Layout::kNCHW:
      return "nchw";
    case Layout::kRaw:
      return "raw";
  }
  return "unknown";
}

}  // namespace carpool

#endif  // CARPOOL_TYPES_H_
