// BatchDecoder on a GPU: nvJPEG plus the exact resize give the pixels the CPU gives for a
// decode=gpu spec (identical on the JPEG engines, within the hybrid backend's IDCT differences
// otherwise); streams nvJPEG refuses (progressive, PNG) are decoded on the CPU; a damaged stream
// is reported, not built. Skips without a GPU or without nvJPEG in the build.
#include "server/gpu/batch_decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "server/gpu/device_probe.h"
#include "server/gpu/test_photo.h"
#include "server/image_codec.h"

namespace carpool::gpu {
namespace {

// Photo-like RGB (test_photo.h) as a matrix.
cv::Mat PhotoMat(int w, int h, uint32_t seed) {
  return cv::Mat(h, w, CV_8UC3, Photo(w, h, seed).data()).clone();
}

std::vector<uint8_t> Jpeg(const cv::Mat& rgb, const JpegEncodeOptions& options) {
  Result<std::vector<uint8_t>> out = EncodeJpeg(rgb, ChannelOrder::kRgb, options);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : std::vector<uint8_t>{};
}

// A JPEG whose frame names an undefined quantization table: its header reads, no decoder decodes it.
std::vector<uint8_t> Damaged(std::vector<uint8_t> jpeg) {
  for (size_t i = 0; i + 12 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {
      jpeg[i + 12] = 3;  // the first component's table selector
      return jpeg;
    }
  }
  ADD_FAILURE() << "no SOF0";
  return jpeg;
}

class BatchDecoderTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef CARPOOL_HAVE_NVJPEG
    GTEST_SKIP() << "built without nvJPEG: BatchDecoder's GPU side is not built";
#endif
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: skipping GPU decode tests";
    Result<std::unique_ptr<JpegDecoder>> d = JpegDecoder::Create(16);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    hardware_ = (*d)->backend() == JpegBackend::kHardware;
    // A small scratch cap, so that one call runs several decode batches.
    decoder_ = std::make_unique<BatchDecoder>(std::move(*d), uint64_t{4} << 20);
    Result<CudaStream> s = CudaStream::Create();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    stream_ = std::move(*s);
    std::printf("GPU decode backend: %s\n", decoder_->backend().c_str());
  }

  bool hardware_ = false;
  std::unique_ptr<BatchDecoder> decoder_;
  CudaStream stream_;
};

TEST_F(BatchDecoderTest, GivesTheCpuPixelsOfTheDecodeGpuSpecAndReportsWhatItCannotDecode) {
  Result<PrepareSpec> spec = ParsePrepareSpec("resize=256,crop=224,decode=gpu");
  ASSERT_TRUE(spec.ok());
  std::vector<std::vector<uint8_t>> files;
  const std::pair<int, int> sizes[] = {{500, 375}, {375, 500}, {640, 480}, {333, 250}, {240, 240}};
  for (int i = 0; i < 40; ++i) {
    const auto [w, h] = sizes[i % 5];
    files.push_back(Jpeg(PhotoMat(w, h, i), {.quality = 90, .subsample_chroma = i % 3 != 0}));
  }
  const size_t progressive = files.size();
  files.push_back(Jpeg(PhotoMat(500, 375, 99), {.quality = 90, .progressive = true}));
  const size_t png = files.size();
  Result<std::vector<uint8_t>> png_bytes = EncodePng(PhotoMat(400, 300, 98), ChannelOrder::kRgb);
  ASSERT_TRUE(png_bytes.ok());
  files.push_back(*png_bytes);
  const size_t damaged = files.size();
  files.push_back(Damaged(Jpeg(PhotoMat(500, 375, 97), {.quality = 90})));

  const PreparedShape shape{224, 224, 3};
  Result<DeviceBuffer> out = DeviceBuffer::Allocate(files.size() * shape.bytes());
  ASSERT_TRUE(out.ok());
  std::vector<DecodeTarget> targets;
  for (size_t i = 0; i < files.size(); ++i) {
    targets.push_back({i, files[i], shape, static_cast<uint8_t*>(out->data()) + i * shape.bytes()});
  }
  std::vector<std::pair<size_t, Status>> failed;
  DecodeCounts counts;
  ASSERT_TRUE(decoder_->Decode(*spec, targets, stream_.get(), &failed, &counts).ok());
  EXPECT_EQ(counts.gpu, 40u);
  EXPECT_EQ(counts.cpu, 2u);  // the progressive JPEG and the PNG
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].first, damaged);
  EXPECT_EQ(counts.failed, 1u);
  std::printf("damaged: %s\n", failed[0].second.ToString().c_str());

  ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
  std::vector<uint8_t> host(files.size() * shape.bytes());
  ASSERT_EQ(cudaMemcpy(host.data(), out->data(), host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  int worst = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    if (i == damaged) continue;
    Result<PreparedImage> want = PrepareGpuPixelsOnCpu(*spec, files[i]);
    ASSERT_TRUE(want.ok()) << i << ": " << want.status().ToString();
    int diff = 0;
    for (size_t k = 0; k < shape.bytes(); ++k) {
      diff = std::max(diff, std::abs(int(host[i * shape.bytes() + k]) - int(want->pixels[k])));
    }
    if (i == progressive || i == png) {
      EXPECT_EQ(diff, 0) << "the CPU decoded it: the same code";
    }
    worst = std::max(worst, diff);
  }
  std::printf("largest difference from the CPU's decode=gpu pixels: %d\n", worst);
  // The JPEG engines replicate chroma with libjpeg-turbo's integer IDCT: the same bytes. The
  // hybrid backend's IDCT differs by up to 3 levels before the resize (docs/gpu.md).
  EXPECT_LE(worst, hardware_ ? 0 : 3);
}

