#include "datasets/catalog_codec.h"

#include <fmt/core.h>

#include <chrono>
#include <exception>

namespace carpool {

std::vector<uint8_t> EncodeIds(const Roaring& ids) {
  Roaring copy = ids;
  copy.runOptimize();
  std::vector<uint8_t> blob(copy.getSizeInBytes(/*portable=*/true));
  copy.write(reinterpret_cast<char*>(blob.data()), /*portable=*/true);
  return blob;
}

Result<Roaring> DecodeIds(std::span<const uint8_t> blob, uint64_t count, std::string_view dataset) {
  auto corrupt = [&](std::string_view why) {
    return Status::Corruption(fmt::format(
        "dataset \"{}\": stored id bitmap is damaged ({}); remove it with 'carpool dataset rm {}' "
        "and register it again",
        dataset, why, dataset));
  };
  const char* buf = reinterpret_cast<const char*>(blob.data());
  size_t need = roaring_bitmap_portable_deserialize_size(buf, blob.size());
  if (need == 0 || need != blob.size()) {
    return corrupt(fmt::format("{} bytes, a bitmap needs {}", blob.size(), need));
  }
  try {
    Roaring ids = Roaring::readSafe(buf, blob.size());
    if (ids.cardinality() != count) {
      return corrupt(fmt::format("{} ids, expected {}", ids.cardinality(), count));
    }
    return ids;
  } catch (const std::exception& e) {
    return corrupt(e.what());
  }
}

std::string EncodeClasses(const std::vector<std::string>& classes) {
  std::string out;
  for (size_t i = 0; i < classes.size(); ++i) {
    if (i > 0) out.push_back('\n');
    out += classes[i];
  }
  return out;
}

std::vector<std::string> DecodeClasses(std::string_view text) {
  std::vector<std::string> out;
  if (text.empty()) return out;
  size_t pos = 0;
  while (true) {
    size_t nl = text.find('\n', pos);
    out.emplace_back(text.substr(pos, nl == std::string_view::npos ? nl : nl - pos));
    if (nl == std::string_view::npos) break;
    pos = nl + 1;
  }
  return out;
}

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace carpool
