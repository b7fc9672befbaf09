// Reads the raw bytes of one sample: the whole file for a "file" sample, the record's bytes for an
// "idx" sample, the member's bytes (one pread) for a "tar" sample. Thread-safe: SampleReader may be shared by any number of preparation workers.
#ifndef CARPOOL_DATASETS_SAMPLE_READER_H_
#define CARPOOL_DATASETS_SAMPLE_READER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "carpool/status.h"
#include "datasets/catalog.h"

namespace carpool {

class SampleReader {
 public:
  SampleReader() = default;
  SampleReader(const SampleReader&) = delete;
  SampleReader& operator=(const SampleReader&) = delete;

  // NotFound/IOError for a missing or unreadable file, Corruption for a bad IDX file or a record
  // index past its end. An IDX file is read (and gunzipped) once, on first use, and kept in
  // memory until Forget.
  Result<std::vector<uint8_t>> Read(const SampleRecord& sample);
  // Frees an IDX file's bytes once no sample of it is served (reads in flight keep their copy);
  // a later Read loads it again. O(log files).
  void Forget(const std::string& idx_path);
  size_t idx_files_loaded() const;

 private:
  struct IdxFile;
  Result<std::shared_ptr<const IdxFile>> OpenIdx(const std::string& path);

  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<IdxFile>> idx_files_ GUARDED_BY(mu_);
};

// Reads through a process-wide SampleReader.
Result<std::vector<uint8_t>> ReadSample(const SampleRecord& sample);

// The whole content of a regular file.
Result<std::vector<uint8_t>> ReadWholeFile(const std::string& path);

// Bytes [offset, offset + size) of a file, read with pread (one call unless the kernel returns
// fewer bytes). Corruption when the file ends first or size is over 1 GiB.
Result<std::vector<uint8_t>> ReadFileRange(const std::string& path, uint64_t offset,
                                           uint64_t size);

}  // namespace carpool

#endif  // CARPOOL_DATASETS_SAMPLE_READER_H_
