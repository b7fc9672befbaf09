#include "datasets/prepare_spec.h"

#include <fmt/core.h>

#include <charconv>
#include <vector>

namespace carpool {

std::string PrepareSpec::ToString() const {
  std::string out;
  if (raw) {
    out = "raw";
  } else {
    if (resize > 0) out += fmt::format("resize={}", resize);
    if (crop > 0) out += fmt::format("{}crop={}", out.empty() ? "" : ",", crop);
  }
  if (channels != 3 || out.empty()) {
    out += fmt::format("{}channels={}", out.empty() ? "" : ",", channels);
  }
  if (gpu_decode) out += ",decode=gpu";
  return out;
}

namespace {

constexpr std::string_view kForm =
    "expected comma-separated items like \"resize=256,crop=256\", \"channels=1\" or \"raw\"";

Result<int> ParsePositive(std::string_view key, std::string_view value, std::string_view text) {
  int v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v <= 0 || v > kMaxPrepareSide) {
    return Status::InvalidArgument(fmt::format(
        "prepare spec \"{}\": {}=\"{}\" is not an integer in [1, {}]", text, key, value,
        kMaxPrepareSide));
  }
  return v;
}

}  // namespace

Result<PrepareSpec> ParsePrepareSpec(std::string_view text) {
  PrepareSpec spec;
  if (text.empty()) {
    return Status::InvalidArgument(fmt::format("prepare spec is empty; {}", kForm));
  }
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(pos, comma - pos);
    pos = comma + 1;
    if (item == "raw") {
      spec.raw = true;
      continue;
    }
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return Status::InvalidArgument(
          fmt::format("prepare spec \"{}\": unknown item \"{}\"; {}", text, item, kForm));
    }
    std::string_view key = item.substr(0, eq);
    if (key == "decode") {
      const std::string_view decoder = item.substr(eq + 1);
      if (decoder != "cpu" && decoder != "gpu") {
        return Status::InvalidArgument(fmt::format(
            "prepare spec \"{}\": decode=\"{}\" must be cpu or gpu", text, decoder));
      }
      spec.gpu_decode = decoder == "gpu";
      continue;
    }
    Result<int> value = ParsePositive(key, item.substr(eq + 1), text);
    if (!value.ok()) return value.status();
    if (key == "resize") {
      spec.resize = *value;
    } else if (key == "crop") {
      spec.crop = *value;
    } else if (key == "channels") {
      if (*value != 1 && *value != 3) {
        return Status::InvalidArgument(
            fmt::format("prepare spec \"{}\": channels={} must be 1 or 3", text, *value));
      }
      spec.channels = *value;
    } else {
      return Status::InvalidArgument(
          fmt::format("prepare spec \"{}\": unknown key \"{}\"; {}", text, key, kForm));
    }
  }
  if (spec.raw && (spec.resize > 0 || spec.crop > 0)) {
    return Status::InvalidArgument(fmt::format(
        "prepare spec \"{}\": \"raw\" keeps records as they are and cannot be combined with "
        "resize or crop",
        text));
  }
  if (spec.gpu_decode && (spec.raw || spec.channels != 3)) {
    return Status::InvalidArgument(fmt::format(
        "prepare spec \"{}\": decode=gpu gives RGB images; it cannot be combined with raw or "
        "channels=1",
        text));
  }
  if (spec.resize > 0 && spec.crop > spec.resize) {
    return Status::InvalidArgument(fmt::format(
        "prepare spec \"{}\": crop={} is larger than resize={}; use crop <= resize", text,
        spec.crop, spec.resize));
  }
  return spec;
}

}  // namespace carpool
