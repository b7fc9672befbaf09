#include "server/fault_injection.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <stdexcept>
#include <vector>

namespace carpool {
namespace {

constexpr std::string_view kForm =
    "expected SITE=ID,ID;SITE=ID with SITE one of prepare, assemble, gpu_build, repeat (e.g. "
    "\"prepare=3,17;assemble=40\")";

std::string Join(const std::unordered_set<uint32_t>& ids) {
  std::vector<uint32_t> sorted(ids.begin(), ids.end());
  std::sort(sorted.begin(), sorted.end());
  return fmt::format("{}", fmt::join(sorted, ","));
}

}  // namespace

void FaultInjection::MaybeThrow(const std::unordered_set<uint32_t>& site, std::string_view name,
                                uint32_t id) {
  if (!site.empty() && site.count(id) > 0) {
    throw std::runtime_error(fmt::format("injected fault: {} of sample {}", name, id));
  }
}

std::string FaultInjection::ToString() const {
  std::vector<std::string> parts;
  if (!prepare.empty()) parts.push_back("prepare=" + Join(prepare));
  if (!assemble.empty()) parts.push_back("assemble=" + Join(assemble));
  if (!gpu_build.empty()) parts.push_back("gpu_build=" + Join(gpu_build));
  if (!repeat.empty()) parts.push_back("repeat=" + Join(repeat));
  return fmt::format("{}", fmt::join(parts, ";"));
}

Result<FaultInjection> FaultInjection::Parse(std::string_view text) {
  FaultInjection out;
  while (!text.empty()) {
    const size_t end = std::min(text.find(';'), text.size());
    const std::string_view part = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    const size_t eq = part.find('=');
    if (eq == std::string_view::npos) {
      return Status::InvalidArgument(fmt::format("fault injection \"{}\": {}", part, kForm));
    }
    const std::string_view site = part.substr(0, eq);
    std::unordered_set<uint32_t>* ids = site == "prepare"     ? &out.prepare
                                        : site == "assemble"  ? &out.assemble
                                        : site == "gpu_build" ? &out.gpu_build
                                        : site == "repeat"    ? &out.repeat
                                                              : nullptr;
    if (ids == nullptr) {
      return Status::InvalidArgument(
          fmt::format("fault injection site \"{}\" is unknown: {}", site, kForm));
    }
    std::string_view list = part.substr(eq + 1);
    while (!list.empty()) {
      const size_t comma = std::min(list.find(','), list.size());
      const std::string_view item = list.substr(0, comma);
      list.remove_prefix(std::min(comma + 1, list.size()));
      uint32_t id = 0;
      auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
      if (ec != std::errc() || ptr != item.data() + item.size()) {
        return Status::InvalidArgument(
            fmt::format("fault injection sample id \"{}\" is not a 32-bit id: {}", item, kForm));
      }
      ids->insert(id);
    }
  }
  return out;
}

}  // namespace carpool
