#include "tools/cache_fraction.h"

#include <fmt/core.h>

#include <cctype>
#include <cmath>
#include <exception>
#include <string>
#include <utility>

namespace carpool::tools {

Result<double> ParseCacheFraction(std::string_view text) {
  const std::string s(text);
  double value = 0;
  size_t used = 0;
  try {
    value = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const bool number = used > 0 && used == s.size() && std::isfinite(value);
  if (number && value > 0 && value <= kMaxCacheFraction) return value;
  return Status::InvalidArgument(fmt::format(
      "--cache-fraction \"{}\" is {} (0, {}]; give the cache as a fraction of the prepared set, "
      "e.g. 0.1 for room for a tenth of its samples or 1 for all of them",
      text, number ? "outside" : "not a number in", kMaxCacheFraction));
}

// The same units as `carpool server --cache-size`, so a size means what the server will make of
// it: binary K/M/G/T with or without "iB", decimal KB/MB/GB/TB.
Result<uint64_t> ParseByteCount(std::string_view flag, std::string_view text) {
  const Status bad = Status::InvalidArgument(fmt::format(
      "{} \"{}\" is not a byte count; expected e.g. 0, 512MiB, 8GiB or 1.5GB", flag, text));
  size_t end = 0;
  while (end < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.')) {
    ++end;
  }
  const std::string number(text.substr(0, end));
  const std::string_view unit = text.substr(end);
  double value = 0;
  try {
    size_t used = 0;
    value = std::stod(number, &used);
    if (used != number.size()) return bad;
  } catch (const std::exception&) {
    return bad;
  }
  struct Unit {
    std::string_view name;
    double scale;
  };
  static constexpr Unit kUnits[] = {{"", 1},
                                    {"B", 1},
                                    {"K", 1024.0},
                                    {"KiB", 1024.0},
                                    {"KB", 1e3},
                                    {"M", 1048576.0},
                                    {"MiB", 1048576.0},
                                    {"MB", 1e6},
                                    {"G", 1 << 30},
                                    {"GiB", 1 << 30},
                                    {"GB", 1e9},
                                    {"T", 1099511627776.0},
                                    {"TiB", 1099511627776.0},
                                    {"TB", 1e12}};
  for (const Unit& u : kUnits) {
    if (unit == u.name) {
      const double bytes = value * u.scale;
      if (bytes > 1e15) return bad;
      return static_cast<uint64_t>(bytes);
    }
  }
  return bad;
}

CacheChoice CacheOfFraction(double fraction, const PreparedSet& set) {
  return {fraction,
          static_cast<uint64_t>(std::ceil(fraction * static_cast<double>(set.cache_bytes()))), ""};
}

CacheChoice CacheOfSize(uint64_t bytes, std::string size_text, const PreparedSet& set) {
  const double full = static_cast<double>(set.cache_bytes());
  return {full > 0 ? static_cast<double>(bytes) / full : 0.0, bytes, std::move(size_text)};
}

Result<std::vector<CacheChoice>> ChooseCaches(const std::optional<std::string>& fraction,
                                              const std::optional<std::string>& cache_size,
                                              const PreparedSet& set,
                                              const std::vector<double>& default_fractions) {
  if (fraction && cache_size) {
    return Status::InvalidArgument(fmt::format(
        "--cache-fraction {} and --cache-size {} both set the server's cache; give one of them",
        *fraction, *cache_size));
  }
  if (cache_size) {
    Result<uint64_t> bytes = ParseByteCount("--cache-size", *cache_size);
    if (!bytes.ok()) return bytes.status();
    return std::vector<CacheChoice>{CacheOfSize(*bytes, *cache_size, set)};
  }
  std::vector<double> fractions = default_fractions;
  if (fraction) {
    Result<double> f = ParseCacheFraction(*fraction);
    if (!f.ok()) return f.status();
    fractions = {*f};
  }
  std::vector<CacheChoice> out;
  for (double f : fractions) out.push_back(CacheOfFraction(f, set));
  return out;
}

std::string FractionLabel(double fraction) {
  const double percent = fraction * 100;
  if (percent >= 100) return fmt::format("{:.0f}%", percent);
  std::string s = percent >= 1 ? fmt::format("{:.1f}", percent) : fmt::format("{:.2f}", percent);
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s + "%";
}

std::string FormatBytes(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b < 1e3) return fmt::format("{} B", bytes);
  if (b < 1e6) return fmt::format("{:.1f} kB", b / 1e3);
  if (b < 1e9) return fmt::format("{:.1f} MB", b / 1e6);
  return fmt::format("{:.2f} GB", b / 1e9);
}

std::string DescribeCache(const CacheChoice& cache) {
  const std::string bytes =
      cache.size_text.empty()
          ? FormatBytes(cache.bytes)
          : fmt::format("--cache-size {} = {}", cache.size_text, FormatBytes(cache.bytes));
  return fmt::format("cache {} of the prepared set ({})", FractionLabel(cache.fraction), bytes);
}

nlohmann::ordered_json CacheJson(const CacheChoice& c) {
  return {{"fraction", c.fraction},
          {"label", FractionLabel(c.fraction)},
          {"bytes", c.bytes},
          {"cache_size", c.server_flag()},
          {"given_as", c.size_text.empty() ? "cache-fraction" : "cache-size"},
          {"description", DescribeCache(c)}};
}

std::string DescribePreparedSet(const PreparedSet& set) {
  return fmt::format("the prepared set: {} samples x {} B = {} ({} in cache slots)", set.samples,
                     set.sample_bytes, FormatBytes(set.bytes()), FormatBytes(set.cache_bytes()));
}

}  // namespace carpool::tools
