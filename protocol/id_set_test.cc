#include "protocol/id_set.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace carpool::protocol {
namespace {

std::vector<uint32_t> RandomSet(std::mt19937& rng, uint32_t lo, uint32_t span, double density) {
  std::vector<uint32_t> ids;
  std::bernoulli_distribution take(density);
  for (uint32_t i = 0; i < span; ++i) {
    if (take(rng)) ids.push_back(lo + i);
  }
  return ids;
}

TEST(IdSetTest, RandomSetsRoundTripInTheSmallerForm) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const double density = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    const uint32_t lo = trial % 3 == 0 ? 0 : rng();
    const uint32_t span = std::min<uint32_t>(1 + rng() % 5000, UINT32_MAX - lo);
    const std::vector<uint32_t> ids = RandomSet(rng, lo, span, density);
    const std::string bytes = EncodeIdSet(ids);
    Result<std::vector<uint32_t>> back = DecodeIdSet(bytes, ids.size());
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ASSERT_EQ(*back, ids) << "trial " << trial;
    if (ids.size() > 64) {
      const uint64_t range = uint64_t{ids.back()} - ids.front() + 1;
      EXPECT_LE(bytes.size(), range / 8 + 24) << "trial " << trial;  // never worse than a bitmap
    }
  }
}

TEST(IdSetTest, EdgesRoundTrip) {
  for (const std::vector<uint32_t>& ids :
       {std::vector<uint32_t>{}, {0}, {UINT32_MAX}, {0, UINT32_MAX}, {UINT32_MAX - 1, UINT32_MAX}}) {
    Result<std::vector<uint32_t>> back = DecodeIdSet(EncodeIdSet(ids), ids.size());
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, ids);
  }
}

TEST(IdSetTest, HalfOfAnImageNetEpochFitsAFrame) {
  std::mt19937 rng(9);
  const std::vector<uint32_t> ids = RandomSet(rng, 1, 1281167, 0.5);
  const std::string bytes = EncodeIdSet(ids);
  EXPECT_LT(bytes.size(), 170000u);
  ASSERT_EQ(*DecodeIdSet(bytes, ids.size()), ids);
}

TEST(IdSetTest, MalformedBytesAreCorruptionNeverACrash) {
  std::mt19937 rng(3);
  const std::string good = EncodeIdSet(RandomSet(rng, 10, 3000, 0.3));
  for (const std::string& bad : {std::string(), std::string("\x07"), std::string("\x01\x05"),
                                 std::string("\x02\x00\x09\xff"), good.substr(0, good.size() / 2),
                                 good + "x"}) {
    Result<std::vector<uint32_t>> r = DecodeIdSet(bad, 1u << 20);
    ASSERT_FALSE(r.ok()) << bad.size();
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
    EXPECT_NE(r.status().message().find("sample id set"), std::string::npos);
  }
  // Random mutations: any answer but a crash; an accepted set is ascending and distinct.
  for (int i = 0; i < 2000; ++i) {
    std::string m = good;
    for (int f = 0; f < 3; ++f) m[rng() % m.size()] = static_cast<char>(rng());
    Result<std::vector<uint32_t>> r = DecodeIdSet(m, 1u << 20);
    if (r.ok()) {
      EXPECT_TRUE(std::adjacent_find(r->begin(), r->end(), std::greater_equal<>()) == r->end());
    }
  }
}

// A few bytes of runs can name billions of ids: the caller's bound refuses them.
TEST(IdSetTest, ASetLargerThanTheBoundIsRefused) {
  std::vector<uint32_t> ids(5000);
  for (uint32_t i = 0; i < 5000; ++i) ids[i] = i;
  const std::string runs = EncodeIdSet(ids);  // one run: a handful of bytes
  EXPECT_LT(runs.size(), 8u);
  Result<std::vector<uint32_t>> r = DecodeIdSet(runs, 4999);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more than 4999 ids"), std::string::npos)
      << r.status().ToString();
  EXPECT_TRUE(DecodeIdSet(runs, 5000).ok());
}

// Found by the fuzzer: a gap near 2^64 wrapped the range check back under 2^32, and a run
// repeated an earlier id. Each varint is checked on its own before any sum.
TEST(IdSetTest, HugeVarintsThatWouldWrapAreRefused) {
  // A form byte, then varints, then raw bytes (appended: GCC 12 -O3 warns on "x" + string).
  auto set = [](char form, std::initializer_list<uint64_t> varints, std::string_view tail = {}) {
    std::string s(1, form);
    for (uint64_t v : varints) {
      for (; v >= 0x80; v >>= 7) s.push_back(static_cast<char>((v & 0x7f) | 0x80));
      s.push_back(static_cast<char>(v));
    }
    s.append(tail);
    return s;
  };
  const uint64_t wrap = ~uint64_t{0};  // end (6) + wrap = 5: id 5 again
  const std::string runs = set('\x01', {2, 5, 0, wrap, 0});
  const std::string long_run = set('\x01', {1, 0, wrap});
  const std::string bitmap_first = set('\x02', {wrap - 2, 8}, "\x81");
  const std::string bitmap_bits = set('\x02', {4, wrap - 1}, "\x81");
  for (const std::string& bad : {runs, long_run, bitmap_first, bitmap_bits}) {
    Result<std::vector<uint32_t>> r = DecodeIdSet(bad, 1u << 20);
    ASSERT_FALSE(r.ok()) << bad.size();
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
    EXPECT_NE(r.status().message().find("passes id 2^32 - 1"), std::string::npos)
        << r.status().ToString();
  }
  // The same shapes in range still decode.
  EXPECT_EQ(*DecodeIdSet(set('\x01', {2, 5, 0, 3, 0}), 9), (std::vector<uint32_t>{5, 9}));
}

}  // namespace
}  // namespace carpool::protocol
