#include "server/engine_samples.h"

#include <fmt/format.h>
#include <zlib.h>

#include <map>
#include <string>

namespace carpool {
namespace {

// The shape of one record of an IDX file, from its header only (zlib reads plain files as is).
Result<PreparedShape> IdxRecordShape(const std::string& path, int channels) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return Status::IOError(fmt::format("cannot open IDX file \"{}\"; re-register the dataset", path));
  }
  uint8_t magic[4] = {};
  std::vector<uint32_t> dims;
  bool ok = gzread(f, magic, 4) == 4 && magic[0] == 0 && magic[1] == 0 && magic[3] >= 1 &&
            magic[3] <= 4;
  for (int i = 0; ok && i < magic[3]; ++i) {
    uint8_t d[4];
    ok = gzread(f, d, 4) == 4;
    dims.push_back(uint32_t{d[0]} << 24 | uint32_t{d[1]} << 16 | uint32_t{d[2]} << 8 | d[3]);
  }
  gzclose(f);
  if (!ok) {
    return Status::Corruption(fmt::format("IDX file \"{}\" has a bad header", path));
  }
  PreparedShape shape;
  shape.channels = channels;
  if (dims.size() == 1) {
    shape.height = 1;
    shape.width = 1;
  } else if (dims.size() == 2) {
    shape.height = 1;
    shape.width = static_cast<int>(dims[1] / static_cast<uint32_t>(channels));
  } else {
    shape.height = static_cast<int>(dims[1]);
    shape.width = static_cast<int>(dims[2]);
    if (dims.size() == 4) shape.channels = static_cast<int>(dims[3]);
  }
  return shape;
}

}  // namespace

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
  out.spec = *spec;
  if (out.info.ids.isEmpty()) {
    return Status::FailedPrecondition(
        fmt::format("dataset \"{}\" is empty; register samples with 'carpool dataset add'", name));
  }
  Result<std::vector<SampleRecord>> records = catalog.GetSamples(out.info.ids);
  if (!records.ok()) return records.status();
  std::map<std::string, PreparedShape> raw_shapes;  // by IDX path
  out.samples.reserve(records->size());
  for (SampleRecord& r : *records) {
    auto s = std::make_shared<SampleSource>();
    s->spec = out.spec;
    if (out.spec.raw) {
      auto it = raw_shapes.find(r.path);
      if (it == raw_shapes.end()) {
        Result<PreparedShape> shape = IdxRecordShape(r.path, out.spec.channels);
        if (!shape.ok()) return shape.status();
        it = raw_shapes.emplace(r.path, *shape).first;
      }
      s->raw_shape = it->second;
    }
    s->record = std::move(r);
    out.samples.push_back(std::move(s));
  }
  const SampleSource& first = *out.samples.front();
  if (out.spec.raw) {
    out.prepared_shape = first.raw_shape;
  } else if (out.spec.crop > 0) {
    out.prepared_shape = {out.spec.crop, out.spec.crop, out.spec.channels};
  } else {
    Result<std::vector<uint8_t>> bytes = reader.Read(first.record);
    Result<PreparedShape> shape =
        bytes.ok() ? PreparedShapeFor(first.spec, *bytes) : Result<PreparedShape>(bytes.status());
    if (!shape.ok()) {
      return Status::FailedPrecondition(fmt::format(
          "dataset \"{}\": cannot read the shape of its first sample \"{}\": {}", name,
          first.record.path, shape.status().message()));
    }
    out.prepared_shape = *shape;
  }
  return out;
}

Status SampleTable::Check(const DatasetSamples& dataset, size_t begin, size_t end) const {
  for (size_t i = begin; i < end; ++i) {
    const auto& s = dataset.samples[i];
    auto it = map_.find(s->record.id);
    if (it != map_.end() && !(it->second.source->spec == s->spec)) {
      return Status::FailedPrecondition(fmt::format(
          "dataset \"{}\" prepares sample {} (\"{}\") as \"{}\", but this server already prepares "
          "it as \"{}\" for another dataset; restart the server to change the prepare spec",
          dataset.info.name, s->record.id, s->record.path, s->spec.ToString(),
          it->second.source->spec.ToString()));
    }
  }
  return Status::OK();
}

Status SampleTable::Add(const DatasetSamples& dataset, size_t begin, size_t end) {
  if (Status checked = Check(dataset, begin, end); !checked.ok()) return checked;
  map_.reserve(map_.size() + (end - begin));
  // New samples per IDX file, counted in runs: a file's records are adjacent (ascending ids), and
  // hashing the path once per run instead of once per sample keeps a 1.28M-sample join fast.
  const std::string* run_path = nullptr;
  size_t run = 0;
  auto flush = [&] {
    if (run > 0) idx_users_[*run_path] += run;
    run = 0;
  };
  for (size_t i = begin; i < end; ++i) {
    const auto& s = dataset.samples[i];
    auto [it, inserted] = map_.try_emplace(s->record.id, Entry{s, 0});
    ++it->second.users;
    if (!inserted || s->record.source != "idx") continue;
    if (run_path == nullptr || *run_path != s->record.path) {
      flush();
      run_path = &s->record.path;
    }
    ++run;
  }
  flush();
  return Status::OK();
}

ReleasedSamples SampleTable::Release(const Roaring& ids) {
  ReleasedSamples out;
  for (uint32_t id : ids) {
    auto it = map_.find(id);
    if (it == map_.end() || --it->second.users > 0) continue;
    const SampleRecord& r = it->second.source->record;
    if (r.source == "idx") {
      auto file = idx_users_.find(r.path);
      if (file != idx_users_.end() && --file->second == 0) {
        out.idx_paths.push_back(r.path);
        idx_users_.erase(file);
      }
    }
    out.samples.push_back(id);
    map_.erase(it);
  }
  return out;
}

std::shared_ptr<const SampleSource> SampleTable::Find(uint32_t id) const {
  auto it = map_.find(id);
  return it == map_.end() ? nullptr : it->second.source;
}

}  // namespace carpool
