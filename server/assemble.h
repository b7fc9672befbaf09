// Batch assembly on the CPU: B prepared samples, each transformed with its own seed, written
// contiguously as [B, C, H, W] (nchw) or [B, H, W, C] (nhwc) into a batch slot. Labels and ids
// are the engine's. Stateless free functions: thread-safe; callers may assemble disjoint ranges
// of one batch on several threads with AssembleBatch on sub-spans and offset destinations.
#ifndef CARPOOL_SERVER_ASSEMBLE_H_
#define CARPOOL_SERVER_ASSEMBLE_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "carpool/status.h"
#include "server/prepare.h"
#include "server/transform.h"

namespace carpool {

// The shape of one image of a batch built from these samples: every sample must give the same
// TransformedShape (use a crop when prepared sizes vary). InvalidArgument names the first sample
// that differs, or that cannot be transformed; an empty batch is InvalidArgument too.
Result<ImageShape> BatchImageShape(const TransformSpec& spec,
                                   std::span<const PreparedView> samples);

// Writes samples[i] transformed with seeds[i] at images_dst + i * image bytes. Checks every shape
// and the destination size before writing anything.
// REQUIRES: seeds.size() == samples.size(); images_dst aligned for spec.dtype.
Result<ImageShape> AssembleBatch(const TransformSpec& spec, std::span<const PreparedView> samples,
                                 std::span<const uint64_t> seeds, void* images_dst,
                                 size_t dst_bytes);

}  // namespace carpool

#endif  // CARPOOL_SERVER_ASSEMBLE_H_
