// Which prepare specs a dataset's samples take: "raw" keeps IDX records as they are, every other
// spec decodes images (files of folders and lists, tar members). Checked when a dataset is
// registered, so that a spec that does not fit fails there, naming the fix, and not in a job.
// Free functions, thread-safe.
#ifndef CARPOOL_DATASETS_PREPARE_FIT_H_
#define CARPOOL_DATASETS_PREPARE_FIT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "carpool/status.h"
#include "datasets/catalog.h"
#include "datasets/source.h"

namespace carpool {

// What a prepare spec needs to know of a dataset's samples.
struct SampleKinds {
  uint64_t idx_records = 0;
  uint64_t images = 0;                 // image files and tar members
  std::vector<std::string> idx_files;  // distinct, in order of first appearance
  std::string first_image;             // one image, as errors name it
};

SampleKinds KindsOf(const SourceScan& scan);
SampleKinds KindsOf(const SampleRecords& records);

// OK when `spec_text` parses and every sample of `dataset` can be prepared with it; a raw spec
// reads each IDX file's header for its record layout (RawRecordLayout). Otherwise the parse error,
// or InvalidArgument naming the spec, the samples it does not fit and the spec to use.
Status CheckPrepareFits(std::string_view dataset, std::string_view spec_text,
                        const SampleKinds& kinds);

}  // namespace carpool

#endif  // CARPOOL_DATASETS_PREPARE_FIT_H_
