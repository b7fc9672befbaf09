// Parsing of `carpool server --gpus`, the same with and without CUDA.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "server/gpu_service.h"

namespace carpool {

Result<std::vector<int>> ParseGpuList(const std::string& text, int visible) {
  std::vector<int> out;
  if (text == "none" || text.empty()) return out;
  if (text == "all") {
    for (int d = 0; d < visible; ++d) out.push_back(d);
    return out;
  }
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    int device = -1;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), device);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || device < 0) {
      return Status::InvalidArgument(fmt::format(
          "--gpus \"{}\": \"{}\" is not a device index; use all, none or a list such as 0,2",
          text, item));
    }
    if (device >= visible) {
      return Status::InvalidArgument(fmt::format(
          "--gpus \"{}\": CUDA device {} does not exist; this machine has {} GPU(s){}", text,
          device, visible,
          visible == 0 ? std::string("; use --gpus none") : fmt::format(" (0..{})", visible - 1)));
    }
    if (std::find(out.begin(), out.end(), device) != out.end()) {
      return Status::InvalidArgument(
          fmt::format("--gpus \"{}\": device {} is listed twice", text, device));
    }
    out.push_back(device);
    pos = comma + 1;
  }
  return out;
}

Result<GpuDecode> ParseGpuDecode(const std::string& text) {
  if (text == "auto") return GpuDecode::kAuto;
  if (text == "on") return GpuDecode::kOn;
  if (text == "off") return GpuDecode::kOff;
  return Status::InvalidArgument(fmt::format(
      "--gpu-decode \"{}\": expected auto (decode JPEGs on the GPU where nvJPEG loads), on or off",
      text));
}

}  // namespace carpool
