#include "server/engine_samples.h"

#include <fmt/format.h>

#include <map>
#include <string>

#include "datasets/idx.h"

namespace carpool {
namespace {

// The shape a raw spec gives the records of an IDX file, from its header only.
Result<PreparedShape> IdxRecordShape(const std::string& path, const PrepareSpec& spec) {
  Result<IdxHeader> header = ReadIdxHeader(path);
  if (!header.ok()) return header.status();
  Result<IdxRecordLayout> layout = RawRecordLayout(*header, spec, path);
  if (!layout.ok()) return layout.status();
  return PreparedShape{layout->height, layout->width, layout->channels};
}

}  // namespace

SampleSource SampleSource::Of(std::shared_ptr<const SampleBlock> block, uint32_t row) {
  SampleSource s;
  s.record = block->records.Record(row);
  s.spec = block->spec;
  if (block->spec.raw) s.raw_shape = block->raw_shapes[block->records.rows[row].file];
  s.block = std::move(block);
  s.row = row;
  return s;
}

Result<DatasetSamples> LoadDatasetSamples(const Catalog& catalog, std::string_view name,
                                          SampleReader& reader) {
  Result<DatasetInfo> info = catalog.GetDataset(name);
  if (!info.ok()) return info.status();
  DatasetSamples out;
  out.info = std::move(*info);
  Result<PrepareSpec> spec = ParsePrepareSpec(out.info.prepare_spec);
  if (!spec.ok()) {
    return Status::FailedPrecondition(fmt::format("dataset \"{}\" has a bad prepare spec: {}",
                                                  name, spec.status().message()));
  }
  if (out.info.ids.isEmpty()) {
    return Status::FailedPrecondition(
        fmt::format("dataset \"{}\" is empty; register samples with 'carpool dataset add'", name));
  }
  Result<SampleRecords> records = catalog.GetSampleRecords(out.info.ids);
  if (!records.ok()) return records.status();
  auto block = std::make_shared<SampleBlock>();
  block->records = std::move(*records);
  block->spec = *spec;
  const SampleRecords& r = block->records;
  if (block->spec.raw) {
    // From the files' headers, once per file; a raw spec reads IDX records only.
    block->raw_shapes.resize(r.files.size());
    std::vector<bool> known(r.files.size(), false);
    for (size_t i = 0; i < r.size(); ++i) {
      const uint32_t f = r.rows[i].file;
      if (known[f]) continue;
      Result<PreparedShape> shape = IdxRecordShape(r.Path(i), block->spec);
      if (!shape.ok()) return shape.status();
      block->raw_shapes[f] = *shape;
      known[f] = r.rows[i].kind == SampleRecords::Kind::kIdx;
    }
  }
  block->released.reset(new std::atomic<bool>[r.size()]());
  if (block->spec.raw) {
    out.prepared_shape = block->raw_shapes[r.rows.front().file];
  } else if (block->spec.crop > 0) {
    out.prepared_shape = {block->spec.crop, block->spec.crop, block->spec.channels};
  } else {
    const SampleRecord first = r.Record(0);
    Result<std::vector<uint8_t>> bytes = reader.Read(first);
    Result<PreparedShape> shape =
        bytes.ok() ? PreparedShapeFor(block->spec, *bytes) : Result<PreparedShape>(bytes.status());
    if (!shape.ok()) {
      return Status::FailedPrecondition(fmt::format(
          "dataset \"{}\": cannot read the shape of its first sample \"{}\": {}", name,
          first.path, shape.status().message()));
    }
    out.prepared_shape = *shape;
  }
  out.block = std::move(block);
  return out;
}

Status SampleTable::Check(const DatasetSamples& dataset, size_t begin, size_t end) const {
  const SampleRecords& r = dataset.block->records;
  for (size_t i = begin; i < end; ++i) {
    auto it = map_.find(dataset.block->key_base + r.rows[i].id);
    if (it != map_.end() && !(it->second.block->spec == dataset.spec())) {
      return Status::FailedPrecondition(fmt::format(
          "dataset \"{}\" prepares sample {} (\"{}\") as \"{}\", but the server keys it (key {}) "
          "as \"{}\"; this is a bug, please report it",
          dataset.info.name, r.rows[i].id, r.Path(i), dataset.spec().ToString(),
          dataset.block->key_base + r.rows[i].id, it->second.block->spec.ToString()));
    }
  }
  return Status::OK();
}

Status SampleTable::Add(const DatasetSamples& dataset, size_t begin, size_t end) {
  if (Status checked = Check(dataset, begin, end); !checked.ok()) return checked;
  const SampleRecords& r = dataset.block->records;
  // New samples per IDX file, counted in runs: a file's records are adjacent (ascending ids), and
  // hashing the path once per run instead of once per sample keeps a 1.28M-sample join fast.
  uint32_t run_file = 0;
  size_t run = 0;
  auto flush = [&] {
    if (run > 0) idx_users_[r.files[run_file]] += run;
    run = 0;
  };
  for (size_t i = begin; i < end; ++i) {
    const SampleRecords::Row& row = r.rows[i];
    auto [it, inserted] = map_.try_emplace(dataset.block->key_base + row.id,
                                           Entry{dataset.block, static_cast<uint32_t>(i), 0});
    ++it->second.users;
    if (!inserted || row.kind != SampleRecords::Kind::kIdx) continue;
    if (run > 0 && run_file != row.file) flush();
    run_file = row.file;
    ++run;
  }
  flush();
  return Status::OK();
}

Roaring SampleTable::KeysOf(const DatasetSamples& dataset, size_t end) {
  Roaring keys;
  for (size_t i = 0; i < end; ++i) keys.add(dataset.block->key_base + dataset.block->records.rows[i].id);
  return keys;
}

ReleasedSamples SampleTable::Release(std::span<const uint32_t> keys) {
  ReleasedSamples out;
  for (uint32_t id : keys) {
    auto it = map_.find(id);
    if (it == map_.end() || --it->second.users > 0) continue;
    const SampleBlock& block = *it->second.block;
    const SampleRecords::Row& row = block.records.rows[it->second.row];
    if (row.kind == SampleRecords::Kind::kIdx) {
      auto file = idx_users_.find(block.records.files[row.file]);
      if (file != idx_users_.end() && --file->second == 0) {
        out.idx_paths.push_back(file->first);
        idx_users_.erase(file);
      }
    }
    out.samples.push_back(id);
    block.released[it->second.row].store(true, std::memory_order_relaxed);
    map_.erase(it);
  }
  return out;
}

ReleasedSamples SampleTable::Release(const Roaring& keys) {
  std::vector<uint32_t> all(keys.cardinality());
  keys.toUint32Array(all.data());
  return Release(std::span<const uint32_t>(all));
}

std::shared_ptr<const SampleSource> SampleTable::Find(uint32_t id) const {
  auto it = map_.find(id);
  if (it == map_.end()) return nullptr;
  return std::make_shared<const SampleSource>(SampleSource::Of(it->second.block, it->second.row));
}

int32_t SampleTable::Label(uint32_t id) const {
  auto it = map_.find(id);
  return it == map_.end() ? -1 : it->second.block->records.rows[it->second.row].label;
}

}  // namespace carpool
