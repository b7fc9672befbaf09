#include "server/cpu_share.h"

#include <gtest/gtest.h>

#include <vector>

#include "server/image_codec.h"
#include "server/test_images.h"

namespace carpool {
namespace {

PrepareSpec GpuSpec() {
  PrepareSpec spec;
  spec.resize = 64;
  spec.crop = 56;
  spec.gpu_decode = true;
  return spec;
}

std::vector<std::vector<uint8_t>> Jpegs(int n) {
  std::vector<std::vector<uint8_t>> out;
  for (int i = 0; i < n; ++i) {
    Result<std::vector<uint8_t>> jpeg = EncodeJpeg(MakePhoto(120 + 8 * (i % 5), 90, uint32_t(i)),
                                                   ChannelOrder::kBgr, {.quality = 90});
    EXPECT_TRUE(jpeg.ok()) << jpeg.status().ToString();
    out.push_back(jpeg.ok() ? *jpeg : std::vector<uint8_t>{});
  }
  return out;
}

std::vector<std::span<const uint8_t>> Views(const std::vector<std::vector<uint8_t>>& jpegs) {
  return {jpegs.begin(), jpegs.end()};
}

// Two builds' parts in flight at once: each JPEG comes back as PrepareGpuPixelsOnCpu's pixels,
// a damaged one as its own error, and the count says how many decoded.
TEST(CpuShareTest, PartsGiveTheCpuDecodeGpuPixelsAndEachJpegsOwnError) {
  const PrepareSpec spec = GpuSpec();
  std::vector<std::vector<uint8_t>> a = Jpegs(12), b = Jpegs(7);
  b[3].resize(b[3].size() / 2);  // cut in half: it cannot decode
  CpuShare share({.threads = 3});
  std::shared_ptr<const CpuShare::Part> pa = share.Start(spec, Views(a));
  std::shared_ptr<const CpuShare::Part> pb = share.Start(spec, Views(b));
  pb->Wait();
  pa->Wait();
  EXPECT_TRUE(pa->Done());
  for (const auto& [jpegs, part] : {std::pair{&a, pa}, std::pair{&b, pb}}) {
    ASSERT_EQ(part->results().size(), jpegs->size());
    for (size_t i = 0; i < jpegs->size(); ++i) {
      Result<PreparedImage> want = PrepareGpuPixelsOnCpu(spec, (*jpegs)[i]);
      const Result<PreparedImage>& got = part->results()[i];
      ASSERT_EQ(got.ok(), want.ok()) << i << ": " << got.status().ToString();
      if (!want.ok()) {
        EXPECT_EQ(got.status().code(), want.status().code());
        continue;
      }
      EXPECT_EQ(got->shape, want->shape);
      EXPECT_EQ(got->pixels, want->pixels) << "JPEG " << i;
    }
  }
  EXPECT_FALSE(pb->results()[3].ok());
  EXPECT_EQ(share.decoded(), 12u + 6u);
}

// The share follows the reports: up while the CPU part is done first, down while the job's
// answer comes first, within [0, max_fraction], and never the whole build.
TEST(CpuShareTest, TheShareFollowsWhichSideFinishedFirst) {
  CpuShare off({.threads = 0});
  EXPECT_EQ(off.Keep(256), 0u);
  CpuShare share(
      {.threads = 1, .initial = 0.1, .step_up = 0.05, .step_down = 0.1, .max_fraction = 0.3});
  EXPECT_EQ(share.Keep(200), 20u);
  EXPECT_EQ(share.Keep(1), 0u);  // one JPEG: the job's alone
  share.Report(true);
  EXPECT_EQ(share.Keep(200), 30u);
  for (int i = 0; i < 10; ++i) share.Report(true);
  EXPECT_DOUBLE_EQ(share.fraction(), 0.3);
  EXPECT_EQ(share.Keep(200), 60u);
  EXPECT_EQ(share.Keep(2), 1u);  // at most all but one
  share.Report(false);
  EXPECT_NEAR(share.fraction(), 0.2, 1e-12);
  for (int i = 0; i < 10; ++i) share.Report(false);
  EXPECT_EQ(share.fraction(), 0.0);
  EXPECT_EQ(share.Keep(200), 0u);
}

// A share destroyed while a build's part is queued finishes the part first: the build's Wait
// returns with every JPEG decoded.
TEST(CpuShareTest, DestroyingTheShareFinishesThePartsQueued) {
  const PrepareSpec spec = GpuSpec();
  const std::vector<std::vector<uint8_t>> jpegs = Jpegs(20);
  std::shared_ptr<const CpuShare::Part> part;
  {
    CpuShare share({.threads = 1});
    part = share.Start(spec, Views(jpegs));
  }
  part->Wait();
  for (const Result<PreparedImage>& r : part->results())
    EXPECT_TRUE(r.ok()) << r.status().ToString();
}

}  // namespace
}  // namespace carpool
