#include "datasets/catalog.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <unordered_map>

#include "datasets/catalog_codec.h"
#include "datasets/prepare_fit.h"
#include "datasets/sqlite_db.h"

namespace carpool {

namespace {

constexpr std::string_view kSchema = R"sql(
CREATE TABLE dirs(id INTEGER PRIMARY KEY, path TEXT NOT NULL UNIQUE);
CREATE TABLE samples(
  id INTEGER PRIMARY KEY,
  dir INTEGER NOT NULL REFERENCES dirs(id),
  name TEXT NOT NULL,
  record INTEGER NOT NULL,
  size INTEGER NOT NULL,
  label INTEGER NOT NULL,
  byte_offset INTEGER NOT NULL DEFAULT -1,
  UNIQUE(dir, name, record));
CREATE TABLE datasets(
  name TEXT PRIMARY KEY,
  ids BLOB NOT NULL,
  count INTEGER NOT NULL,
  prepare TEXT NOT NULL,
  classes TEXT NOT NULL,
  source TEXT NOT NULL,
  created INTEGER NOT NULL);
)sql";

// Version 1 to 2: tar members keep their data offset; other samples have -1.
constexpr std::string_view kUpgradeFrom1 =
    "ALTER TABLE samples ADD COLUMN byte_offset INTEGER NOT NULL DEFAULT -1";

// Point lookups beat a range scan when the ids are this sparse in their range.
constexpr uint64_t kRangeScanDensity = 8;

// Runs `sql` and sets the current schema version, in one transaction, if the catalog is still at
// version `from` once the write lock is held: another process may have migrated it meanwhile.
// Returns the version after.
Result<int64_t> Migrate(SqliteDb& d, int64_t from, std::string_view sql) {
  Result<SqliteTransaction> txn = SqliteTransaction::Begin(&d);
  if (!txn.ok()) return txn.status();
  Result<int64_t> version = d.QueryInt("PRAGMA user_version");
  if (!version.ok()) return version.status();
  if (*version == from) {
    Status s = d.Exec(sql);
    if (s.ok()) s = d.Exec(fmt::format("PRAGMA user_version={}", kCatalogSchemaVersion));
    if (!s.ok()) return s;
    version = kCatalogSchemaVersion;
  }
  Status s = txn->Commit();
  if (!s.ok()) return s;
  return version;
}

}  // namespace

Status ValidateDatasetName(std::string_view name) {
  bool ok = !name.empty() && name.size() <= 128 && name.front() != '-' && name.front() != '.';
  for (char c : name) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '-');
  }
  if (ok) return Status::OK();
  return Status::InvalidArgument(fmt::format(
      "dataset name \"{}\" is invalid; use 1-128 letters, digits, '.', '_' or '-', not starting "
      "with '-' or '.'",
      name));
}

Catalog::Catalog(std::unique_ptr<SqliteDb> db) : db_(std::move(db)) {}
Catalog::~Catalog() = default;

Result<std::unique_ptr<Catalog>> Catalog::Open(const std::filesystem::path& state_dir) {
  Result<std::unique_ptr<SqliteDb>> db = SqliteDb::Open(state_dir / "catalog.db");
  if (!db.ok()) return db.status();
  SqliteDb& d = **db;
  for (const char* pragma : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL",
                             "PRAGMA foreign_keys=ON", "PRAGMA temp_store=MEMORY"}) {
    Status s = d.Exec(pragma);
    if (!s.ok()) return s;
  }
  Result<int64_t> version = d.QueryInt("PRAGMA user_version");
  if (!version.ok()) return version.status();
  for (auto [from, sql] : {std::pair{int64_t{0}, kSchema}, std::pair{int64_t{1}, kUpgradeFrom1}}) {
    if (*version != from) continue;
    version = Migrate(d, from, sql);
    if (!version.ok()) return version.status();
  }
  if (*version != kCatalogSchemaVersion) {
    return Status::FailedPrecondition(fmt::format(
        "catalog \"{}\" has schema version {}, this carpool reads version {}; use a matching "
        "carpool or a new --state-dir",
        d.file().string(), *version, kCatalogSchemaVersion));
  }
  return std::unique_ptr<Catalog>(new Catalog(std::move(*db)));
}

