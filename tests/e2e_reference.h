// The reference for the e2e image test: one sample prepared and transformed in-process, as the
// server should. Kept apart from the test so that server/transform.h and the client's public
// header (both define carpool::DType) never meet in one translation unit.
#ifndef CARPOOL_TESTS_E2E_REFERENCE_H_
#define CARPOOL_TESTS_E2E_REFERENCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "carpool/status.h"

namespace carpool::e2e {

// PrepareSample(prepare_spec, file) (PrepareGpuPixelsOnCpu for a decode=gpu spec) then
// ApplyTransform(transform, SampleSeed(seed, epoch, id)).
Result<std::vector<uint8_t>> ReferenceImage(const std::string& file,
                                            const std::string& prepare_spec,
                                            const std::string& transform, uint64_t seed,
                                            uint32_t epoch, uint32_t sample_id);

}  // namespace carpool::e2e

#endif  // CARPOOL_TESTS_E2E_REFERENCE_H_
