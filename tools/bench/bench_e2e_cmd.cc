// `carpool bench`: end-to-end benchmarks. `carpool bench e2e` runs training-job scenarios against
// carpool and against the standalone baseline in the same run (tools/bench/bench_e2e.h) and prints
// the tables of docs/benchmarks.md; `carpool bench standalone` is one baseline job (one process),
// which bench e2e spawns per job so that the kernel accounts each job's CPU. RunBench dispatches
// the verbs (tools/bench/bench.h); tools/bench_cmd.cc registers it as the `bench` command.
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "datasets/state_dir.h"
#include "tools/bench/bench.h"
#include "tools/bench/bench_e2e.h"
#include "tools/bench/bench_e2e_data.h"
#include "tools/bench/bench_e2e_procs.h"
#include "tools/bench/bench_e2e_report.h"
#include "tools/bench/standalone_loader.h"
#include "tools/cache_fraction.h"
#include "tools/options.h"

namespace carpool::tools {

namespace {

namespace po = boost::program_options;

constexpr std::string_view kUsage = R"(usage: carpool bench <e2e|standalone|load|control> [options]

  e2e         scenarios of training jobs, carpool against one standalone loader per job
  standalone  one baseline job: its own loader threads, shuffle, decode and transform
  load        64 jobs at once joining, finishing, disconnecting and dying for 10 minutes
  control     status and removal latency while ImageNet-sized joins are in flight

'carpool bench e2e --help' (standalone, load, control) lists the options.
)";

constexpr std::string_view kDefaultTransform = "random_crop(224)|flip|normalize(imagenet)";
constexpr std::string_view kDefaultPrepare = "resize=256,crop=256";
constexpr std::string_view kAllScenarios = "sync1,sync2,sync4,stagger,speeds,overlap";
// Without --cache-fraction or --cache-size: every scenario with a cache that holds the whole
// prepared set, and again with one that holds a tenth of it, where evictions limit sharing.
const std::vector<double> kDefaultCacheFractions = {1.0, 0.1};

int Fail(std::string_view verb, const Status& s) {
  fmt::print(stderr, "carpool bench {}: {}\n", verb, s.ToString());
  return 1;
}

// Parses argv; prints help (returns 0) or a usage error (returns 2), else nullopt.
std::optional<int> Parse(std::string_view verb, int argc, char** argv,
                         const po::options_description& opts, po::variables_map* vm) {
  return ParseCommandLine(argc, argv, fmt::format("carpool bench {}", verb),
                          fmt::format("usage: carpool bench {} [options]\n\n", verb), opts, vm);
}

int Standalone(int argc, char** argv) {
  std::string dataset, state_dir, transform;
  StandaloneOptions o;
  uint32_t step_ms = 0;
  po::options_description opts("options");
  opts.add_options()("help,h", "show this help")("dataset", po::value(&dataset)->required(),
                                                 "a registered dataset")(
      "state-dir", po::value(&state_dir), "catalog location")(
      "workers", po::value(&o.workers)->default_value(1), "loader threads of this job")(
      "batch-size", po::value(&o.batch_size)->default_value(32), "samples per batch")(
      "epochs", po::value(&o.epochs)->default_value(1), "epochs")(
      "transform", po::value(&transform), "per-job transform, as for carpool consume")(
      "prefetch", po::value(&o.prefetch)->default_value(4), "batches built ahead")(
      "seed", po::value(&o.seed)->default_value(0), "shuffle and transform seed")(
      "step-ms", po::value(&step_ms)->default_value(0),
      "sleep per batch, standing in for training")("drop-last", po::bool_switch(&o.drop_last),
                                                   "drop each epoch's partial batch")(
      "json", "print a JSON summary");
  po::variables_map vm;
  if (std::optional<int> rc = Parse("standalone", argc, argv, opts, &vm)) return *rc;
  Result<std::filesystem::path> dir = ResolveStateDir(state_dir);
  if (!dir.ok()) return Fail("standalone", dir.status());
  Result<std::unique_ptr<Catalog>> catalog = Catalog::Open(*dir);
  if (!catalog.ok()) return Fail("standalone", catalog.status());
  Result<DatasetInfo> info = (*catalog)->GetDataset(dataset);
  if (!info.ok()) return Fail("standalone", info.status());
  Result<std::vector<SampleRecord>> samples = (*catalog)->GetSamples(info->ids);
  if (!samples.ok()) return Fail("standalone", samples.status());
  Result<PrepareSpec> prepare = ParsePrepareSpec(info->prepare_spec);
  if (!prepare.ok()) return Fail("standalone", prepare.status());
  Result<TransformSpec> tf = ParseTransformSpec(transform);
  if (!tf.ok()) return Fail("standalone", tf.status());
  o.samples = std::move(*samples);
  o.prepare = *prepare;
  o.transform = *tf;
  const uint32_t workers = o.workers;

  const auto start = std::chrono::steady_clock::now();
  Result<std::unique_ptr<StandaloneLoader>> loader = StandaloneLoader::Start(std::move(o));
  if (!loader.ok()) return Fail("standalone", loader.status());
  uint64_t batches = 0, delivered = 0;
  for (;;) {
    Result<std::optional<StandaloneBatch>> batch = (*loader)->Next();
    if (!batch.ok()) return Fail("standalone", batch.status());
    if (!batch->has_value()) break;
    ++batches;
    delivered += (*batch)->sample_ids.size();
    batch->reset();
    if (step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double rate = seconds > 0 ? delivered / seconds : 0.0;
  if (vm.count("json")) {
    const nlohmann::ordered_json summary = {{"batches", batches},
                                            {"samples", delivered},
                                            {"seconds", seconds},
                                            {"samples_per_s", rate},
                                            {"preparations", (*loader)->preparations()},
                                            {"workers", workers}};
    fmt::print("{}\n", summary.dump());
  } else {
    fmt::print("standalone: {} batches, {} samples in {:.2f} s ({:.0f} samples/s), {} workers\n",
               batches, delivered, seconds, rate, workers);
  }
  return 0;
}

struct E2eArgs {
  bool quick = false;
  uint64_t images = 5000;
  std::string dir;
  uint32_t workers = 4;
  uint32_t step_ms = 20;
  uint32_t speeds_step_ms = 60;
  double stagger_s = 0;  // 0: a third of the N = 1 carpool job's time
  std::string scenarios{kAllScenarios};
  std::string prepare{kDefaultPrepare};
  std::optional<std::string> cache_size, cache_fraction;
  bool torchvision = false;
  std::string python = "/usr/bin/python3";
  std::string script;
  bool keep_logs = false;
  uint32_t repeat = 1;
  std::string json_out;
};

Result<std::string> FindScript(const std::string& flag, const std::string& exe) {
  if (!flag.empty()) return flag;
  const std::filesystem::path exe_dir = std::filesystem::path(exe).parent_path();
  for (const std::filesystem::path& p :
       {std::filesystem::current_path() / "bench", exe_dir / ".." / "bench",
        exe_dir / ".." / ".." / "bench", exe_dir / ".." / ".." / ".." / "bench"}) {
    if (std::filesystem::exists(p / "torchvision_jobs.py")) {
      return std::filesystem::weakly_canonical(p / "torchvision_jobs.py").string();
    }
  }
  return Status::NotFound(
      "bench/torchvision_jobs.py not found next to the build or in the current directory; "
      "pass --torchvision-script PATH");
}

// One scenario by name; `sync1` is the N = 1 result if it ran (it sets the stagger delay).
Result<E2eScenario> MakeScenario(const std::string& name, const E2eArgs& a, const E2eData& d,
                                 const E2eScenarioResult* sync1) {
  E2eScenario s;
  s.name = name;
  auto same = [&](size_t n) {
    for (size_t i = 0; i < n; ++i) s.jobs.push_back({kE2eDataset, 0, a.step_ms});
  };
  if (name == "sync1" || name == "sync2" || name == "sync4") {
    const size_t n = static_cast<size_t>(name[4] - '0');
    same(n);
    s.description =
        fmt::format("{} job(s) on {} ({} images), started together", n, kE2eDataset, d.images);
  } else if (name == "stagger") {
    double delay = a.stagger_s;
    if (delay <= 0) {
      delay = sync1 != nullptr && !sync1->carpool.jobs.empty()
                  ? (sync1->carpool.jobs[0].end_s - sync1->carpool.jobs[0].start_s) / 3
                  : 3.0;
    }
    same(2);
    s.jobs[1].start_s = delay;
    s.description = fmt::format("2 jobs on {}, the second started {:.1f} s after the first",
                                kE2eDataset, delay);
  } else if (name == "speeds") {
    s.jobs = {{kE2eDataset, 0, a.speeds_step_ms}, {kE2eDataset, 0, 2 * a.speeds_step_ms}};
    s.description =
        fmt::format("2 jobs on {}, together, training {} and {} ms per batch (speeds 2:1)",
                    kE2eDataset, a.speeds_step_ms, 2 * a.speeds_step_ms);
  } else if (name == "overlap") {
    s.jobs = {{kE2eOverlapA, 0, a.step_ms}, {kE2eOverlapB, 0, a.step_ms}};
    s.description = fmt::format("2 jobs, on {} and {} ({} images each, {} in common), together",
                                kE2eOverlapA, kE2eOverlapB, d.overlap_size, d.overlap_common);
  } else {
    return Status::InvalidArgument(fmt::format(
        "unknown scenario \"{}\"; expected a comma-separated list of {}", name, kAllScenarios));
  }
  return s;
}

std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// Each scenario at each cache: a row per (scenario, cache), the caches in the given order. The
// baseline has no cache: it runs in a scenario's first row only, and its other rows reuse it.
Result<std::vector<E2eScenarioResult>> RunScenarios(const E2eArgs& a, const E2eSetup& setup,
                                                    const E2eData& data,
                                                    const std::vector<std::string>& names,
                                                    const std::vector<CacheChoice>& caches,
                                                    bool verbose) {
  std::vector<E2eScenarioResult> results;
  for (const std::string& name : names) {
    const E2eScenarioResult* sync1 = nullptr;
    for (const E2eScenarioResult& r : results) {
      if (r.scenario.name == "sync1" && sync1 == nullptr) sync1 = &r;
    }
    Result<E2eScenario> scenario = MakeScenario(name, a, data, sync1);
    if (!scenario.ok()) return scenario.status();
    if (verbose) fmt::print(stderr, "scenario {}: {}\n", name, scenario->description);
    const size_t first_row = results.size();
    for (size_t c = 0; c < caches.size(); ++c) {
      E2eSetup at = setup;
      at.cache_size = caches[c].server_flag();
      if (c > 0) {  // its own logs and sockets, so --keep-logs keeps every cache's
        at.log_dir = setup.log_dir / fmt::format("cache-{}", c);
        std::filesystem::create_directories(at.log_dir);
      }
      if (verbose) fmt::print(stderr, "  {}\n", DescribeCache(caches[c]));
      // Best of --repeat runs per side (the run least disturbed by other load), alternating the
      // sides so that both meet the same conditions.
      E2eScenarioResult best{*scenario, caches[c], {}, {}, c > 0};
      for (uint32_t r = 0; r < a.repeat; ++r) {
        Result<E2eSideResult> carpool = RunCarpoolSide(at, *scenario);
        if (!carpool.ok()) return carpool.status();
        Result<E2eSideResult> baseline = E2eSideResult{};
        if (c == 0) baseline = RunBaselineSide(at, *scenario);
        if (!baseline.ok()) return baseline.status();
        if (verbose && c == 0) {
          fmt::print(stderr, "    carpool {:.0f} samples/s, baseline {:.0f} samples/s\n",
                     carpool->rate(), baseline->rate());
        } else if (verbose) {
          fmt::print(stderr, "    carpool {:.0f} samples/s\n", carpool->rate());
        }
        if (carpool->rate() > best.carpool.rate()) best.carpool = std::move(*carpool);
        if (baseline->rate() > best.baseline.rate()) best.baseline = std::move(*baseline);
      }
      if (c > 0) best.baseline = results[first_row].baseline;
      results.push_back(std::move(best));
    }
  }
  return results;
}

int E2e(int argc, char** argv) {
  E2eArgs a;
  E2eSetup setup;
  setup.transform = kDefaultTransform;
  po::options_description opts("options");
  opts.add_options()("help,h", "show this help")("json", "print the results as JSON")(
      "quick", "smoke test: 300 images, batch 16, short steps (a few seconds a scenario)")(
      "images", po::value(&a.images), "synthetic 500x375 JPEGs (default 5000)")(
      "dir", po::value(&a.dir), "data cache folder (default ~/.cache/carpool/bench-e2e)")(
      "workers", po::value(&a.workers), "server workers = baseline threads in total (default 4)")(
      "step-ms", po::value(&a.step_ms), "simulated training per batch (default 20)")(
      "speeds-step-ms", po::value(&a.speeds_step_ms),
      "speeds scenario: the fast job's step; the slow one's is twice (default 60)")(
      "stagger-s", po::value(&a.stagger_s),
      "stagger scenario: the second job's delay (default: a third of the N = 1 job's time)")(
      "epochs", po::value(&setup.epochs), "epochs per job (default 1)")(
      "batch-size", po::value(&setup.batch_size), "samples per batch (default 32)")(
      "prefetch", po::value(&setup.prefetch), "batches prefetched per job (default 4)")(
      "scenarios", po::value(&a.scenarios),
      "comma-separated subset of the default "
      "sync1,sync2,sync4,stagger,speeds,overlap")(
      "prepare", po::value(&a.prepare), "the dataset's prepare spec (default resize=256,crop=256)")(
      "transform", po::value(&setup.transform),
      "per-job transform (default random_crop(224)|flip|normalize(imagenet))")(
      "cache-fraction", po::value<std::string>(),
      "server cache as a fraction F of the prepared set, 0 < F <= 4: room for F of its samples "
      "at 5/4 of a prepared sample's bytes each (default: each scenario at 1 and at 0.1)")(
      "cache-size", po::value<std::string>(),
      "server cache in bytes, e.g. 2GiB, instead of --cache-fraction")(
      "follow", po::value(&setup.follow),
      "the server's --follow: on (default) | off, for comparison")(
      "torchvision", po::bool_switch(&a.torchvision),
      "also run bench/torchvision_jobs.py for N = 1 and 4")(
      "python", po::value(&a.python), "interpreter with torch (default /usr/bin/python3)")(
      "torchvision-script", po::value(&a.script), "path of bench/torchvision_jobs.py")(
      "repeat", po::value(&a.repeat),
      "runs per scenario and side; the best is reported (default 1)")(
      "json-out", po::value(&a.json_out), "also write the JSON to this file")(
      "keep-logs", po::bool_switch(&a.keep_logs), "keep the per-process logs");
  po::variables_map vm;
  if (std::optional<int> rc = Parse("e2e", argc, argv, opts, &vm)) return *rc;
  if (vm.count("quick")) {
    a.quick = true;
    if (!vm.count("images")) a.images = 300;
    if (!vm.count("batch-size")) setup.batch_size = 16;
    if (!vm.count("step-ms")) a.step_ms = 5;
    if (!vm.count("speeds-step-ms")) a.speeds_step_ms = 15;
  }
  if (a.images < 3 || a.workers == 0 || setup.batch_size == 0 || setup.epochs == 0 ||
      a.repeat == 0) {
    fmt::print(stderr,
               "carpool bench e2e: need --images >= 3 and --workers, --batch-size, "
               "--epochs, --repeat >= 1\n");
    return 2;
  }
  const std::vector<std::string> known = SplitCommas(std::string(kAllScenarios));
  const std::vector<std::string> scenario_names = SplitCommas(a.scenarios);
  for (const std::string& name : scenario_names) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      fmt::print(stderr,
                 "carpool bench e2e: unknown scenario \"{}\"; --scenarios takes a "
                 "comma-separated subset of {}\n",
                 name, kAllScenarios);
      return 2;
    }
  }
  if (scenario_names.empty()) {
    fmt::print(stderr, "carpool bench e2e: --scenarios is empty; pick from {}\n", kAllScenarios);
    return 2;
  }
  const auto run_start = std::chrono::steady_clock::now();
  E2eRunInfo info;
  info.load_before = LoadAverages();
  Result<std::string> exe = SelfExe();
  if (!exe.ok()) return Fail("e2e", exe.status());
  setup.exe = *exe;
  setup.workers = a.workers;
  Result<PrepareSpec> prepare = ParsePrepareSpec(a.prepare);
  if (!prepare.ok()) return Fail("e2e", prepare.status());
  if (Result<TransformSpec> tf = ParseTransformSpec(setup.transform); !tf.ok()) {
    return Fail("e2e", tf.status());
  }
  if (vm.count("cache-size")) a.cache_size = vm["cache-size"].as<std::string>();
  if (const Result<bool> follow = ParseOnOff("follow", setup.follow); !follow.ok()) {
    fmt::print(stderr, "carpool bench e2e: {}\n", follow.status().message());
    return 2;
  }
  if (vm.count("cache-fraction")) a.cache_fraction = vm["cache-fraction"].as<std::string>();
  // Every scenario reads (a part of) the e2e dataset; without a crop, a side of 512 stands in.
  const uint64_t side = prepare->crop > 0 ? prepare->crop : 512;
  const PreparedSet prepared{a.images, side * side * static_cast<uint64_t>(prepare->channels)};
  Result<std::vector<CacheChoice>> caches =
      ChooseCaches(a.cache_fraction, a.cache_size, prepared, kDefaultCacheFractions);
  if (!caches.ok()) {
    fmt::print(stderr, "carpool bench e2e: {}\n", caches.status().message());
    return 2;
  }
  Result<std::string> script = Status::NotFound("");
  if (a.torchvision) {
    script = FindScript(a.script, setup.exe);
    if (!script.ok()) return Fail("e2e", script.status());
  }

  setup.log_dir = std::filesystem::temp_directory_path() / fmt::format("carpool-e2e-{}", getpid());
  std::filesystem::create_directories(setup.log_dir);
  auto fail = [&](const Status& s) {
    fmt::print(stderr, "carpool bench e2e: logs kept in {}\n", setup.log_dir.string());
    return Fail("e2e", s);
  };
  const std::filesystem::path data_dir =
      a.dir.empty() ? DefaultE2eDir() : std::filesystem::path(a.dir);
  if (!vm.count("json"))
    fmt::print(stderr, "preparing {} images in {}...\n", a.images, data_dir.string());
  Result<E2eData> data = PrepareE2eData(setup.exe, data_dir, a.images, a.prepare, setup.log_dir);
  if (!data.ok()) return fail(data.status());
  setup.state_dir = data->state_dir;

  Result<std::vector<E2eScenarioResult>> results =
      RunScenarios(a, setup, *data, scenario_names, *caches, !vm.count("json"));
  if (!results.ok()) return fail(results.status());
  std::vector<E2eTorchResult> torch;
  if (a.torchvision) {
    for (size_t n : {size_t{1}, size_t{4}}) {
      if (!vm.count("json")) fmt::print(stderr, "torchvision: {} job(s)\n", n);
      Result<E2eTorchResult> t =
          RunTorchvision(setup, a.python, *script, data->image_dir, n, a.step_ms);
      if (!t.ok()) return fail(t.status());
      torch.push_back(std::move(*t));
    }
  }

  info.images = a.images;
  info.data_dir = data->image_dir.string();
  info.prepare = prepare->ToString();
  info.transform = setup.transform;
  info.batch_size = setup.batch_size;
  info.epochs = setup.epochs;
  info.prefetch = setup.prefetch;
  info.workers = setup.workers;
  info.step_ms = a.step_ms;
  info.repeat = a.repeat;
  info.prepared = prepared;
  info.caches = *caches;
  info.load_after = LoadAverages();
  info.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  const std::string json = E2eJson(info, *results, torch);
  if (!a.json_out.empty()) {
    std::ofstream out(a.json_out);
    out << json << "\n";
    if (!out)
      return fail(Status::IOError(fmt::format("cannot write --json-out \"{}\"", a.json_out)));
  }
  if (vm.count("json")) {
    fmt::print("{}\n", json);
  } else {
    PrintE2eTables(info, *results, torch);
  }
  if (!a.keep_logs) {
    std::error_code ec;
    std::filesystem::remove_all(setup.log_dir, ec);
  }
  return 0;
}

}  // namespace

int RunBench(int argc, char** argv) {
  const std::string_view verb = argc >= 2 ? argv[1] : "";
  if (verb == "e2e") return E2e(argc - 1, argv + 1);
  if (verb == "standalone") return Standalone(argc - 1, argv + 1);
  if (verb == "load") return BenchLoad(argc - 1, argv + 1);
  if (verb == "control") return BenchControl(argc - 1, argv + 1);
  if (verb == "--help" || verb == "-h" || verb == "help") {
    fmt::print("{}", kUsage);
    return 0;
  }
  fmt::print(stderr, "carpool bench: unknown or missing subcommand \"{}\"\n{}", verb, kUsage);
  return 2;
}

}  // namespace carpool::tools
