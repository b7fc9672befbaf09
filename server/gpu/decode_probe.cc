// libcarpool_decode_probe.so: carpool's GPU decode run inside the calling process, in its CUDA
// context (no time slicing between two processes' contexts): one nvJPEG variant row
// (jpeg_bench_rows.h) for `bench.gpu.train_beside --decode-in-process`, and the BatchDecoder
// for bench.gpu's `inproc` side. Bench code: not part of the server or the client.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "server/gpu/batch_decoder.h"
#include "server/gpu/jpeg_bench_rows.h"

// Decodes `images` synthetic 500x375 JPEGs in batches of `batch` for `seconds` in `variant`
// ("hardware", "gpu-hybrid+pools", ...); writes the row, or the error, into out[0, out_len).
// Returns 0 on success. Blocks for about `seconds` plus the JPEGs' making (~5 ms each).
extern "C" int carpool_decode_probe(const char* variant, double seconds, int images, int batch,
                                    char* out, int out_len) {
  using namespace carpool::gpu;
  auto answer = [&](const std::string& text, int rc) {
    std::snprintf(out, static_cast<size_t>(out_len), "%s", text.c_str());
    return rc;
  };
  if (images < batch || batch < 1) return answer("images must be at least batch >= 1", 2);
  carpool::Result<Variant> v = ParseVariant(variant);
  if (!v.ok()) return answer(v.status().ToString(), 2);
  std::vector<std::vector<uint8_t>> jpegs;
  for (int i = 0; i < images; ++i) jpegs.push_back(NoisyPhotoJpeg(500, 375, uint32_t(i)));
  carpool::Result<std::string> row = VariantRow(jpegs, 500, 375, size_t(batch), seconds, *v);
  return row.ok() ? answer(*row, 0) : answer(row.status().ToString(), 1);
}

// A decoder kept across calls, for bench.gpu's `inproc` side: carpool's GPU decode path
// (BatchDecoder: nvJPEG, the exact resize and crop of `spec`, the CPU for what nvJPEG refuses)
// on a stream of its own, in the calling process's CUDA context.
struct ProbeDecoder {
  carpool::PrepareSpec spec;
  std::unique_ptr<carpool::gpu::BatchDecoder> decoder;
  carpool::gpu::CudaStream stream;
};

// Opens a decoder for batches of up to `max_batch` JPEGs prepared by `spec` (a decode=gpu spec,
// e.g. "resize=256,crop=256,decode=gpu"). Null with the reason in err on failure.
extern "C" void* carpool_decode_probe_open(const char* spec, int max_batch, char* err,
                                           int err_len) {
  using namespace carpool;
  auto fail = [&](const std::string& why) -> void* {
    std::snprintf(err, static_cast<size_t>(err_len), "%s", why.c_str());
    return nullptr;
  };
  Result<PrepareSpec> parsed = ParsePrepareSpec(spec);
  if (!parsed.ok()) return fail(parsed.status().ToString());
  if (max_batch < 1) return fail("max_batch must be at least 1");
  Result<std::unique_ptr<gpu::JpegDecoder>> d = gpu::JpegDecoder::Create(uint32_t(max_batch));
  if (!d.ok()) return fail(d.status().ToString());
  Result<gpu::CudaStream> stream = gpu::CudaStream::Create();
  if (!stream.ok()) return fail(stream.status().ToString());
  auto* probe = new ProbeDecoder{*parsed, nullptr, std::move(*stream)};
  probe->decoder = std::make_unique<gpu::BatchDecoder>(std::move(*d), uint64_t{512} << 20);
  return probe;
}

// Decodes n JPEGs (host bytes) into dst (device), sample i at dst + i * height * width * 3, each
// prepared to height x width x 3, and waits for them. Returns how many could not be decoded (their
// bytes are left as they were), or -1 with the reason in err.
extern "C" int carpool_decode_probe_decode(void* handle, int n, const uint8_t* const* data,
                                           const uint64_t* lengths, uint8_t* dst, int height,
                                           int width, char* err, int err_len) {
  using namespace carpool;
  auto* probe = static_cast<ProbeDecoder*>(handle);
  const PreparedShape shape{height, width, 3};
  std::vector<gpu::DecodeTarget> targets;
  targets.reserve(size_t(n));
  for (int i = 0; i < n; ++i) {
    targets.push_back({size_t(i), {data[i], size_t(lengths[i])}, shape,
                       dst + size_t(i) * shape.bytes()});
  }
  std::vector<std::pair<size_t, Status>> failed;
  gpu::DecodeCounts counts;
  Status s = probe->decoder->Decode(probe->spec, targets, probe->stream.get(), &failed, &counts);
  if (s.ok()) s = probe->stream.Synchronize();
  if (!s.ok()) {
    std::snprintf(err, static_cast<size_t>(err_len), "%s", s.ToString().c_str());
    return -1;
  }
  return static_cast<int>(failed.size());
}

extern "C" void carpool_decode_probe_close(void* handle) {
  delete static_cast<ProbeDecoder*>(handle);
}