Result<std::vector<std::string>> Catalog::ListDatasets() const {
  Result<SqliteStmt> stmt = db_->Prepare("SELECT name FROM datasets ORDER BY name");
  if (!stmt.ok()) return stmt.status();
  std::vector<std::string> names;
  while (true) {
    Result<bool> row = stmt->Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    names.emplace_back(stmt->ColumnText(0));
  }
  return names;
}

Result<DatasetInfo> Catalog::GetDataset(std::string_view name) const {
  Result<SqliteStmt> stmt = db_->Prepare(
      "SELECT name, ids, count, prepare, classes, source, created FROM datasets WHERE name=?");
  if (!stmt.ok()) return stmt.status();
  stmt->BindText(1, name);
  Result<bool> row = stmt->Step();
  if (!row.ok()) return row.status();
  if (!*row) {
    Result<std::vector<std::string>> known = ListDatasets();
    std::string list = known.ok() && !known->empty() ? fmt::format("{}", fmt::join(*known, ", "))
                                                     : std::string("none");
    return Status::NotFound(
        fmt::format("dataset \"{}\" not found (known: {}); register it with 'carpool dataset add'",
                    name, list));
  }
  DatasetInfo info;
  info.name = std::string(stmt->ColumnText(0));
  Result<Roaring> ids =
      DecodeIds(stmt->ColumnBlob(1), static_cast<uint64_t>(stmt->ColumnInt(2)), info.name);
  if (!ids.ok()) return ids.status();
  info.ids = std::move(*ids);
  info.prepare_spec = std::string(stmt->ColumnText(3));
  info.classes = DecodeClasses(stmt->ColumnText(4));
  info.source_desc = std::string(stmt->ColumnText(5));
  info.created_unix = stmt->ColumnInt(6);
  return info;
}

Result<uint64_t> Catalog::SampleCount() const {
  Result<int64_t> n = db_->QueryInt("SELECT count(*) FROM samples");
  if (!n.ok()) return n.status();
  return static_cast<uint64_t>(*n);
}

std::string SampleRecords::Path(size_t i) const {
  const Row& r = rows[i];
  const std::string& file = files[r.file];
  if (r.kind != Kind::kFile) return file;
  const std::string_view name(names.data() + r.name_begin, r.name_end - r.name_begin);
  std::string path;
  path.reserve(file.size() + 1 + name.size());
  path.append(file).append(file == "/" ? "" : "/").append(name);
  return path;
}

SampleRecord SampleRecords::Record(size_t i) const {
  const Row& r = rows[i];
  SampleRecord out;
  out.id = r.id;
  out.source = r.kind == Kind::kTar ? "tar" : r.kind == Kind::kIdx ? "idx" : "file";
  out.path = Path(i);
  out.record_index = r.kind == Kind::kIdx ? r.position : -1;
  out.offset = r.kind == Kind::kTar ? r.position : -1;
  out.size = r.size;
  out.label = r.label;
  if (r.kind == Kind::kTar) out.member.assign(names, r.name_begin, r.name_end - r.name_begin);
  return out;
}

