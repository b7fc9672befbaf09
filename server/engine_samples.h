// What the engine knows about each sample it serves: its catalog record, the prepare spec of the
// dataset it came through and, for raw records, the shape that the bytes alone cannot tell.
// The table is keyed by prepared key (server/prepared_keys.h): a catalog id under one prepare spec.
#ifndef CARPOOL_SERVER_ENGINE_SAMPLES_H_
#define CARPOOL_SERVER_ENGINE_SAMPLES_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "carpool/status.h"
#include "datasets/catalog.h"
#include "datasets/prepare_spec.h"
#include "datasets/sample_reader.h"
#include "server/prepare.h"

namespace carpool {

// A dataset's samples as one load brought them: their records in columns, the dataset's prepare
// spec and, per sample, whether the table has dropped it. Shared by the table's entries.
struct SampleBlock {
  SampleRecords records;
  PrepareSpec spec;
  uint32_t key_base = 0;  // of the spec (PreparedKeys): a row's key is key_base + its catalog id
  std::vector<PreparedShape> raw_shapes;  // raw specs only: by file (IDX: rows x cols x channels)
  // Set when the table drops a row's sample (its last job left): a queued preparation skips it.
  std::unique_ptr<std::atomic<bool>[]> released;
};

// What a preparation needs of one sample, built from its block on demand.
struct SampleSource {
  SampleRecord record;
  PrepareSpec spec;
  PreparedShape raw_shape;  // raw specs only
  std::shared_ptr<const SampleBlock> block;
  uint32_t row = 0;

  static SampleSource Of(std::shared_ptr<const SampleBlock> block, uint32_t row);  // O(path)
  bool released() const { return block->released[row].load(std::memory_order_relaxed); }
};

// A dataset as loaded for a new job, before its samples enter the table.
struct DatasetSamples {
  DatasetInfo info;
  std::shared_ptr<SampleBlock> block;
  // The prepared shape of every sample when the spec fixes it (raw, crop), else of the first one.
  PreparedShape prepared_shape;

  size_t size() const { return block->records.size(); }
  const PrepareSpec& spec() const { return block->spec; }
};

// Reads the dataset, its records and (raw) the IDX headers from the catalog and the files; reads
// the first sample when the prepared shape depends on the image. Errors name the dataset and say
// what to do. Does I/O: call without the engine's lock.
Result<DatasetSamples> LoadDatasetSamples(const Catalog& catalog, std::string_view name,
                                          SampleReader& reader);

// What SampleTable::Release dropped: samples no job uses any more, IDX files none of them reads.
struct ReleasedSamples {
  std::vector<uint32_t> samples;
  std::vector<std::string> idx_paths;
};

// The samples of the jobs present, each counted once per job using it, so that a dataset's
// per-sample state goes when its last job leaves (a server runs for days of sweeps).
// Thread-compatible: the engine holds its lock around every call.
class SampleTable {
 public:
  // Checks that Add would succeed: FailedPrecondition when a known key has another prepare spec,
  // which PreparedKeys rules out (a bookkeeping bug). O(samples).
  Status Check(const DatasetSamples& dataset) const { return Check(dataset, 0, dataset.size()); }
  Status Check(const DatasetSamples& dataset, size_t begin, size_t end) const;
  // Check, then counts one more user of every sample, adding those not yet known. O(samples).
  Status Add(const DatasetSamples& dataset) { return Add(dataset, 0, dataset.size()); }
  // The same for samples [begin, end) of the dataset, so that a caller can add a large dataset
  // in parts, letting others take its lock in between.
  Status Add(const DatasetSamples& dataset, size_t begin, size_t end);
  // Room for `more` samples beyond those held, so that adding them in parts rehashes once, now,
  // and not inside a later part's hold of the caller's lock. O(samples held + more).
  void Reserve(size_t more) { map_.reserve(map_.size() + more); }
  // One user fewer of each of `keys` (what one Add added); drops the samples left unused and
  // returns them. O(|keys|).
  ReleasedSamples Release(std::span<const uint32_t> keys);
  ReleasedSamples Release(const Roaring& keys);  // the same; O(|keys|) more for the copy
  // The keys of the dataset's rows [0, end): what Add(dataset, 0, end) added. O(end).
  static Roaring KeysOf(const DatasetSamples& dataset, size_t end);
  // nullptr for an unknown key. Builds the source from its block: O(path length), one allocation.
  std::shared_ptr<const SampleSource> Find(uint32_t id) const;
  bool Contains(uint32_t id) const { return map_.count(id) > 0; }
  // The sample's label (-1 unlabelled or unknown), without building its source. O(1).
  int32_t Label(uint32_t id) const;
  size_t size() const { return map_.size(); }
  size_t idx_files() const { return idx_users_.size(); }
  bool ReadsIdx(const std::string& path) const { return idx_users_.count(path) > 0; }

 private:
  struct Entry {
    std::shared_ptr<const SampleBlock> block;
    uint32_t row = 0;
    uint32_t users = 0;
  };
  std::unordered_map<uint32_t, Entry> map_;
  std::unordered_map<std::string, size_t> idx_users_;  // IDX path -> samples in map_ read from it
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_ENGINE_SAMPLES_H_
