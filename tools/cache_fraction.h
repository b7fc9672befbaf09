// A benchmark's cache size as a fraction of its prepared set (`--cache-fraction F`), or an
// explicit `--cache-size` reported as one, so that every report says how much of the data the
// cache could hold. A fraction counts samples: a cache of F has room for about F of the set's
// samples, each taking 5/4 of its prepared bytes in a cache slot (slot header and size-class
// rounding, the allowance bench e2e has always made). bench/cache.py is the Python twin.
// Stateless functions: thread-safe.
#ifndef CARPOOL_TOOLS_CACHE_FRACTION_H_
#define CARPOOL_TOOLS_CACHE_FRACTION_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "carpool/status.h"

namespace carpool::tools {

// A larger cache only repeats the full-cache case at a higher memory cost.
inline constexpr double kMaxCacheFraction = 4.0;

// Every sample a benchmark's jobs may read, as the server prepares them.
struct PreparedSet {
  uint64_t samples = 0;
  uint64_t sample_bytes = 0;  // one prepared sample, e.g. 256 x 256 x 3

  uint64_t bytes() const { return samples * sample_bytes; }
  // The cache that holds every sample: each one's bytes plus a quarter for its slot.
  uint64_t cache_bytes() const { return bytes() + bytes() / 4; }
};

// One cache size of a run.
struct CacheChoice {
  double fraction = 0;  // of the prepared set: 1 = room for every sample
  uint64_t bytes = 0;
  std::string size_text;  // --cache-size as given; empty: from the fraction

  // What to pass as the server's --cache-size.
  std::string server_flag() const { return size_text.empty() ? std::to_string(bytes) : size_text; }
};

// "0.1" -> 0.1. InvalidArgument, naming the text and the range (0, kMaxCacheFraction], for
// anything else: not a number, 0, negative, too large.
Result<double> ParseCacheFraction(std::string_view text);

// "0", "4096", "512MiB", "8GiB", "1.5GB", "64K": the syntax of `carpool server --cache-size`.
// InvalidArgument names `flag` and the text.
Result<uint64_t> ParseByteCount(std::string_view flag, std::string_view text);

CacheChoice CacheOfFraction(double fraction, const PreparedSet& set);
CacheChoice CacheOfSize(uint64_t bytes, std::string size_text, const PreparedSet& set);

// The caches a run measures: the one of --cache-fraction or of --cache-size, else one per
// default fraction. InvalidArgument when both are given, or on a bad value of either.
Result<std::vector<CacheChoice>> ChooseCaches(const std::optional<std::string>& fraction,
                                              const std::optional<std::string>& cache_size,
                                              const PreparedSet& set,
                                              const std::vector<double>& default_fractions);

// "10%", "12.5%", "913%": a table cell.
std::string FractionLabel(double fraction);
// "cache 10% of the prepared set (49.2 MB)", "cache 913% of the prepared set (--cache-size
// 512MiB = 536.9 MB)".
std::string DescribeCache(const CacheChoice& cache);
// "the prepared set: 200 samples x 196608 B = 39.3 MB (49.2 MB in cache slots)".
std::string DescribePreparedSet(const PreparedSet& set);
// {"fraction", "label", "bytes", "cache_size", "given_as", "description"}, for JSON reports.
nlohmann::ordered_json CacheJson(const CacheChoice& cache);
// 49152000 -> "49.2 MB" (decimal units).
std::string FormatBytes(uint64_t bytes);

}  // namespace carpool::tools

#endif  // CARPOOL_TOOLS_CACHE_FRACTION_H_
