#include "tests/e2e_reference.h"

#include "datasets/prepare_spec.h"
#include "datasets/sample_reader.h"
#include "server/prepare.h"
#include "server/transform.h"

namespace carpool::e2e {

Result<std::vector<uint8_t>> ReferenceImage(const std::string& file,
                                            const std::string& prepare_spec,
                                            const std::string& transform, uint64_t seed,
                                            uint32_t epoch, uint32_t sample_id) {
  Result<PrepareSpec> spec = ParsePrepareSpec(prepare_spec);
  if (!spec.ok()) return spec.status();
  Result<TransformSpec> t = ParseTransformSpec(transform);
  if (!t.ok()) return t.status();
  Result<std::vector<uint8_t>> bytes = ReadWholeFile(file);
  if (!bytes.ok()) return bytes.status();
  // A decode=gpu spec's samples the server may keep encoded: their pixels are the CPU's
  // decode=gpu pixels (the JPEG engines give the same bytes).
  Result<PreparedImage> prepared =
      spec->gpu_decode ? PrepareGpuPixelsOnCpu(*spec, *bytes) : PrepareSample(*spec, *bytes);
  if (!prepared.ok()) return prepared.status();
  Result<ImageShape> shape = TransformedShape(*t, prepared->shape);
  if (!shape.ok()) return shape.status();
  std::vector<uint8_t> out(shape->bytes());
  Status s = ApplyTransform(*t, prepared->view(), SampleSeed(seed, epoch, sample_id), out.data());
  if (!s.ok()) return s;
  return out;
}

}  // namespace carpool::e2e
