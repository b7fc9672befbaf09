// JpegDecoder on a GPU: pixels within the documented tolerance of libjpeg-turbo's, the streams it
// must leave to the CPU (progressive, PNG, damaged) told apart from the ones it takes, and a
// damaged stream an error, not a crash. Skips without a GPU; fails on a GPU where a build with
// nvJPEG cannot load it (the bundle must carry libnvjpeg.so.13).
#include "server/gpu/jpeg_decoder.h"

#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "server/gpu/cuda_check.h"
#include "server/gpu/device_probe.h"
#include "server/gpu/test_photo.h"

namespace carpool::gpu {
namespace {

// Bounds from the measurement in docs/gpu.md ("GPU decode: fidelity", H200, 32 photo-like
// 500x375 q90 4:2:0 JPEGs). nvJPEG upsamples chroma by replication, as libjpeg-turbo does with
// TJFLAG_FASTUPSAMPLE: against that, hardware 0 and hybrid 3 levels at most. Against
// libjpeg-turbo's default (triangular) upsampling: mean 1.05-1.07, 99.9th percentile 21, and up
// to 80 levels on hard colour edges.
constexpr int kMaxDiffFastUpsampling = 4;
constexpr double kMeanDiffDefault = 1.25;
constexpr double kP999DiffDefault = 24;


std::vector<uint8_t> Encode(const std::vector<uint8_t>& rgb, int w, int h, int flags = 0) {
  tjhandle tj = tjInitCompress();
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(tj, rgb.data(), w, 0, h, TJPF_RGB, &jpeg, &size, TJSAMP_420, 90,
                        flags | TJFLAG_ACCURATEDCT),
            0);
  std::vector<uint8_t> out(jpeg, jpeg + size);
  tjFree(jpeg);
  tjDestroy(tj);
  return out;
}

std::vector<uint8_t> DecodeOnCpu(const std::vector<uint8_t>& jpeg, int w, int h, int flags = 0) {
  tjhandle tj = tjInitDecompress();
  std::vector<uint8_t> rgb(size_t(w) * h * 3);
  EXPECT_EQ(tjDecompress2(tj, jpeg.data(), jpeg.size(), rgb.data(), w, 0, h, TJPF_RGB,
                          flags | TJFLAG_ACCURATEDCT),
            0);
  tjDestroy(tj);
  return rgb;
}

// Absolute differences of every channel value of a against b: the largest, the mean, the 99.9th
// percentile and the share above 8 levels.
struct Differences {
  int max = 0;
  double mean = 0, p999 = 0, above8 = 0;
};
Differences Compare(const std::vector<std::vector<uint8_t>>& a,
                    const std::vector<std::vector<uint8_t>>& b) {
  std::vector<uint64_t> histogram(256, 0);
  uint64_t count = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t k = 0; k < a[i].size(); ++k) ++histogram[std::abs(int(a[i][k]) - int(b[i][k]))];
    count += a[i].size();
  }
  Differences d;
  uint64_t seen = 0, above = 0;
  double sum = 0;
  for (int v = 0; v < 256; ++v) {
    if (histogram[v] > 0) d.max = v;
    sum += double(v) * double(histogram[v]);
    if (seen < count * 999 / 1000 && seen + histogram[v] >= count * 999 / 1000) d.p999 = v;
    seen += histogram[v];
    if (v > 8) above += histogram[v];
  }
  d.mean = sum / double(count);
  d.above8 = double(above) / double(count);
  return d;
}

class JpegDecoderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: skipping GPU decode tests";
    Result<std::unique_ptr<JpegDecoder>> d = JpegDecoder::Create(64);
#ifndef CARPOOL_HAVE_NVJPEG
    ASSERT_EQ(d.status().code(), StatusCode::kUnavailable);
    GTEST_SKIP() << "built without nvJPEG: " << d.status().message();
