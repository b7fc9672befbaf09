// The catalog: a SQLite database (<state_dir>/catalog.db, WAL mode, schema version in
// user_version) of samples with global 32-bit ids, and of named datasets, each a portable roaring
// bitmap of sample ids. The same source item (canonical path, record) always has the same id, in
// every dataset, which is what makes datasets overlap. Sample rows are never deleted, so ids stay
// stable across `rm` and re-registration.
//
// Thread-compatible: callers serialize access to one Catalog. Several processes may open the same
// catalog; a writer holds SQLite's write lock for the duration of one registration.
#ifndef CARPOOL_DATASETS_CATALOG_H_
#define CARPOOL_DATASETS_CATALOG_H_

#include <cstdint>
#include <filesystem>
#include <memory>
#include <roaring/roaring.hh>
#include <string>
#include <string_view>
#include <vector>

#include "carpool/status.h"
#include "datasets/source.h"

namespace carpool {

class SqliteDb;

// 2 added samples.byte_offset (tar members); a version-1 catalog is upgraded in place on open.
inline constexpr int kCatalogSchemaVersion = 2;

struct SampleRecord {
  uint32_t id = 0;
  std::string source;         // "file", "idx" or "tar"
  std::string path;           // canonical absolute path of the file (or of the IDX file or shard)
  int64_t record_index = -1;  // record of an IDX file; -1 for files
  uint64_t size = 0;          // bytes of the file or record, when registered
  int32_t label = -1;         // index into the registering dataset's classes; -1 unlabelled
  int64_t offset = -1;        // tar: where the member's data start in the shard `path`; else -1
  std::string member{};       // tar: the member's name in the shard; else empty
};

// Many sample records in columns: one string per distinct file (IDX file, tar shard, or a plain
// file's folder) and one arena for names, not three strings per sample. A 1.28M-sample dataset
// loads in a few arrays (about 40 bytes and a name per sample). Record(i) gives the row form.
struct SampleRecords {
  enum class Kind : uint8_t { kFile, kIdx, kTar };
  struct Row {
    uint32_t id = 0;
    uint32_t file = 0;                      // index into files
    uint32_t name_begin = 0, name_end = 0;  // in names: a plain file's name or a tar member
    Kind kind = Kind::kFile;
    int32_t label = -1;
    int64_t position = -1;  // idx: the record; tar: the member's data offset in the shard
    uint64_t size = 0;
  };
  std::vector<std::string> files;  // idx: the file; tar: the shard; file: its folder
  std::vector<Row> rows;           // ascending id
  std::string names;

  size_t size() const { return rows.size(); }
  // The path a reader opens: the IDX file, the shard, or folder/name. O(path length).
  std::string Path(size_t i) const;
  SampleRecord Record(size_t i) const;  // O(path length)
};

struct DatasetInfo {
  std::string name;
  Roaring ids;
  std::string prepare_spec;
  std::vector<std::string> classes;
  std::string source_desc;
  int64_t created_unix = 0;
};

// What a new dataset is called and how it is described; its ids come separately.
struct DatasetMeta {
  std::string name;
  std::string prepare_spec;
  std::vector<std::string> classes;
  std::string source_desc;
};

struct RegisterReport {
  DatasetInfo info;
  uint64_t new_samples = 0;      // ids created by this registration
  uint64_t duplicates = 0;       // entries naming a sample already listed earlier in the source
  uint64_t label_conflicts = 0;  // known samples whose stored label differs (the stored one stays)
};

// Letters, digits, '.', '_' and '-', at most 128 characters, not starting with '-' or '.'.
Status ValidateDatasetName(std::string_view name);

class Catalog {
 public:
  // Opens or creates <state_dir>/catalog.db. Fails on a schema newer than this build.
  static Result<std::unique_ptr<Catalog>> Open(const std::filesystem::path& state_dir);
  ~Catalog();
  Catalog(const Catalog&) = delete;
  Catalog& operator=(const Catalog&) = delete;

  // NotFound names the dataset and lists the known ones.
  Result<DatasetInfo> GetDataset(std::string_view name) const;
  Result<std::vector<std::string>> ListDatasets() const;  // sorted
  // The records of `ids` in ascending id order. NotFound if an id is not in the catalog.
  // O(|ids|) rows read; GetSampleRecords keeps them in columns (for millions), GetSamples as rows.
  Result<SampleRecords> GetSampleRecords(const Roaring& ids) const;
  Result<std::vector<SampleRecord>> GetSamples(const Roaring& ids) const;
  Result<uint64_t> SampleCount() const;

  // OK when `name` is valid and unused, or used and `replace` is set; AlreadyExists otherwise.
  Status CheckNewName(std::string_view name, bool replace) const;

  // Inserts the scanned samples (reusing the ids of known ones) and the dataset, in one
  // transaction: on any failure, or if the process dies, the catalog is unchanged. New ids are
  // given in (directory, name, record) order. Fails with InvalidArgument if no samples remain, or
  // if meta.prepare_spec does not fit them (CheckPrepareFits, prepare_fit.h).
  Result<RegisterReport> Register(const DatasetMeta& meta, const SourceScan& scan, bool replace,
                                  const ProgressFn& progress = nullptr);

  // Stores a dataset of existing sample ids (a derived dataset), in one transaction.
  // InvalidArgument if meta.prepare_spec does not fit those samples (CheckPrepareFits).
  Result<DatasetInfo> AddDataset(const DatasetMeta& meta, const Roaring& ids, bool replace);

  // Removes the dataset (its samples keep their ids). NotFound if absent.
  Status RemoveDataset(std::string_view name);

 private:
  explicit Catalog(std::unique_ptr<SqliteDb> db);
  Status InsertDataset(const DatasetMeta& meta, const Roaring& ids, bool replace, int64_t now);

  std::unique_ptr<SqliteDb> db_;
};

}  // namespace carpool

#endif  // CARPOOL_DATASETS_CATALOG_H_