Result<SampleRecords> Catalog::GetSampleRecords(const Roaring& ids) const {
  SampleRecords out;
  if (ids.isEmpty()) return out;
  std::unordered_map<int64_t, std::string> dirs;
  {
    Result<SqliteStmt> stmt = db_->Prepare("SELECT id, path FROM dirs");
    if (!stmt.ok()) return stmt.status();
    while (true) {
      Result<bool> row = stmt->Step();
      if (!row.ok()) return row.status();
      if (!*row) break;
      dirs.emplace(stmt->ColumnInt(0), std::string(stmt->ColumnText(1)));
    }
  }
  constexpr std::string_view kColumns =
      "SELECT id, dir, name, record, size, label, byte_offset FROM samples";
  const uint64_t lo = ids.minimum(), hi = ids.maximum();
  const bool range_scan = ids.cardinality() * kRangeScanDensity >= hi - lo + 1;
  Result<SqliteStmt> stmt =
      db_->Prepare(fmt::format("{} WHERE id {}", kColumns, range_scan ? "BETWEEN ? AND ?" : "= ?"));
  if (!stmt.ok()) return stmt.status();
  out.rows.reserve(ids.cardinality());
  // A folder (plain files, shards) or an IDX file is stored once: rows of one file come in runs.
  std::map<std::pair<int64_t, std::string>, uint32_t> file_index;  // (dir, IDX name or "")
  std::pair<int64_t, std::string> last_key{-1, ""};
  uint32_t last_file = 0;
  auto take_row = [&]() {
    SampleRecords::Row r;
    r.id = static_cast<uint32_t>(stmt->ColumnInt(0));
    const int64_t dir = stmt->ColumnInt(1);
    const std::string_view name = stmt->ColumnText(2);
    const int64_t record = stmt->ColumnInt(3);
    const int64_t offset = stmt->ColumnInt(6);
    r.kind = offset >= 0   ? SampleRecords::Kind::kTar
             : record >= 0 ? SampleRecords::Kind::kIdx
                           : SampleRecords::Kind::kFile;
    r.position = offset >= 0 ? offset : record;
    const bool named_file = r.kind == SampleRecords::Kind::kIdx;  // the file is dir/name
    if (dir != last_key.first || (named_file ? last_key.second != name : !last_key.second.empty())) {
      last_key = {dir, named_file ? std::string(name) : std::string()};
      auto [it, inserted] = file_index.try_emplace(last_key, static_cast<uint32_t>(out.files.size()));
      if (inserted) {
        const std::string& d = dirs[dir];
        out.files.push_back(named_file ? d + (d == "/" ? "" : "/") + std::string(name) : d);
      }
      last_file = it->second;
    }
    r.file = last_file;
    if (!named_file) {
      r.name_begin = static_cast<uint32_t>(out.names.size());
      out.names.append(name);
      r.name_end = static_cast<uint32_t>(out.names.size());
    }
    r.size = static_cast<uint64_t>(stmt->ColumnInt(4));
    r.label = static_cast<int32_t>(stmt->ColumnInt(5));
    out.rows.push_back(r);
  };
  if (range_scan) {
    stmt->BindInt(1, static_cast<int64_t>(lo));
    stmt->BindInt(2, static_cast<int64_t>(hi));
    while (true) {
      Result<bool> row = stmt->Step();
      if (!row.ok()) return row.status();
      if (!*row) break;
      if (ids.contains(static_cast<uint32_t>(stmt->ColumnInt(0)))) take_row();
    }
  } else {
    for (uint32_t id : ids) {
      stmt->Reset();
      stmt->BindInt(1, id);
      Result<bool> row = stmt->Step();
      if (!row.ok()) return row.status();
      if (*row) take_row();
    }
  }
  if (out.rows.size() != ids.cardinality()) {
    return Status::NotFound(fmt::format(
        "{} of {} sample ids are not in the catalog \"{}\"; the catalog is damaged, re-register "
        "the dataset",
        ids.cardinality() - out.rows.size(), ids.cardinality(), db_->file().string()));
  }
  if (out.names.size() > UINT32_MAX) {
    return Status::ResourceExhausted(fmt::format(
        "the {} samples' names take {} bytes, more than 4 GiB; split the dataset", out.size(),
        out.names.size()));
  }
  return out;
}

