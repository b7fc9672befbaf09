#include "sim/sim_spec.h"

#include <fmt/core.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

#include "sampler/rng.h"

namespace carpool {
namespace {

Status SpecError(std::string_view arg, const std::string& what) {
  return Status::InvalidArgument(
      fmt::format("--job \"{}\": {}; expected {}", arg, what, kJobSpecGrammar));
}

bool ParseUint(std::string_view s, uint64_t* out) {
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

bool ParseDouble(std::string_view s, double* out) {
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size() && std::isfinite(*out);
}

// Strips the optional "@START", "xSPEED" and "/EPOCHS" suffixes off the end of `body` (in that
// order when more than one is present). Dataset names hold no '/', so the last one is a suffix.
Status ParseSuffixes(std::string_view arg, bool is_dataset, double max_speed,
                     std::string_view* body, JobSpec* spec) {
  if (const size_t slash = body->rfind('/'); slash != std::string_view::npos) {
    std::string_view value = body->substr(slash + 1);
    uint64_t epochs = 0;
    if (!ParseUint(value, &epochs) || epochs == 0 || epochs > UINT32_MAX) {
      return SpecError(arg,
                       fmt::format("EPOCHS \"{}\" is not a number of epochs (1, 2, ...)", value));
    }
    spec->epochs = static_cast<uint32_t>(epochs);
    *body = body->substr(0, slash);
  }
  const size_t x = body->rfind('x');
  const size_t at = body->rfind('@');
  const size_t colon = body->find(':');
  const bool after_range = is_dataset || (colon != std::string_view::npos && x > colon);
  if (x != std::string_view::npos && after_range && (at == std::string_view::npos || x > at)) {
    std::string_view value = body->substr(x + 1);
    double speed = 0;
    // A dataset name may itself contain 'x': only a parsable number after it is a speed.
    if (ParseDouble(value, &speed)) {
      if (!(speed > 0 && speed <= max_speed)) {
        return SpecError(arg,
                         std::isinf(max_speed)
                             ? fmt::format("SPEED \"{}\" is not a number > 0", value)
                             : fmt::format("SPEED \"{}\" is not in (0, {}]", value, max_speed));
      }
      spec->speed = speed;
      *body = body->substr(0, x);
    } else if (!is_dataset) {
      return SpecError(arg, fmt::format("SPEED \"{}\" is not a number", value));
    }
  }
  const size_t at2 = body->rfind('@');
  if (at2 != std::string_view::npos) {
    std::string_view value = body->substr(at2 + 1);
    if (!ParseUint(value, &spec->start)) {
      return SpecError(arg, fmt::format("START \"{}\" is not a round number (0, 1, ...)", value));
    }
    *body = body->substr(0, at2);
  }
  return Status::OK();
}

}  // namespace

Result<JobSpec> ParseJobSpec(std::string_view arg, double max_speed) {
  const size_t eq = arg.find('=');
  if (eq == std::string_view::npos) return SpecError(arg, "missing '=' after the job name");
  JobSpec spec;
  spec.name = std::string(arg.substr(0, eq));
  if (spec.name.empty()) return SpecError(arg, "the job name is empty");
  for (char c : spec.name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) {
      return SpecError(arg, fmt::format("job name \"{}\" may hold only letters, digits, '_', "
                                        "'-' and '.'",
                                        spec.name));
    }
  }
  std::string_view body = arg.substr(eq + 1);
  constexpr std::string_view kDataset = "dataset:";
  if (body.substr(0, kDataset.size()) == kDataset) {
    body.remove_prefix(kDataset.size());
    if (Status s = ParseSuffixes(arg, true, max_speed, &body, &spec); !s.ok()) return s;
    if (body.empty()) return SpecError(arg, "the dataset name is empty");
    spec.dataset = std::string(body);
    return spec;
  }
  if (Status s = ParseSuffixes(arg, false, max_speed, &body, &spec); !s.ok()) return s;
  const size_t pct = body.find('%');
  if (pct != std::string_view::npos) {
    std::string_view value = body.substr(pct + 1);
    if (!ParseDouble(value, &spec.fraction) || !(spec.fraction > 0 && spec.fraction <= 1)) {
      return SpecError(arg, fmt::format("FRACTION \"{}\" is not a number in (0, 1]", value));
    }
    body = body.substr(0, pct);
  }
  const size_t colon = body.find(':');
  if (colon == std::string_view::npos) {
    return SpecError(arg, fmt::format("\"{}\" is not an id range LO:HI", body));
  }
  std::string_view lo = body.substr(0, colon), hi = body.substr(colon + 1);
  constexpr uint64_t kIdLimit = uint64_t{1} << 32;
  if (!ParseUint(lo, &spec.lo)) return SpecError(arg, fmt::format("LO \"{}\" is not an id", lo));
  if (!ParseUint(hi, &spec.hi)) return SpecError(arg, fmt::format("HI \"{}\" is not an id", hi));
  if (spec.hi > kIdLimit) {
    return SpecError(arg, fmt::format("HI {} is above the id limit {}", spec.hi, kIdLimit));
  }
  if (spec.lo >= spec.hi) {
    return SpecError(
        arg, fmt::format("the range {}:{} is empty (LO must be below HI)", spec.lo, spec.hi));
  }
  return spec;
}

Result<Roaring> RangeIds(const JobSpec& spec, uint64_t seed) {
  const uint64_t n = spec.hi - spec.lo;
  Roaring ids;
  if (spec.fraction >= 1.0) {
    ids.addRange(spec.lo, spec.hi);
    return ids;
  }
  const auto keep = static_cast<uint64_t>(std::llround(spec.fraction * static_cast<double>(n)));
  if (keep == 0) {
    return Status::InvalidArgument(fmt::format(
        "job \"{}\": fraction {} of {} ids keeps none; raise the fraction or widen the range",
        spec.name, spec.fraction, n));
  }
  // Selection sampling (Knuth's algorithm S): exactly `keep` ids, every subset equally likely.
  Rng rng(seed);
  uint64_t needed = keep;
  for (uint64_t i = 0; i < n && needed > 0; ++i) {
    if (rng.Uniform(n - i) < needed) {
      ids.add(static_cast<uint32_t>(spec.lo + i));
      --needed;
    }
  }
  return ids;
}

}  // namespace carpool
