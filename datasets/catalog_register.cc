// Catalog::Register: the write path of `carpool dataset add` for sources.
#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "datasets/catalog.h"
#include "datasets/catalog_codec.h"
#include "datasets/prepare_fit.h"
#include "datasets/sqlite_db.h"

namespace carpool {

namespace {

constexpr int64_t kMaxSampleId = UINT32_MAX;
constexpr size_t kProgressEvery = 16384;

// Input positions sorted by (canonical dir, name, record); equal keys keep input order.
std::vector<uint32_t> SortedOrder(const SourceScan& scan) {
  std::vector<uint32_t> dir_rank(scan.dirs.size());
  {
    std::vector<uint32_t> by_path(scan.dirs.size());
    std::iota(by_path.begin(), by_path.end(), 0);
    std::sort(by_path.begin(), by_path.end(),
              [&](uint32_t a, uint32_t b) { return scan.dirs[a] < scan.dirs[b]; });
    for (uint32_t r = 0; r < by_path.size(); ++r) dir_rank[by_path[r]] = r;
  }
  std::vector<uint32_t> order(scan.samples.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const SourceSample& x = scan.samples[a];
    const SourceSample& y = scan.samples[b];
    if (x.dir != y.dir) return dir_rank[x.dir] < dir_rank[y.dir];
    if (int c = x.name.compare(y.name); c != 0) return c < 0;
    return x.record_index < y.record_index;
  });
  return order;
}

bool SameKey(const SourceSample& x, const SourceSample& y) {
  return x.dir == y.dir && x.record_index == y.record_index && x.name == y.name;
}

}  // namespace

Result<RegisterReport> Catalog::Register(const DatasetMeta& meta, const SourceScan& scan,
                                         bool replace, const ProgressFn& progress) {
  Status s = CheckNewName(meta.name, replace);
  if (!s.ok()) return s;
  if (scan.samples.empty()) {
    return Status::InvalidArgument(fmt::format(
        "dataset \"{}\" would be empty: no readable samples in {}; check the path and contents",
        meta.name, scan.description));
  }
  if (Status fits = CheckPrepareFits(meta.name, meta.prepare_spec, KindsOf(scan)); !fits.ok()) {
    return fits;
  }
  std::vector<uint32_t> order = SortedOrder(scan);
  RegisterReport report;
  int64_t now = UnixNow();

  Result<SqliteTransaction> txn = SqliteTransaction::Begin(db_.get());
  if (!txn.ok()) return txn.status();
  Result<int64_t> max_before = db_->QueryInt("SELECT coalesce(max(id), 0) FROM samples");
  if (!max_before.ok()) return max_before.status();
  // Directory ids, created on first use.
  std::vector<int64_t> dir_ids(scan.dirs.size(), -1);
  {
    Result<SqliteStmt> ins = db_->Prepare("INSERT OR IGNORE INTO dirs(path) VALUES(?)");
    Result<SqliteStmt> sel = db_->Prepare("SELECT id FROM dirs WHERE path=?");
    if (!ins.ok()) return ins.status();
    if (!sel.ok()) return sel.status();
    for (size_t d = 0; d < scan.dirs.size(); ++d) {
      ins->BindText(1, scan.dirs[d]);
      s = ins->Run();
      if (!s.ok()) return s;
      sel->BindText(1, scan.dirs[d]);
      Result<bool> row = sel->Step();
      if (!row.ok()) return row.status();
      if (!*row) return Status::Internal("catalog lost a directory row it just inserted");
      dir_ids[d] = sel->ColumnInt(0);
      sel->Reset();
    }
  }
  // One upsert per sample: a known sample returns its id (and its stored label), a new one gets
  // the next id. The size (and a tar member's offset) is refreshed, since the file may have
  // changed.
  Result<SqliteStmt> upsert = db_->Prepare(
      "INSERT INTO samples(dir, name, record, size, label, byte_offset) VALUES(?,?,?,?,?,?) "
      "ON CONFLICT(dir, name, record) DO UPDATE SET size=excluded.size, "
      "byte_offset=excluded.byte_offset "
      "RETURNING id, label");
  if (!upsert.ok()) return upsert.status();
  Roaring ids;
  std::vector<uint32_t> batch;
  batch.reserve(4096);
  const SourceSample* prev = nullptr;
  for (size_t k = 0; k < order.size(); ++k) {
    const SourceSample& smp = scan.samples[order[k]];
    if (prev != nullptr && SameKey(*prev, smp)) {
      ++report.duplicates;
      continue;
    }
    prev = &smp;
    upsert->BindInt(1, dir_ids[smp.dir]);
    upsert->BindText(2, smp.name);
    upsert->BindInt(3, smp.record_index);
    upsert->BindInt(4, static_cast<int64_t>(smp.size));
    upsert->BindInt(5, smp.label);
    upsert->BindInt(6, smp.offset);
    Result<bool> row = upsert->Step();
    if (!row.ok()) return row.status();
    if (!*row) return Status::Internal("catalog upsert returned no row");
    int64_t id = upsert->ColumnInt(0);
    if (id > kMaxSampleId) {
      return Status::ResourceExhausted(fmt::format(
          "catalog is out of 32-bit sample ids (next id {}); use a new --state-dir", id));
    }
    if (id > *max_before) {
      ++report.new_samples;
    } else if (upsert->ColumnInt(1) != smp.label) {
      ++report.label_conflicts;
    }
    batch.push_back(static_cast<uint32_t>(id));
    upsert->Reset();
    if (batch.size() == batch.capacity()) {
      ids.addMany(batch.size(), batch.data());
      batch.clear();
    }
    if (progress && k % kProgressEvery == 0) progress("writing catalog", k, order.size());
  }
  ids.addMany(batch.size(), batch.data());
  if (progress) progress("writing catalog", order.size(), order.size());
  s = InsertDataset(meta, ids, replace, now);
  if (s.ok()) s = txn->Commit();
  if (!s.ok()) return s;
  report.info = DatasetInfo{meta.name,    std::move(ids),   meta.prepare_spec,
                            meta.classes, meta.source_desc, now};
  return report;
}

}  // namespace carpool