#endif
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    decoder_ = std::move(*d);
    Result<CudaStream> s = CudaStream::Create();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    stream_ = std::move(*s);
    std::printf("nvJPEG backend: %s\n", JpegBackendName(decoder_->backend()));
  }

  // Decodes `jpegs` (all w x h) on the GPU and returns their RGB bytes, back on the host.
  Result<std::vector<std::vector<uint8_t>>> DecodeOnGpu(const std::vector<std::vector<uint8_t>>& jpegs,
                                                        int w, int h) {
    return DecodeOnGpu(*decoder_, jpegs, w, h);
  }
  Result<std::vector<std::vector<uint8_t>>> DecodeOnGpu(JpegDecoder& decoder,
                                                        const std::vector<std::vector<uint8_t>>& jpegs,
                                                        int w, int h) {
    const size_t bytes = size_t(w) * h * 3;
    Result<DeviceBuffer> out = DeviceBuffer::Allocate(bytes * jpegs.size());
    if (!out.ok()) return out.status();
    std::vector<std::span<const uint8_t>> encoded;
    std::vector<uint8_t*> dst;
    std::vector<uint32_t> pitch;
    for (size_t i = 0; i < jpegs.size(); ++i) {
      encoded.emplace_back(jpegs[i]);
      dst.push_back(static_cast<uint8_t*>(out->data()) + i * bytes);
      pitch.push_back(static_cast<uint32_t>(w * 3));
    }
    if (Status s = decoder.DecodeBatch(encoded, dst, pitch, stream_.get()); !s.ok()) return s;
    if (Status s = stream_.Synchronize(); !s.ok()) return s;
    std::vector<std::vector<uint8_t>> host(jpegs.size(), std::vector<uint8_t>(bytes));
    for (size_t i = 0; i < jpegs.size(); ++i) {
      Status s = CudaCheck(cudaMemcpy(host[i].data(), dst[i], bytes, cudaMemcpyDeviceToHost),
                           "cudaMemcpy");
      if (!s.ok()) return s;
    }
    return host;
  }

  std::unique_ptr<JpegDecoder> decoder_;
  CudaStream stream_;
};

TEST_F(JpegDecoderTest, PixelsMatchLibjpegTurboWithinTheDocumentedTolerance) {
  const int w = 500, h = 375;
  std::vector<std::vector<uint8_t>> jpegs;
  for (uint32_t i = 0; i < 32; ++i) jpegs.push_back(Encode(Photo(w, h, i), w, h));
  for (const auto& j : jpegs) {
    const JpegFacts f = decoder_->Inspect(j);
    ASSERT_TRUE(f.supported) << f.why;
    EXPECT_EQ(f.width, uint32_t(w));
    EXPECT_EQ(f.height, uint32_t(h));
    EXPECT_EQ(f.components, 3u);
  }
  std::vector<std::vector<uint8_t>> fancy, fast;  // libjpeg-turbo's default, and nearest chroma
  for (const auto& j : jpegs) {
    fancy.push_back(DecodeOnCpu(j, w, h));
    fast.push_back(DecodeOnCpu(j, w, h, TJFLAG_FASTUPSAMPLE));
  }
  Result<std::unique_ptr<JpegDecoder>> hybrid = JpegDecoder::Create(64, JpegBackend::kGpuHybrid);
  ASSERT_TRUE(hybrid.ok()) << hybrid.status().ToString();
  for (JpegDecoder* decoder : {decoder_.get(), hybrid->get()}) {
    Result<std::vector<std::vector<uint8_t>>> gpu = DecodeOnGpu(*decoder, jpegs, w, h);
    ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
    for (const auto& [name, cpu] : {std::pair{"default upsampling", &fancy},
                                    std::pair{"fast upsampling", &fast}}) {
      const Differences d = Compare(*gpu, *cpu);
      std::printf("GPU (%s) against libjpeg-turbo (%s), %zu images 500x375 q90 4:2:0: max abs "
                  "diff %d, p99.9 %.0f, mean %.4f, share > 8: %.5f\n",
                  JpegBackendName(decoder->backend()), name, jpegs.size(), d.max, d.p999, d.mean,
                  d.above8);
    }
    const char* backend = JpegBackendName(decoder->backend());
    EXPECT_LE(Compare(*gpu, fast).max, kMaxDiffFastUpsampling) << backend;
    const Differences d = Compare(*gpu, fancy);
    EXPECT_LE(d.mean, kMeanDiffDefault) << backend;
    EXPECT_LE(d.p999, kP999DiffDefault) << backend;
  }
}

