#include "datasets/derived.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/log.h"

namespace carpool {

namespace {

DerivedSet From(const DatasetInfo& src, Roaring ids, std::string desc) {
  DerivedSet d;
  d.ids = std::move(ids);
  d.meta.prepare_spec = src.prepare_spec;
  d.meta.classes = src.classes;
  d.meta.source_desc = std::move(desc);
  return d;
}

bool ParseU64(std::string_view s, uint64_t* v) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && end == s.data() + s.size();
}

// Uniform in [0, bound) from a 64-bit generator, by rejection, so the result is the same on
// every standard library (std::uniform_int_distribution is not).
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t bound) {
  uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do {
    x = rng();
  } while (x >= limit);
  return x % bound;
}

}  // namespace

Result<DerivedSet> SelectClasses(const Catalog& catalog, const DatasetInfo& from,
                                 std::string_view classes) {
  std::set<int32_t> wanted;
  size_t pos = 0;
  while (pos <= classes.size()) {
    size_t comma = classes.find(',', pos);
    if (comma == std::string_view::npos) comma = classes.size();
    std::string_view item = classes.substr(pos, comma - pos);
    pos = comma + 1;
    int32_t index = -1;
    for (size_t c = 0; c < from.classes.size(); ++c) {
      if (from.classes[c] == item) index = static_cast<int32_t>(c);
    }
    uint64_t n = 0;
    if (index < 0 && ParseU64(item, &n) && n < from.classes.size()) index = static_cast<int32_t>(n);
    if (index < 0) {
      return Status::InvalidArgument(fmt::format(
          "class \"{}\" is not in dataset \"{}\" (classes: {}); pass names or indices 0..{}", item,
          from.name,
          from.classes.empty() ? "none" : fmt::format("{}", fmt::join(from.classes, ",")),
          static_cast<int64_t>(from.classes.size()) - 1));
    }
    wanted.insert(index);
  }
  Result<std::vector<SampleRecord>> samples = catalog.GetSamples(from.ids);
  if (!samples.ok()) return samples.status();
  Roaring ids;
  for (const SampleRecord& r : *samples) {
    if (wanted.count(r.label) != 0) ids.add(r.id);
  }
  return From(from, std::move(ids), fmt::format("from {}, classes {}", from.name, classes));
}

Result<DerivedSet> SelectFraction(const DatasetInfo& from, double fraction, uint64_t seed) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return Status::InvalidArgument(
        fmt::format("--fraction {} is not in (0, 1]; pass e.g. --fraction 0.5", fraction));
  }
  std::vector<uint32_t> pool(from.ids.cardinality());
  from.ids.toUint32Array(pool.data());
  const uint64_t k =
      static_cast<uint64_t>(std::llround(fraction * static_cast<double>(pool.size())));
  // Partial Fisher-Yates: the first k slots become a uniform k-subset.
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0; i < k; ++i) {
    uint64_t j = i + UniformBelow(rng, pool.size() - i);
    std::swap(pool[i], pool[j]);
  }
  Roaring ids;
  ids.addMany(k, pool.data());
  return From(from, std::move(ids),
              fmt::format("from {}, fraction {} seed {}", from.name, fraction, seed));
}

Result<DerivedSet> SelectIdRange(const DatasetInfo& from, std::string_view range) {
  size_t colon = range.find(':');
  uint64_t lo = 0, hi = uint64_t{UINT32_MAX} + 1;
  bool ok = colon != std::string_view::npos;
  if (ok && colon > 0) ok = ParseU64(range.substr(0, colon), &lo);
  if (ok && colon + 1 < range.size()) ok = ParseU64(range.substr(colon + 1), &hi);
  if (!ok || lo >= hi) {
    return Status::InvalidArgument(fmt::format(
        "--ids \"{}\" is not a range LO:HI with LO < HI (half-open, either may be omitted); "
        "e.g. --ids 0:1000",
        range));
  }
  Roaring window;
  window.addRange(lo, std::min(hi, uint64_t{UINT32_MAX} + 1));
  return From(from, from.ids & window, fmt::format("from {}, ids {}", from.name, range));
}

Result<DerivedSet> Combine(SetOp op, const DatasetInfo& a, const DatasetInfo& b,
                           std::string_view prepare) {
  if (prepare.empty() && a.prepare_spec != b.prepare_spec) {
    return Status::InvalidArgument(fmt::format(
        "datasets \"{}\" ({}) and \"{}\" ({}) have different prepare specs; pass --prepare", a.name,
        a.prepare_spec, b.name, b.prepare_spec));
  }
  if (a.classes != b.classes) {
    log::Warn(
        "datasets \"{}\" and \"{}\" have different classes; the result keeps the classes "
        "of \"{}\" and each sample its registered label",
        a.name, b.name, a.name);
  }
  Roaring ids;
  std::string_view word;
  switch (op) {
    case SetOp::kUnion:
      ids = a.ids | b.ids;
      word = "union";
      break;
    case SetOp::kIntersect:
      ids = a.ids & b.ids;
      word = "intersect";
      break;
    case SetOp::kMinus:
      ids = a.ids - b.ids;
      word = "minus";
      break;
  }
  DerivedSet d = From(a, std::move(ids), fmt::format("{} {} {}", a.name, word, b.name));
  if (!prepare.empty()) d.meta.prepare_spec = std::string(prepare);
  return d;
}

}  // namespace carpool
