// libcarpool_decode_probe.so: one nvJPEG variant row (jpeg_bench_rows.h) run inside the calling
// process, for `bench.gpu.train_beside --decode-in-process`: a decode in the training process's
// own CUDA context (no time slicing between two processes' contexts), against the same decode
// from another process. Bench code: not part of the server or the client.
#include <cstdio>
#include <string>
#include <vector>

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