// The bench's tuning variants (docs/benchmarks.md, issue 23): memory pools and a pre-allocation
// change no pixel, and the planar and NV12 outputs carry the same luma.
TEST_F(JpegDecoderTest, TuningChangesNoPixelAndTheYuvOutputsAgreeOnLuma) {
  const int w = 200, h = 150;
  std::vector<std::vector<uint8_t>> jpegs;
  for (uint32_t i = 0; i < 4; ++i) jpegs.push_back(Encode(Photo(w, h, 20 + i), w, h));
  JpegDecoderOptions tuned;
  tuned.prefer = decoder_->backend();
  tuned.memory_pools = true;
  tuned.preallocate_width = tuned.preallocate_height = 1;
  Result<std::unique_ptr<JpegDecoder>> d = JpegDecoder::Create(8, tuned);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  Result<std::vector<std::vector<uint8_t>>> plain = DecodeOnGpu(jpegs, w, h);
  Result<std::vector<std::vector<uint8_t>>> pooled = DecodeOnGpu(**d, jpegs, w, h);
  ASSERT_TRUE(plain.ok() && pooled.ok());
  EXPECT_EQ(*plain, *pooled);
  // The YUV outputs were only measured on the JPEG engines (the bench's variants): whether the
  // hybrid batched path takes NV12 is not known, so a GPU without engines stops here.
  if ((*d)->backend() != JpegBackend::kHardware) {
    GTEST_SKIP() << "no JPEG engines: the YUV and NV12 outputs are checked on the hardware backend";
  }
  // Luma of each image in planar YUV and in NV12, from the tuned decoder after its RGB batch.
  const size_t plane = size_t(w) * h;
  Result<DeviceBuffer> out = DeviceBuffer::Allocate(plane * 3 * jpegs.size() * 2);
  ASSERT_TRUE(out.ok());
  std::vector<std::span<const uint8_t>> encoded(jpegs.begin(), jpegs.end());
  std::vector<std::vector<uint8_t>> luma[2];
  for (int k = 0; k < 2; ++k) {
    std::vector<JpegPlanes> planes(jpegs.size());
    for (size_t i = 0; i < jpegs.size(); ++i) {
      uint8_t* base = static_cast<uint8_t*>(out->data()) + (k * jpegs.size() + i) * plane * 3;
      planes[i].data[0] = base;
      planes[i].data[1] = base + plane;
      planes[i].data[2] = base + plane * 2;
      planes[i].pitch[0] = uint32_t(w);
      planes[i].pitch[1] = k == 0 ? uint32_t((w + 1) / 2) : uint32_t(w);
      planes[i].pitch[2] = uint32_t((w + 1) / 2);
    }
    const JpegOutput format = k == 0 ? JpegOutput::kYuvPlanar : JpegOutput::kNv12;
    ASSERT_TRUE((*d)->DecodePlanes(encoded, planes, format, stream_.get()).ok())
        << JpegOutputName(format);
    ASSERT_TRUE(stream_.Synchronize().ok());
    for (const JpegPlanes& p : planes) {
      std::vector<uint8_t> y(plane);
      ASSERT_TRUE(CudaCheck(cudaMemcpy(y.data(), p.data[0], plane, cudaMemcpyDeviceToHost),
                            "cudaMemcpy")
                      .ok());
      luma[k].push_back(std::move(y));
    }
  }
  EXPECT_EQ(luma[0], luma[1]);
  // Not a blank plane: the photo's luma spans much of the range.
  const auto [lo, hi] = std::minmax_element(luma[0][0].begin(), luma[0][0].end());
  EXPECT_GT(int(*hi) - int(*lo), 100);
}