Result<std::vector<SampleRecord>> Catalog::GetSamples(const Roaring& ids) const {
  Result<SampleRecords> records = GetSampleRecords(ids);
  if (!records.ok()) return records.status();
  std::vector<SampleRecord> out;
  out.reserve(records->size());
  for (size_t i = 0; i < records->size(); ++i) out.push_back(records->Record(i));
  return out;
}

Status Catalog::CheckNewName(std::string_view name, bool replace) const {
  Status s = ValidateDatasetName(name);
  if (!s.ok() || replace) return s;
  Result<SqliteStmt> stmt = db_->Prepare("SELECT 1 FROM datasets WHERE name=?");
  if (!stmt.ok()) return stmt.status();
  stmt->BindText(1, name);
  Result<bool> row = stmt->Step();
  if (!row.ok()) return row.status();
  if (*row) {
    return Status::AlreadyExists(fmt::format(
        "dataset \"{}\" already exists; choose another name, pass --replace, or 'carpool "
        "dataset rm {}' first",
        name, name));
  }
  return Status::OK();
}

Status Catalog::InsertDataset(const DatasetMeta& meta, const Roaring& ids, bool replace,
                              int64_t now) {
  Status s = CheckNewName(meta.name, replace);
  if (!s.ok()) return s;
  if (ids.isEmpty()) {
    return Status::InvalidArgument(
        fmt::format("dataset \"{}\" would be empty; check the source or the selection", meta.name));
  }
  Result<SqliteStmt> del = db_->Prepare("DELETE FROM datasets WHERE name=?");
  if (!del.ok()) return del.status();
  del->BindText(1, meta.name);
  s = del->Run();
  if (!s.ok()) return s;
  Result<SqliteStmt> ins = db_->Prepare(
      "INSERT INTO datasets(name, ids, count, prepare, classes, source, created) "
      "VALUES(?,?,?,?,?,?,?)");
  if (!ins.ok()) return ins.status();
  std::vector<uint8_t> blob = EncodeIds(ids);
  ins->BindText(1, meta.name);
  ins->BindBlob(2, blob);
  ins->BindInt(3, static_cast<int64_t>(ids.cardinality()));
  ins->BindText(4, meta.prepare_spec);
  ins->BindText(5, EncodeClasses(meta.classes));
  ins->BindText(6, meta.source_desc);
  ins->BindInt(7, now);
  return ins->Run();
}

Result<DatasetInfo> Catalog::AddDataset(const DatasetMeta& meta, const Roaring& ids, bool replace) {
  int64_t now = UnixNow();
  Result<SqliteTransaction> txn = SqliteTransaction::Begin(db_.get());
  if (!txn.ok()) return txn.status();
  Result<int64_t> max_id = db_->QueryInt("SELECT coalesce(max(id), 0) FROM samples");
  if (!max_id.ok()) return max_id.status();
  if (!ids.isEmpty() && ids.maximum() > *max_id) {
    return Status::InvalidArgument(fmt::format(
        "sample id {} is not in the catalog (largest id {}); derive datasets from registered ones",
        ids.maximum(), *max_id));
  }
  Result<SampleRecords> records = GetSampleRecords(ids);
  if (!records.ok()) return records.status();
  Status s = CheckPrepareFits(meta.name, meta.prepare_spec, KindsOf(*records));
  if (s.ok()) s = InsertDataset(meta, ids, replace, now);
  if (s.ok()) s = txn->Commit();
  if (!s.ok()) return s;
  return DatasetInfo{meta.name, ids, meta.prepare_spec, meta.classes, meta.source_desc, now};
}

Status Catalog::RemoveDataset(std::string_view name) {
  Result<DatasetInfo> info = GetDataset(name);
  if (!info.ok()) return info.status();
  Result<SqliteStmt> del = db_->Prepare("DELETE FROM datasets WHERE name=?");
  if (!del.ok()) return del.status();
  del->BindText(1, name);
  return del->Run();
}

}  // namespace carpool
