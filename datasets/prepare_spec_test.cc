#include "datasets/prepare_spec.h"

#include <gtest/gtest.h>

namespace carpool {
namespace {

TEST(PrepareSpecTest, ParsesResizeAndCrop) {
  auto spec = ParsePrepareSpec("resize=256,crop=224");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->resize, 256);
  EXPECT_EQ(spec->crop, 224);
  EXPECT_FALSE(spec->raw);
  EXPECT_EQ(spec->channels, 3);
  EXPECT_EQ(spec->ToString(), "resize=256,crop=224");
}

TEST(PrepareSpecTest, RoundTripsThroughText) {
  for (const char* text : {"raw", "raw,channels=1", "resize=32", "crop=28,channels=1",
                           "resize=256,crop=256", "resize=256,crop=256,decode=gpu"}) {
    auto spec = ParsePrepareSpec(text);
    ASSERT_TRUE(spec.ok()) << text << ": " << spec.status().ToString();
    auto again = ParsePrepareSpec(spec->ToString());
    ASSERT_TRUE(again.ok()) << spec->ToString();
    EXPECT_EQ(*spec, *again) << text;
  }
}

TEST(PrepareSpecTest, RejectsBadInputNamingTheValue) {
  struct Case {
    const char* text;
    const char* must_mention;
  };
  for (const Case& c : {Case{"", "empty"}, Case{"resize=abc", "abc"}, Case{"resize=0", "resize"},
                        Case{"size=3", "size"}, Case{"raw,resize=32", "raw"},
                        Case{"channels=2", "channels=2"}, Case{"resize=32,crop=64", "crop=64"},
                        Case{"resize=99999", "99999"}, Case{"bogus", "bogus"},
                        Case{"resize=64,decode=nvjpeg", "nvjpeg"},
                        Case{"raw,decode=gpu", "decode=gpu"},
                        Case{"resize=64,channels=1,decode=gpu", "channels=1"}}) {
    auto spec = ParsePrepareSpec(c.text);
    ASSERT_FALSE(spec.ok()) << c.text;
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(spec.status().message().find(c.must_mention), std::string::npos)
        << spec.status().message();
  }
}

// decode=gpu names another prepared sample of the same files: it must survive the text form the
// catalog and the job info carry, and compare unequal to the CPU spec.
TEST(PrepareSpecTest, GpuDecodeIsPartOfTheSpec) {
  auto gpu = ParsePrepareSpec("decode=gpu,resize=256,crop=224");
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  EXPECT_TRUE(gpu->gpu_decode);
  EXPECT_EQ(gpu->ToString(), "resize=256,crop=224,decode=gpu");
  auto cpu = ParsePrepareSpec("resize=256,crop=224,decode=cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  EXPECT_FALSE(cpu->gpu_decode);
  EXPECT_EQ(cpu->ToString(), "resize=256,crop=224");
  EXPECT_FALSE(*gpu == *cpu);
}

}  // namespace
}  // namespace carpool