// Without the CPU fallback (a job's process decoding for the server, job_decode_lib.cc), what
// nvJPEG refuses is left undecoded and reported, for the server to decode; the rest is decoded.
TEST_F(BatchDecoderTest, WithoutTheCpuFallbackWhatNvjpegRefusesIsLeftForTheServer) {
  Result<PrepareSpec> spec = ParsePrepareSpec("resize=64,crop=64,decode=gpu");
  ASSERT_TRUE(spec.ok());
  Result<std::unique_ptr<JpegDecoder>> d = JpegDecoder::Create(16);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  BatchDecoder job_side(std::move(*d), uint64_t{4} << 20, /*cpu_fallback=*/false);
  std::vector<std::vector<uint8_t>> files;
  for (int i = 0; i < 6; ++i) files.push_back(Jpeg(PhotoMat(200, 150, i), {.quality = 90}));
  files.push_back(Jpeg(PhotoMat(200, 150, 50), {.quality = 90, .progressive = true}));
  Result<std::vector<uint8_t>> png_bytes = EncodePng(PhotoMat(200, 150, 51), ChannelOrder::kRgb);
  ASSERT_TRUE(png_bytes.ok());
  files.push_back(*png_bytes);
  files.push_back(Damaged(Jpeg(PhotoMat(200, 150, 52), {.quality = 90})));
  const PreparedShape shape{64, 64, 3};
  Result<DeviceBuffer> out = DeviceBuffer::Allocate(files.size() * shape.bytes());
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(cudaMemset(out->data(), 0xAB, out->bytes()), cudaSuccess);
  std::vector<DecodeTarget> targets;
  for (size_t i = 0; i < files.size(); ++i) {
    targets.push_back({i, files[i], shape, static_cast<uint8_t*>(out->data()) + i * shape.bytes()});
  }
  std::vector<std::pair<size_t, Status>> failed;
  DecodeCounts counts;
  ASSERT_TRUE(job_side.Decode(*spec, targets, stream_.get(), &failed, &counts).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
  EXPECT_EQ(counts.gpu, 6u);
  EXPECT_EQ(counts.cpu, 0u);
  std::vector<size_t> left;
  for (const auto& [index, why] : failed) left.push_back(index);
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<size_t>{6, 7, 8}));  // progressive, PNG, damaged
  std::vector<uint8_t> host(files.size() * shape.bytes());
  ASSERT_EQ(cudaMemcpy(host.data(), out->data(), host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 6; i < files.size(); ++i) {  // left as they were: nothing written
    for (size_t k = 0; k < shape.bytes(); ++k) ASSERT_EQ(host[i * shape.bytes() + k], 0xAB) << i;
  }
  for (size_t i = 0; i < 6; ++i) {
    Result<PreparedImage> want = PrepareGpuPixelsOnCpu(*spec, files[i]);
    ASSERT_TRUE(want.ok());
    int diff = 0;
    for (size_t k = 0; k < shape.bytes(); ++k) {
      diff = std::max(diff, std::abs(int(host[i * shape.bytes() + k]) - int(want->pixels[k])));
    }
    EXPECT_LE(diff, hardware_ ? 0 : 3) << i;
  }
}

}  // namespace
}  // namespace carpool::gpu
