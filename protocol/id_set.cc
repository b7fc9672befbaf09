#include "protocol/id_set.h"

#include <fmt/format.h>

namespace carpool::protocol {
namespace {

enum Form : uint8_t { kRuns = 1, kBitmap = 2 };

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

bool GetVarint(std::string_view bytes, size_t* pos, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && *pos < bytes.size(); shift += 7) {
    const uint8_t b = static_cast<uint8_t>(bytes[(*pos)++]);
    *v |= uint64_t{b & 0x7fu} << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

std::string Runs(const std::vector<uint32_t>& ids) {
  // kRuns | count of runs | (gap from the end of the previous run, length - 1) per run
  std::vector<std::pair<uint32_t, uint32_t>> runs;  // first, length
  for (uint32_t id : ids) {
    if (!runs.empty() && uint64_t{runs.back().first} + runs.back().second == id) {
      ++runs.back().second;
    } else {
      runs.emplace_back(id, 1);
    }
  }
  std::string out(1, static_cast<char>(kRuns));
  PutVarint(&out, runs.size());
  uint64_t end = 0;  // one past the previous run
  for (const auto& [first, length] : runs) {
    PutVarint(&out, first - end);
    PutVarint(&out, length - 1);
    end = uint64_t{first} + length;
  }
  return out;
}

std::string Bitmap(const std::vector<uint32_t>& ids) {
  // kBitmap | first | bits (= last - first + 1) | ceil(bits / 8) bytes, LSB first
  const uint32_t first = ids.front();
  const uint64_t bits = uint64_t{ids.back()} - first + 1;
  std::string out(1, static_cast<char>(kBitmap));
  PutVarint(&out, first);
  PutVarint(&out, bits);
  const size_t at = out.size();
  out.resize(at + (bits + 7) / 8, '\0');
  for (uint32_t id : ids) {
    const uint64_t bit = id - first;
    out[at + bit / 8] = static_cast<char>(static_cast<uint8_t>(out[at + bit / 8]) | (1u << (bit % 8)));
  }
  return out;
}

}  // namespace

std::string EncodeIdSet(const std::vector<uint32_t>& ids) {
  if (ids.empty()) return Runs(ids);
  const uint64_t range = uint64_t{ids.back()} - ids.front() + 1;
  // A bitmap costs range/8 bytes; runs cost at least 2 bytes each, usually 2-4.
  std::string runs = Runs(ids);
  if (range / 8 + 12 >= runs.size()) return runs;
  return Bitmap(ids);
}

Result<std::vector<uint32_t>> DecodeIdSet(std::string_view bytes, uint64_t max_ids) {
  auto bad = [&](std::string_view what) {
    return Status::Corruption(
        fmt::format("a {}-byte sample id set is malformed: {}", bytes.size(), what));
  };
  if (bytes.empty()) return bad("empty (expected a form byte)");
  size_t pos = 1;
  std::vector<uint32_t> ids;
  if (bytes[0] == static_cast<char>(kRuns)) {
    uint64_t count = 0;
    if (!GetVarint(bytes, &pos, &count)) return bad("truncated run count");
    if (count > bytes.size()) return bad(fmt::format("{} runs in so few bytes", count));
    uint64_t end = 0;
    for (uint64_t r = 0; r < count; ++r) {
      uint64_t gap = 0, length = 0;
      if (!GetVarint(bytes, &pos, &gap) || !GetVarint(bytes, &pos, &length)) {
        return bad(fmt::format("run {} of {} is truncated", r, count));
      }
      // Each term below 2^32 before the sum, so that a huge gap cannot wrap it back into range.
      if ((r > 0 && gap == 0) || gap >= (uint64_t{1} << 32) || length >= (uint64_t{1} << 32) ||
          end + gap + length + 1 > (uint64_t{1} << 32)) {
        return bad(fmt::format("run {} overlaps the previous one or passes id 2^32 - 1", r));
      }
      if (ids.size() + length + 1 > max_ids) {
        return bad(fmt::format("more than {} ids (run {} alone has {})", max_ids, r, length + 1));
      }
      const uint64_t first = end + gap;
      for (uint64_t i = 0; i <= length; ++i) ids.push_back(static_cast<uint32_t>(first + i));
      end = first + length + 1;
    }
  } else if (bytes[0] == static_cast<char>(kBitmap)) {
    uint64_t first = 0, bits = 0;
    if (!GetVarint(bytes, &pos, &first) || !GetVarint(bytes, &pos, &bits)) {
      return bad("truncated bitmap header");
    }
    if (bits == 0 || first >= (uint64_t{1} << 32) || bits > (uint64_t{1} << 32) ||
        first + bits > (uint64_t{1} << 32)) {
      return bad(fmt::format("bitmap of {} bits from id {} passes id 2^32 - 1", bits, first));
    }
    if (bytes.size() - pos != (bits + 7) / 8) {
      return bad(fmt::format("bitmap of {} bits needs {} bytes, has {}", bits, (bits + 7) / 8,
                             bytes.size() - pos));
    }
    for (uint64_t bit = 0; bit < bits; ++bit) {
      if (static_cast<uint8_t>(bytes[pos + bit / 8]) & (1u << (bit % 8))) {
        if (ids.size() == max_ids) return bad(fmt::format("more than {} ids", max_ids));
        ids.push_back(static_cast<uint32_t>(first + bit));
      }
    }
    if (ids.empty() || ids.front() != first || ids.back() != first + bits - 1) {
      return bad("bitmap does not start and end with a set bit");
    }
    pos = bytes.size();
  } else {
    return bad(fmt::format("form byte {} (expected {} or {})",
                           static_cast<int>(static_cast<uint8_t>(bytes[0])), int{kRuns},
                           int{kBitmap}));
  }
  if (pos != bytes.size()) return bad(fmt::format("{} bytes left over", bytes.size() - pos));
  return ids;
}

}  // namespace carpool::protocol
