#include "datasets/prepare_fit.h"

#include <fmt/format.h>

#include <filesystem>
#include <set>
#include <vector>

#include "datasets/idx.h"
#include "datasets/prepare_spec.h"

namespace carpool {

namespace {

// Counts one image, and names it when it is the first: `describe` runs once per dataset.
template <typename Describe>
void AddImage(SampleKinds& k, const Describe& describe) {
  if (k.images++ == 0) k.first_image = describe();
}

std::string DescribeImage(std::string_view path, std::string_view member) {
  return member.empty() ? fmt::format("\"{}\"", path)
                        : fmt::format("tar shard \"{}\" member \"{}\"", path, member);
}

std::string Records(const SampleKinds& k) {
  return fmt::format("{} IDX record{}", k.idx_records, k.idx_records == 1 ? "" : "s");
}

std::string Images(const SampleKinds& k) {
  return fmt::format("{} image{}", k.images, k.images == 1 ? "" : "s");
}

}  // namespace

SampleKinds KindsOf(const SourceScan& scan) {
  SampleKinds k;
  std::set<std::string> seen;
  const SourceSample* last_idx = nullptr;  // the records of one file come in runs
  for (const SourceSample& s : scan.samples) {
    const std::string& dir = scan.dirs[s.dir];
    if (s.record_index < 0) {
      AddImage(k, [&] {
        return s.offset >= 0 ? DescribeImage(dir, s.name)
                             : DescribeImage((std::filesystem::path(dir) / s.name).string(), "");
      });
      continue;
    }
    ++k.idx_records;
    if (last_idx != nullptr && last_idx->dir == s.dir && last_idx->name == s.name) continue;
    last_idx = &s;
    std::string path = (std::filesystem::path(dir) / s.name).string();
    if (seen.insert(path).second) k.idx_files.push_back(std::move(path));
  }
  return k;
}

SampleKinds KindsOf(const SampleRecords& records) {
  SampleKinds k;
  std::vector<bool> seen(records.files.size(), false);
  for (size_t i = 0; i < records.size(); ++i) {
    const SampleRecords::Row& row = records.rows[i];
    if (row.kind != SampleRecords::Kind::kIdx) {
      AddImage(k, [&] {
        const SampleRecord r = records.Record(i);
        return DescribeImage(r.path, r.member);
      });
      continue;
    }
    ++k.idx_records;
    if (!seen[row.file]) k.idx_files.push_back(records.files[row.file]);
    seen[row.file] = true;
  }
  return k;
}

Status CheckPrepareFits(std::string_view dataset, std::string_view spec_text,
                        const SampleKinds& kinds) {
  Result<PrepareSpec> spec = ParsePrepareSpec(spec_text);
  if (!spec.ok()) return spec.status();
  if (kinds.idx_records > 0 && kinds.images > 0) {
    return Status::InvalidArgument(fmt::format(
        "dataset \"{}\" mixes {} (e.g. \"{}\") and {} (e.g. {}), and no prepare spec fits "
        "both; derive it from datasets of one kind",
        dataset, Records(kinds), kinds.idx_files.front(), Images(kinds), kinds.first_image));
  }
  if (!spec->raw && kinds.idx_records > 0) {
    return Status::InvalidArgument(fmt::format(
        "prepare spec \"{}\" decodes images, but dataset \"{}\" holds {} (e.g. \"{}\"), which "
        "are not images; use --prepare raw,channels=1",
        spec_text, dataset, Records(kinds), kinds.idx_files.front()));
  }
  if (spec->raw && kinds.images > 0) {
    return Status::InvalidArgument(fmt::format(
        "prepare spec \"{}\" keeps IDX records as they are, but dataset \"{}\" holds {} (e.g. "
        "{}); use an image spec, e.g. --prepare resize=256,crop=256",
        spec_text, dataset, Images(kinds), kinds.first_image));
  }
  for (const std::string& file : kinds.idx_files) {
    Result<IdxHeader> header = ReadIdxHeader(file);
    if (!header.ok()) return header.status();
    Result<IdxRecordLayout> layout = RawRecordLayout(*header, *spec, file);
    if (!layout.ok()) return layout.status();
  }
  return Status::OK();
}

}  // namespace carpool
