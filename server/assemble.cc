#include "server/assemble.h"

#include <fmt/core.h>

namespace carpool {

Result<ImageShape> BatchImageShape(const TransformSpec& spec,
                                   std::span<const PreparedView> samples) {
  if (samples.empty()) return Status::InvalidArgument("batch has no samples");
  Result<ImageShape> first = TransformedShape(spec, samples[0].shape);
  if (!first.ok()) return first.status();
  for (size_t i = 0; i < samples.size(); ++i) {
    const PreparedShape& in = samples[i].shape;
    if (samples[i].data == nullptr) {
      return Status::InvalidArgument(fmt::format("batch sample {} has no data", i));
    }
    Result<ImageShape> shape = TransformedShape(spec, in);
    if (!shape.ok()) return shape.status();
    if (*shape != *first) {
      return Status::InvalidArgument(fmt::format(
          "batch sample {} ({}x{}x{}) transforms to {}x{}x{}, sample 0 to {}x{}x{}; every image "
          "of a batch needs one shape: add a crop to the transform \"{}\" or a crop to the "
          "dataset's prepare spec",
          i, in.height, in.width, in.channels, shape->channels, shape->height, shape->width,
          first->channels, first->height, first->width, spec.ToString()));
    }
  }
  return first;
}

Result<ImageShape> AssembleBatch(const TransformSpec& spec, std::span<const PreparedView> samples,
                                 std::span<const uint64_t> seeds, void* images_dst,
                                 size_t dst_bytes) {
  if (seeds.size() != samples.size()) {
    return Status::InvalidArgument(
        fmt::format("batch has {} samples but {} seeds", samples.size(), seeds.size()));
  }
  Result<ImageShape> shape = BatchImageShape(spec, samples);
  if (!shape.ok()) return shape.status();
  const size_t image_bytes = shape->bytes();
  if (dst_bytes < image_bytes * samples.size()) {
    return Status::InvalidArgument(
        fmt::format("batch slot holds {} bytes; {} images of {} bytes need {}", dst_bytes,
                    samples.size(), image_bytes, image_bytes * samples.size()));
  }
  auto* out = static_cast<std::byte*>(images_dst);
  for (size_t i = 0; i < samples.size(); ++i) {
    if (Status s = ApplyTransform(spec, samples[i], seeds[i], out + i * image_bytes); !s.ok()) {
      return s;
    }
  }
  return shape;
}

}  // namespace carpool
