#include "tools/cache_fraction.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace carpool::tools {
namespace {

// 200 samples of 256 x 256 x 3: 39.3 MB, 49.2 MB in cache slots.
const PreparedSet kSet{200, 256 * 256 * 3};

TEST(CacheFractionTest, AcceptsFractionsUpToTheMaximum) {
  for (const char* text : {"0.1", "1", "1.0", "0.001", "4"}) {
    Result<double> f = ParseCacheFraction(text);
    ASSERT_TRUE(f.ok()) << text << ": " << f.status().ToString();
    EXPECT_DOUBLE_EQ(*f, std::stod(text));
  }
}

TEST(CacheFractionTest, RejectsOutOfRangeAndNonNumbersNamingTheValueAndTheRange) {
  for (const char* text : {"0", "-0.5", "4.01", "10", "abc", "0.1x", "", "nan", "inf"}) {
    Result<double> f = ParseCacheFraction(text);
    ASSERT_FALSE(f.ok()) << text;
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
    const std::string m = f.status().message();
    EXPECT_NE(m.find(std::string("\"") + text + "\""), std::string::npos) << m;
    EXPECT_NE(m.find("(0, 4]"), std::string::npos) << m;
  }
}

TEST(CacheFractionTest, AFractionScalesTheCacheThatHoldsEverySample) {
  EXPECT_EQ(kSet.bytes(), 39321600u);
  EXPECT_EQ(kSet.cache_bytes(), 49152000u);
  EXPECT_EQ(CacheOfFraction(1.0, kSet).bytes, 49152000u);
  EXPECT_EQ(CacheOfFraction(0.1, kSet).bytes, 4915200u);
  EXPECT_EQ(CacheOfFraction(0.1, kSet).server_flag(), "4915200");
}

TEST(CacheFractionTest, DefaultsGiveOneCachePerFractionInOrder) {
  Result<std::vector<CacheChoice>> c = ChooseCaches(std::nullopt, std::nullopt, kSet, {1.0, 0.1});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->size(), 2u);
  EXPECT_EQ(FractionLabel((*c)[0].fraction), "100%");
  EXPECT_EQ(FractionLabel((*c)[1].fraction), "10%");
}

TEST(CacheFractionTest, AGivenFractionOrSizeReplacesTheDefaults) {
  Result<std::vector<CacheChoice>> f = ChooseCaches("0.25", std::nullopt, kSet, {1.0, 0.1});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->size(), 1u);
  EXPECT_EQ((*f)[0].bytes, 12288000u);

  Result<std::vector<CacheChoice>> s = ChooseCaches(std::nullopt, "512MiB", kSet, {1.0, 0.1});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->size(), 1u);
  EXPECT_EQ((*s)[0].bytes, 512u << 20);
  EXPECT_EQ((*s)[0].server_flag(), "512MiB");
  EXPECT_NEAR((*s)[0].fraction, (512.0 * 1048576) / 49152000, 1e-12);
  EXPECT_EQ(DescribeCache((*s)[0]),
            "cache 1092% of the prepared set (--cache-size 512MiB = 536.9 MB)");
}

TEST(CacheFractionTest, BothOrBadValuesAreErrorsThatNameThem) {
  Result<std::vector<CacheChoice>> both = ChooseCaches("0.1", "1GiB", kSet, {1.0});
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("--cache-fraction 0.1"), std::string::npos);
  EXPECT_NE(both.status().message().find("--cache-size 1GiB"), std::string::npos);

  Result<std::vector<CacheChoice>> fraction = ChooseCaches("5", std::nullopt, kSet, {1.0});
  ASSERT_FALSE(fraction.ok());
  EXPECT_NE(fraction.status().message().find("\"5\""), std::string::npos);

  Result<std::vector<CacheChoice>> size = ChooseCaches(std::nullopt, "lots", kSet, {1.0});
  ASSERT_FALSE(size.ok());
  EXPECT_NE(size.status().message().find("--cache-size \"lots\""), std::string::npos);
}

TEST(CacheFractionTest, ByteCountsUseTheServersUnits) {
  EXPECT_EQ(*ParseByteCount("--x", "0"), 0u);
  EXPECT_EQ(*ParseByteCount("--x", "4096"), 4096u);
  EXPECT_EQ(*ParseByteCount("--x", "64K"), 65536u);
  EXPECT_EQ(*ParseByteCount("--x", "8GiB"), uint64_t{8} << 30);
  EXPECT_EQ(*ParseByteCount("--x", "1.5GB"), 1500000000u);
  EXPECT_FALSE(ParseByteCount("--x", "1.5 GB").ok());
  EXPECT_FALSE(ParseByteCount("--x", "GiB").ok());
}

TEST(CacheFractionTest, LabelsAndDescriptions) {
  EXPECT_EQ(FractionLabel(0.125), "12.5%");
  EXPECT_EQ(FractionLabel(0.005), "0.5%");
  EXPECT_EQ(FractionLabel(9.13), "913%");
  EXPECT_EQ(DescribeCache(CacheOfFraction(0.1, kSet)), "cache 10% of the prepared set (4.9 MB)");
  EXPECT_EQ(DescribePreparedSet(kSet),
            "the prepared set: 200 samples x 196608 B = 39.3 MB (49.2 MB in cache slots)");
  EXPECT_EQ(FormatBytes(999), "999 B");
  EXPECT_EQ(FormatBytes(uint64_t{8} << 30), "8.59 GB");
}

}  // namespace
}  // namespace carpool::tools
