// `carpool dataset ls | show NAME | rm NAME | overlap A B`.
#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <ctime>
#include <string>
#include <vector>

#include "tools/dataset_cmd.h"

namespace carpool::tools {

namespace po = boost::program_options;

namespace {

struct Overlap {
  uint64_t a, b, both, either;
  double jaccard() const { return either == 0 ? 0.0 : static_cast<double>(both) / either; }
  // Theorem 1 of the Joader paper: the best per-round probability that jobs on A and B share.
  double bound() const {
    uint64_t m = std::max(a, b);
    return m == 0 ? 0.0 : static_cast<double>(both) / m;
  }
};

Overlap Measure(const Roaring& a, const Roaring& b) {
  return {a.cardinality(), b.cardinality(), a.and_cardinality(b), a.or_cardinality(b)};
}

std::string ClassList(const std::vector<std::string>& classes) {
  constexpr size_t kShown = 12;
  if (classes.empty()) return "0 (unlabelled)";
  std::vector<std::string> head(classes.begin(),
                                classes.begin() + std::min(classes.size(), kShown));
  return fmt::format("{} ({}{})", classes.size(), fmt::join(head, ", "),
                     classes.size() > kShown ? ", ..." : "");
}

nlohmann::json OverlapJson(const Overlap& ov) {
  return {{"common", ov.both},
          {"union", ov.either},
          {"jaccard", ov.jaccard()},
          {"share_bound", ov.bound()}};
}

int Ls(Catalog& catalog) {
  Result<std::vector<std::string>> names = catalog.ListDatasets();
  if (!names.ok()) return Fail("ls", names.status());
  if (JsonOutput()) {
    nlohmann::json all = nlohmann::json::array();
    for (const std::string& name : *names) {
      Result<DatasetInfo> d = catalog.GetDataset(name);
      if (!d.ok()) return Fail("ls", d.status());
      all.push_back(DatasetJson(*d));
    }
    PrintJson({{"datasets", all}});
    return 0;
  }
  fmt::print("{:<24} {:>10} {:>8}  {:<22} {}\n", "NAME", "SAMPLES", "CLASSES", "PREPARE", "SOURCE");
  for (const std::string& name : *names) {
    Result<DatasetInfo> d = catalog.GetDataset(name);
    if (!d.ok()) return Fail("ls", d.status());
    fmt::print("{:<24} {:>10} {:>8}  {:<22} {}\n", name, d->ids.cardinality(), d->classes.size(),
               d->prepare_spec, d->source_desc);
  }
  return 0;
}

int Show(Catalog& catalog, const std::string& name) {
  Result<DatasetInfo> d = catalog.GetDataset(name);
  if (!d.ok()) return Fail("show", d.status());
  Result<std::vector<std::string>> names = catalog.ListDatasets();
  if (!names.ok()) return Fail("show", names.status());
  if (JsonOutput()) {
    nlohmann::json out = DatasetJson(*d);
    nlohmann::json overlaps = nlohmann::json::array();
    for (const std::string& other : *names) {
      if (other == name) continue;
      Result<DatasetInfo> o = catalog.GetDataset(other);
      if (!o.ok()) return Fail("show", o.status());
      nlohmann::json ov = OverlapJson(Measure(d->ids, o->ids));
      ov["name"] = other;
      overlaps.push_back(ov);
    }
    out["overlap"] = overlaps;
    PrintJson(out);
    return 0;
  }
  std::time_t created = d->created_unix;
  fmt::print("name:     {}\n", d->name);
  fmt::print("samples:  {}\n", d->ids.cardinality());
  fmt::print("ids:      {}..{}\n", d->ids.minimum(), d->ids.maximum());
  fmt::print("classes:  {}\n", ClassList(d->classes));
  fmt::print("source:   {}\n", d->source_desc);
  fmt::print("prepare:  {}\n", d->prepare_spec);
  fmt::print("created:  {:%Y-%m-%d %H:%M:%S} UTC\n", fmt::gmtime(created));
  fmt::print("overlap:  {}\n", names->size() <= 1 ? "no other datasets" : "");
  for (const std::string& other : *names) {
    if (other == name) continue;
    Result<DatasetInfo> o = catalog.GetDataset(other);
    if (!o.ok()) return Fail("show", o.status());
    Overlap ov = Measure(d->ids, o->ids);
    fmt::print("  {:<24} common {:>10}  jaccard {:.4f}  share bound {:.4f}\n", other, ov.both,
               ov.jaccard(), ov.bound());
  }
  return 0;
}

int ShowOverlap(Catalog& catalog, const std::string& a, const std::string& b) {
  Result<DatasetInfo> da = catalog.GetDataset(a);
  if (!da.ok()) return Fail("overlap", da.status());
  Result<DatasetInfo> db = catalog.GetDataset(b);
  if (!db.ok()) return Fail("overlap", db.status());
  Overlap ov = Measure(da->ids, db->ids);
  if (JsonOutput()) {
    nlohmann::json out = OverlapJson(ov);
    out.update({{"a", a}, {"b", b}, {"size_a", ov.a}, {"size_b", ov.b}});
    PrintJson(out);
    return 0;
  }
  fmt::print("|A|                 {:>10}  ({})\n", ov.a, a);
  fmt::print("|B|                 {:>10}  ({})\n", ov.b, b);
  fmt::print("|A∩B|               {:>10}\n", ov.both);
  fmt::print("|A∪B|               {:>10}\n", ov.either);
  fmt::print("jaccard             {:>10.4f}\n", ov.jaccard());
  fmt::print("|A∩B|/max(|A|,|B|)  {:>10.4f}  (best per-round sharing probability)\n", ov.bound());
  return 0;
}

}  // namespace

int DatasetInspect(std::string_view verb, int argc, char** argv) {
  std::string state_dir;
  std::vector<std::string> names;
  po::options_description opts(fmt::format("carpool dataset {} [options]", verb));
  opts.add_options()("help,h", "show this help")("state-dir", po::value(&state_dir),
                                                 "catalog location")(
      "quiet,q", "accepted for symmetry with add")(
      "json", "print one JSON object on stdout (errors: {\"error\": ...})")(
      "names", po::value(&names), "dataset names");
  po::positional_options_description pos;
  pos.add("names", -1);
  po::variables_map vm;
  if (std::optional<int> rc = ParseVerbArgs(verb, argc, argv, opts, pos, &vm)) return *rc;
  size_t want = verb == "ls" ? 0 : verb == "overlap" ? 2 : 1;
  if (names.size() != want) {
    return UsageError(verb, fmt::format("expected {} dataset name{}, got {}", want,
                                        want == 1 ? "" : "s", names.size()));
  }
  Result<std::unique_ptr<Catalog>> catalog = OpenCatalog(state_dir);
  if (!catalog.ok()) return Fail(verb, catalog.status());
  Catalog& c = **catalog;
  if (verb == "ls") return Ls(c);
  if (verb == "show") return Show(c, names[0]);
  if (verb == "overlap") return ShowOverlap(c, names[0], names[1]);
  Status s = c.RemoveDataset(names[0]);
  if (!s.ok()) return Fail("rm", s);
  if (JsonOutput()) {
    PrintJson({{"removed", names[0]}});
    return 0;
  }
  fmt::print("removed \"{}\"\n", names[0]);
  return 0;
}

}  // namespace carpool::tools
