// `carpool dataset add`: register a source (--dir, --list, --idx, --tar) or derive a dataset from
// registered ones (--from, --union, --intersect, --minus).
#include <fmt/core.h>

#include <boost/program_options.hpp>
#include <optional>
#include <string>
#include <vector>

#include "datasets/derived.h"
#include "datasets/file_list.h"
#include "datasets/idx.h"
#include "datasets/image_dir.h"
#include "datasets/prepare_spec.h"
#include "datasets/tar_shards.h"
#include "tools/dataset_cmd.h"

namespace carpool::tools {

namespace po = boost::program_options;

namespace {

constexpr size_t kUnreadableShown = 20;

struct AddArgs {
  std::string name, state_dir, dir, list, from, classes, ids, prepare;
  std::vector<std::string> idx, tar, union_of, intersect_of, minus_of;
  double fraction = 0;
  uint64_t seed = 0;
  bool replace = false, strict = false, quiet = false;
};

// The --prepare value in canonical form, or `fallback` when none was given.
Result<std::string> PrepareOr(const AddArgs& a, const std::string& fallback) {
  if (a.prepare.empty()) return fallback;
  Result<PrepareSpec> spec = ParsePrepareSpec(a.prepare);
  if (!spec.ok()) return spec.status();
  return spec->ToString();
}

Status ReportUnreadable(const AddArgs& a, const SourceScan& scan) {
  if (scan.unreadable.empty()) return Status::OK();
  for (size_t i = 0; i < scan.unreadable.size() && i < kUnreadableShown; ++i) {
    fmt::print(stderr, "carpool dataset add: unreadable: {}\n", scan.unreadable[i]);
  }
  if (scan.unreadable.size() > kUnreadableShown) {
    fmt::print(stderr, "carpool dataset add: ... and {} more unreadable\n",
               scan.unreadable.size() - kUnreadableShown);
  }
  if (a.strict) {
    return Status::InvalidArgument(fmt::format(
        "{} unreadable files in {} and --strict is set; nothing registered. Fix or remove them, "
        "or drop --strict to register the other {}",
        scan.unreadable.size(), scan.description, scan.samples.size()));
  }
  fmt::print(stderr, "carpool dataset add: skipped {} unreadable files (listed above)\n",
             scan.unreadable.size());
  return Status::OK();
}

int AddFromSource(const AddArgs& a, Catalog& catalog) {
  ProgressBar bar(a.quiet);
  Result<SourceScan> scan = Status::Internal("no source");
  if (!a.dir.empty()) {
    scan = ScanImageDir(a.dir, bar.Fn());
  } else if (!a.list.empty()) {
    scan = ReadFileList(a.list, bar.Fn());
  } else if (!a.tar.empty()) {
    scan = ScanTarShards(a.tar, bar.Fn());
  } else {
    scan = ReadIdxPair(a.idx[0], a.idx[1]);
  }
  bar.Done();
  if (!scan.ok()) return Fail("add", scan.status());
  Status s = ReportUnreadable(a, *scan);
  if (!s.ok()) return Fail("add", s);
  Result<std::string> prepare = PrepareOr(a, scan->default_prepare);
  if (!prepare.ok()) return Fail("add", prepare.status());
  DatasetMeta meta{a.name, *prepare, scan->classes, scan->description};
  Result<RegisterReport> r = catalog.Register(meta, *scan, a.replace, bar.Fn());
  bar.Done();
  if (!r.ok()) return Fail("add", r.status());
  if (r->duplicates > 0) {
    fmt::print(stderr, "carpool dataset add: {} entries named a file listed before; kept once\n",
               r->duplicates);
  }
  if (r->label_conflicts > 0) {
    fmt::print(stderr,
               "carpool dataset add: {} samples were registered before with another label; they "
               "keep their first label\n",
               r->label_conflicts);
  }
  if (JsonOutput()) {
    nlohmann::json out = DatasetJson(r->info);
    out["new_samples"] = r->new_samples;
    out["unreadable"] = scan->unreadable.size();
    out["duplicates"] = r->duplicates;
    out["label_conflicts"] = r->label_conflicts;
    PrintJson(out);
    return 0;
  }
  fmt::print("registered \"{}\": {} samples ({} new), {} classes, prepare {}\n", a.name,
             r->info.ids.cardinality(), r->new_samples, r->info.classes.size(), *prepare);
  return 0;
}

Result<DerivedSet> Derive(const AddArgs& a, const Catalog& catalog) {
  if (!a.from.empty()) {
    int modes = !a.classes.empty() + (a.fraction != 0) + !a.ids.empty();
    if (modes != 1) {
      return Status::InvalidArgument(
          "--from needs exactly one of --classes a,b / --fraction F [--seed S] / --ids LO:HI");
    }
    Result<DatasetInfo> from = catalog.GetDataset(a.from);
    if (!from.ok()) return from.status();
    Result<DerivedSet> d = !a.classes.empty() ? SelectClasses(catalog, *from, a.classes)
                           : !a.ids.empty()   ? SelectIdRange(*from, a.ids)
                                              : SelectFraction(*from, a.fraction, a.seed);
    if (!d.ok()) return d;
    Result<std::string> prepare = PrepareOr(a, d->meta.prepare_spec);
    if (!prepare.ok()) return prepare.status();
    d->meta.prepare_spec = *prepare;
    return d;
  }
  const std::vector<std::string>& pair = !a.union_of.empty()       ? a.union_of
                                         : !a.intersect_of.empty() ? a.intersect_of
                                                                   : a.minus_of;
  SetOp op = !a.union_of.empty()       ? SetOp::kUnion
             : !a.intersect_of.empty() ? SetOp::kIntersect
                                       : SetOp::kMinus;
  Result<DatasetInfo> lhs = catalog.GetDataset(pair[0]);
  if (!lhs.ok()) return lhs.status();
  Result<DatasetInfo> rhs = catalog.GetDataset(pair[1]);
  if (!rhs.ok()) return rhs.status();
  Result<std::string> prepare = PrepareOr(a, "");
  if (!prepare.ok()) return prepare.status();
  return Combine(op, *lhs, *rhs, *prepare);
}

int AddDerived(const AddArgs& a, Catalog& catalog) {
  Result<DerivedSet> d = Derive(a, catalog);
  if (!d.ok()) return Fail("add", d.status());
  d->meta.name = a.name;
  if (d->ids.isEmpty()) {
    return Fail("add", Status::InvalidArgument(fmt::format(
                           "dataset \"{}\" would be empty ({}); choose a selection that keeps "
                           "some samples",
                           a.name, d->meta.source_desc)));
  }
  Result<DatasetInfo> info = catalog.AddDataset(d->meta, d->ids, a.replace);
  if (!info.ok()) return Fail("add", info.status());
  if (JsonOutput()) {
    PrintJson(DatasetJson(*info));
    return 0;
  }
  fmt::print("registered \"{}\": {} samples ({}), prepare {}\n", a.name, info->ids.cardinality(),
             info->source_desc, info->prepare_spec);
  return 0;
}

}  // namespace

int DatasetAdd(int argc, char** argv) {
  AddArgs a;
  po::options_description opts("carpool dataset add NAME SOURCE [options]");
  opts.add_options()("help,h", "show this help")("dir", po::value(&a.dir),
                                                 "image folder: class subfolders, or flat")(
      "list", po::value(&a.list), "CSV of path,label (paths relative to the list's folder)")(
      "idx", po::value(&a.idx)->multitoken(), "IDX IMAGES LABELS (.gz or plain)")(
      "tar", po::value(&a.tar)->multitoken(),
      "tar shards (WebDataset: KEY.jpg|png + KEY.cls): 'DIR/train-{000000..000146}.tar', a "
      "glob, or paths")(
      "from", po::value(&a.from), "derive from a registered dataset")(
      "classes", po::value(&a.classes), "with --from: class names or indices, a,b,...")(
      "fraction", po::value(&a.fraction), "with --from: keep this fraction, in (0, 1]")(
      "seed", po::value(&a.seed), "with --fraction: random seed (default 0)")(
      "ids", po::value(&a.ids), "with --from: sample-id range LO:HI (half-open)")(
      "union", po::value(&a.union_of)->multitoken(), "A B: ids in A or B")(
      "intersect", po::value(&a.intersect_of)->multitoken(), "A B: ids in A and B")(
      "minus", po::value(&a.minus_of)->multitoken(), "A B: ids in A and not B")(
      "prepare", po::value(&a.prepare),
      "prepare spec (default: resize=256,crop=256 for images, raw,channels=1 for IDX)")(
      "replace", po::bool_switch(&a.replace), "overwrite a dataset of the same name")(
      "strict", po::bool_switch(&a.strict), "fail if any file is unreadable")(
      "quiet,q", po::bool_switch(&a.quiet), "no progress bar")(
      "json", "print one JSON object on stdout (errors: {\"error\": ...})")(
      "state-dir", po::value(&a.state_dir), "catalog location")("name", po::value(&a.name),
                                                                "dataset name (positional)");
  po::positional_options_description pos;
  pos.add("name", 1);
  po::variables_map vm;
  if (std::optional<int> rc = ParseVerbArgs("add", argc, argv, opts, pos, &vm)) return *rc;
  int sources = !a.dir.empty() + !a.list.empty() + !a.idx.empty() + !a.tar.empty() +
                !a.from.empty() +
                !a.union_of.empty() + !a.intersect_of.empty() + !a.minus_of.empty();
  std::string usage;
  if (a.name.empty()) usage = "missing dataset NAME";
  if (usage.empty() && sources != 1) {
    usage =
        "give exactly one of --dir, --list, --idx, --tar, --from, --union, --intersect, --minus";
  }
  if (usage.empty() && !a.idx.empty() && a.idx.size() != 2) usage = "--idx takes IMAGES LABELS";
  for (const auto* pair : {&a.union_of, &a.intersect_of, &a.minus_of}) {
    if (usage.empty() && !pair->empty() && pair->size() != 2) {
      usage = "--union/--intersect/--minus take two dataset names A B";
    }
  }
  if (!usage.empty()) return UsageError("add", usage);
  Result<std::unique_ptr<Catalog>> catalog = OpenCatalog(a.state_dir);
  if (!catalog.ok()) return Fail("add", catalog.status());
  // Fail fast on a taken name or a bad spec, before a long scan.
  Status s = (*catalog)->CheckNewName(a.name, a.replace);
  if (s.ok()) s = PrepareOr(a, "").status();
  if (!s.ok()) return Fail("add", s);
  bool derived =
      !a.from.empty() || !a.union_of.empty() || !a.intersect_of.empty() || !a.minus_of.empty();
  return derived ? AddDerived(a, **catalog) : AddFromSource(a, **catalog);
}

}  // namespace carpool::tools