// JPEGs read from device memory (JpegDecoderOptions::device_input, uploaded in runs): the same
// pixels as the plain hardware decoder, whether the JPEGs lie back to back in one buffer, a page
// apart, out of order, or one of them twice in the batch.
TEST_F(JpegDecoderTest, JpegsFromDeviceMemoryGiveTheSamePixels) {
  const int w = 200, h = 150;
  std::vector<std::vector<uint8_t>> jpegs;
  for (uint32_t i = 0; i < 5; ++i) jpegs.push_back(Encode(Photo(w, h, 40 + i), w, h));
  JpegDecoderOptions options;
  options.device_input = true;
  Result<std::unique_ptr<JpegDecoder>> d = JpegDecoder::Create(8, options);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  if (!(*d)->device_input()) {
    GTEST_SKIP() << "no NVJPEG_BACKEND_HARDWARE_DEVICE here (no JPEG engines, or an older nvJPEG)";
  }
  // One segment: JPEGs 0-2 back to back, JPEG 3 a page further, JPEG 4 two pages further.
  std::vector<uint8_t> segment;
  std::vector<size_t> at;
  for (size_t i = 0; i < jpegs.size(); ++i) {
    if (i >= 3) segment.resize(segment.size() + 4096 * (i - 2), 0);
    at.push_back(segment.size());
    segment.insert(segment.end(), jpegs[i].begin(), jpegs[i].end());
  }
  std::vector<std::vector<uint8_t>> order;  // the batch: out of order, JPEG 1 twice
  std::vector<std::span<const uint8_t>> views;
  for (size_t i : {4, 1, 0, 3, 1, 2}) {
    order.push_back(jpegs[i]);
    views.emplace_back(segment.data() + at[i], jpegs[i].size());
  }
  Result<std::vector<std::vector<uint8_t>>> plain = DecodeOnGpu(order, w, h);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  const size_t bytes = size_t(w) * h * 3;
  Result<DeviceBuffer> out = DeviceBuffer::Allocate(bytes * views.size());
  ASSERT_TRUE(out.ok());
  std::vector<uint8_t*> outs;
  std::vector<uint32_t> pitches(views.size(), uint32_t(w) * 3);
  for (size_t i = 0; i < views.size(); ++i)
    outs.push_back(static_cast<uint8_t*>(out->data()) + i * bytes);
  for (int round = 0; round < 2; ++round) {  // the second reuses the decoder's device copy
    ASSERT_TRUE((*d)->DecodeBatch(views, outs, pitches, stream_.get()).ok());
    ASSERT_TRUE(stream_.Synchronize().ok());
    for (size_t i = 0; i < views.size(); ++i) {
      std::vector<uint8_t> got(bytes);
      ASSERT_TRUE(
          CudaCheck(cudaMemcpy(got.data(), outs[i], bytes, cudaMemcpyDeviceToHost), "cudaMemcpy")
              .ok());
      EXPECT_EQ(got, (*plain)[i]) << "image " << i << ", round " << round;
    }
  }
}

TEST_F(JpegDecoderTest, StreamsItCannotTakeAreToldApartWithTheReason) {
  const int w = 96, h = 64;
  const std::vector<uint8_t> rgb = Photo(w, h, 7);
  const JpegFacts progressive = decoder_->Inspect(Encode(rgb, w, h, TJFLAG_PROGRESSIVE));
  EXPECT_FALSE(progressive.supported);
  EXPECT_NE(progressive.why.find("progressive"), std::string::npos) << progressive.why;
  const std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13};
  const JpegFacts not_jpeg = decoder_->Inspect(png);
  EXPECT_FALSE(not_jpeg.supported);
  EXPECT_NE(not_jpeg.why.find("not a JPEG"), std::string::npos) << not_jpeg.why;
  EXPECT_TRUE(decoder_->Inspect(Encode(rgb, w, h)).supported);
}

TEST_F(JpegDecoderTest, ADamagedStreamIsAnErrorNotACrash) {
  const int w = 256, h = 192;
  std::vector<uint8_t> jpeg = Encode(Photo(w, h, 3), w, h);
  jpeg.resize(jpeg.size() / 3);  // truncated mid-scan: the header still parses
  const JpegFacts f = decoder_->Inspect(jpeg);
  if (!f.supported) return;  // refused at the header: the CPU path reports it
  Result<std::vector<std::vector<uint8_t>>> out = DecodeOnGpu({jpeg}, w, h);
  // nvJPEG may decode a truncated scan as far as it goes (the rest grey) or refuse it; either way
  // the process lives on and the decoder still works for the next batch.
  Result<std::vector<std::vector<uint8_t>>> next = DecodeOnGpu({Encode(Photo(w, h, 4), w, h)}, w, h);
  EXPECT_TRUE(next.ok()) << next.status().ToString();
}

TEST_F(JpegDecoderTest, ABatchLargerThanTheDecoderIsRefusedNamingBoth) {
  std::vector<std::span<const uint8_t>> encoded(65);
  std::vector<uint8_t*> out(65, nullptr);
  std::vector<uint32_t> pitch(65, 0);
  const Status s = decoder_->DecodeBatch(encoded, out, pitch, stream_.get());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("65"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("64"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace carpool::gpu
