// `carpool bench load`: a bounded load and churn test of one server on this machine (issue 10).
// Up to --jobs `carpool consume` processes run at once on Fashion-MNIST and sets derived from it,
// with mixed batch sizes, step times and epochs; jobs keep joining, finishing, disconnecting
// mid-epoch (SIGTERM) and dying (SIGKILL). Every 10 s it samples the server: RSS, open fds,
// shared-memory segments, refcount_total and pins. At the end every job is gone, and the server
// must be back to its idle baseline: no job, no reference, no pin, no extra fd or segment.
#include <fmt/core.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "carpool/client.h"
#include "server/batch_pool.h"
#include "server/instance_name.h"
#include "tools/bench/bench.h"
#include "tools/bench/bench_e2e_procs.h"
#include "tools/cache_fraction.h"
#include "tools/options.h"

namespace carpool::tools {
namespace {

namespace fs = std::filesystem;
namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

constexpr std::string_view kUsage = R"(usage: carpool bench load [options]

A bounded load and churn test: a fresh server on a temporary state directory, and up to --jobs
`carpool consume` jobs at once on Fashion-MNIST (fm, 60,000) and sets derived from it (fm-a,
fm-b: 30,000 each, overlapping by 10,000; fm-s: 5,000), batch sizes 16-512, 1-20 ms per step and
1-3 epochs. Jobs keep joining; about half finish, a quarter disconnect mid-epoch (SIGTERM) and a
quarter are killed (SIGKILL). Every 10 s: the server's RSS, open fds, segments (the cache in
/dev/shm and each job's batch segment, a memfd among the fds), refcount_total and pins. At the
end: each finished job's rate against its fair share, the p50, p99 and max wait for a batch, the
failures, and whether the server is back to its idle baseline.
The cache is stated as a fraction of the prepared set (fm: 60,000 samples of 28x28 bytes), and
--cache-fraction sets it that way.
Exit status 1 on any failure or leak. docs/benchmarks.md ("Issue 10") shows a run.

options:
)";

// Fashion-MNIST's training set, prepared raw (28 x 28 x 1 bytes): every dataset of the run is a
// part of it, so it is the prepared set that --cache-fraction refers to.
constexpr PreparedSet kFmnistSet{60000, 28 * 28};

struct Options {
  double minutes = 10;
  bool quick = false;
  uint32_t jobs = 64;
  uint64_t seed = 1;
  uint32_t workers = 0;
  std::string cache_size = "512MiB", fmnist = "/usr/share/datasets/fashion-mnist", json_out;
  bool json = false;
};

enum class Fate { kFinish, kDisconnect, kKill };

struct Plan {
  std::string label, dataset;
  uint32_t batch = 32, step_ms = 1, epochs = 1;
  Fate fate = Fate::kFinish;
  double stop_at_s = 0;  // when a disconnect or kill happens (since the run began)
  double demand = 0;     // samples/s the job would take alone: batch / step
};

struct Live {
  Plan plan;
  pid_t pid = -1;
  double started = 0;
  bool signalled = false;
  bool cut = false;  // still running at the end: killed then, counted as cut_at_end
};

struct Sample {
  double t = 0;
  uint64_t rss_kib = 0, anon_kib = 0, fds = 0, segments = 0, jobs = 0, pins = 0;
  int64_t refcount_total = 0;
  uint64_t deliveries = 0;
  // Per-sample state: of the jobs present, with an entry (also cached samples no job uses), the
  // cache's entries, IDX files in memory.
  uint64_t samples_known = 0, sample_states = 0, cache_entries = 0, idx_files = 0;
};

struct Outcome {
  uint64_t finished = 0, disconnected = 0, killed = 0, cut_at_end = 0;
  std::vector<std::string> failures;
  struct Finished {
    Plan plan;
    double rate = 0, seconds = 0, started = 0, wait_p99 = 0;
  };
  std::vector<Finished> finished_jobs;  // their rates against their fair shares, job by job
  std::vector<double> wait_p50, wait_p99, wait_max;
};

uint64_t ProcStatusKib(pid_t pid, const std::string& key) {
  std::string text = ReadText(fmt::format("/proc/{}/status", pid));
  size_t at = text.find(key + ":");
  return at == std::string::npos ? 0 : std::stoull(text.substr(at + key.size() + 1));
}

uint64_t CountEntries(const fs::path& dir, const std::string& prefix = "") {
  uint64_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) ++n;
  }
  return n;
}

Sample Measure(pid_t server, const std::string& socket, double t) {
  Sample s;
  s.t = t;
  s.rss_kib = ProcStatusKib(server, "VmRSS");
  s.anon_kib = ProcStatusKib(server, "RssAnon");  // private memory: the cache's pages are shared
  s.fds = CountEntries(fmt::format("/proc/{}/fd", server));
  // The cache segment is named in /dev/shm; each job's batch segment is a memfd the server holds
  // (/proc/<pid>/fd: "/memfd:carpool-<instance>-job-<id>"), which fds counts as well.
  const std::string instance = InstanceNameForSocket(socket);
  s.segments = CountEntries("/dev/shm", "carpool-" + instance) +
               BatchPool::SegmentLinks(fmt::format("/proc/{}/fd", server), instance).size();
  Result<std::unique_ptr<Client>> client = Client::Connect(socket);
  if (!client.ok()) return s;
  Result<std::string> stats = (*client)->Stats();
  if (!stats.ok()) return s;
  const Json j = Json::parse(*stats, nullptr, false);
  if (j.is_discarded()) return s;
  s.jobs = j.value("jobs", Json::array()).size();
  s.pins = j.value("pins", uint64_t{0});
  s.refcount_total = j.value("refcount_total", int64_t{0});
  s.deliveries = j.value("deliveries", uint64_t{0});
  s.samples_known = j.value("samples_known", uint64_t{0});
  s.sample_states = j.value("sample_states", uint64_t{0});
  s.idx_files = j.value("idx_files", uint64_t{0});
  s.cache_entries = j.value("cache", Json::object()).value("entries", uint64_t{0});
  return s;
}

Plan Draw(std::mt19937_64& rng, uint64_t n, double duration_s, double now) {
  static const char* kSets[] = {"fm", "fm-a", "fm-b", "fm-s"};
  static const uint32_t kBatches[] = {16, 32, 64, 128, 256, 512};
  Plan p;
  p.label = fmt::format("job{:04}", n);
  const double u = std::uniform_real_distribution<double>(0, 1)(rng);
  p.fate = u < 0.5 ? Fate::kFinish : u < 0.75 ? Fate::kDisconnect : Fate::kKill;
  // Jobs meant to finish mostly read the small set, so that they do within the run.
  p.dataset = p.fate == Fate::kFinish && rng() % 4 != 0 ? "fm-s" : kSets[rng() % 4];
  p.batch = kBatches[rng() % 6];
  p.step_ms = 1 + static_cast<uint32_t>(rng() % 20);
  p.epochs = 1 + static_cast<uint32_t>(rng() % 3);
  p.demand = 1000.0 * p.batch / p.step_ms;
  const double life = std::uniform_real_distribution<double>(0.02, 0.3)(rng) * duration_s;
  p.stop_at_s = p.fate == Fate::kFinish ? 1e300 : now + life;
  return p;
}

void PrintSample(const Sample& s, const Sample& base, double rate) {
  fmt::print("t={:6.0f}s  jobs {:3}  RSS {:7.1f} MiB, private {:6.1f} ({:+.1f})  fds {:4} ({:+d})  "
             "segments {:3}  refcount_total {:7}  pins {:4}  samples {:6} (states {:6}, cached "
             "{:6}, idx {})  {:8.0f} samples/s\n",
             s.t, s.jobs, s.rss_kib / 1024.0, s.anon_kib / 1024.0,
             (static_cast<double>(s.anon_kib) - base.anon_kib) / 1024.0,
             s.fds, static_cast<int64_t>(s.fds) - static_cast<int64_t>(base.fds), s.segments,
             s.refcount_total, s.pins, s.samples_known, s.sample_states, s.cache_entries,
             s.idx_files, rate);
  std::fflush(stdout);
}

int Load(int argc, char** argv) {
  Options o;
  po::options_description opts;
  opts.add_options()("help,h", "show this help")(
      "minutes", po::value(&o.minutes), "how long jobs keep coming (default 10)")(
      "quick", po::bool_switch(&o.quick), "1 minute and 16 jobs at once (a smoke test)")(
      "jobs", po::value(&o.jobs), "jobs at once (default 64)")(
      "seed", po::value(&o.seed), "seed of the job mix (default 1)")(
      "workers", po::value(&o.workers), "server workers (default: cores)")(
      "cache-size", po::value(&o.cache_size), "server cache in bytes (default 512MiB)")(
      "cache-fraction", po::value<std::string>(),
      "server cache as a fraction F of the prepared set instead, 0 < F <= 4: room for F of "
      "Fashion-MNIST's 60,000 samples")(
      "fmnist", po::value(&o.fmnist), "Fashion-MNIST IDX folder")(
      "json", po::bool_switch(&o.json), "print the report as JSON")(
      "json-out", po::value(&o.json_out), "also write the JSON report to FILE");
  po::variables_map vm;
  if (auto rc = ParseCommandLine(argc, argv, "carpool bench load", kUsage, opts, &vm)) return *rc;
  if (o.quick) {
    if (!vm.count("minutes")) o.minutes = 1;
    if (!vm.count("jobs")) o.jobs = 16;
  }
  if (o.minutes <= 0 || o.jobs == 0) {
    fmt::print(stderr, "carpool bench load: --minutes and --jobs must be positive\n");
    return 2;
  }
  std::optional<std::string> fraction, size;
  if (vm.count("cache-fraction")) fraction = vm["cache-fraction"].as<std::string>();
  if (vm.count("cache-size") || !fraction) size = o.cache_size;
  Result<std::vector<CacheChoice>> caches =
      ChooseCaches(fraction, size, kFmnistSet, /*default_fractions=*/{});
  if (!caches.ok()) {
    fmt::print(stderr, "carpool bench load: {}\n", caches.status().message());
    return 2;
  }
  const CacheChoice cache = caches->front();
  const fs::path images = fs::path(o.fmnist) / "train-images-idx3-ubyte.gz";
  const fs::path labels = fs::path(o.fmnist) / "train-labels-idx1-ubyte.gz";
  if (!fs::exists(images) || !fs::exists(labels)) {
    fmt::print(stderr, "carpool bench load: no Fashion-MNIST at \"{}\" (train-*-ubyte.gz); run "
                       "scripts/setup.sh or pass --fmnist DIR\n", o.fmnist);
    return 2;
  }
  Result<std::string> self = SelfExe();
  if (!self.ok()) return fmt::print(stderr, "carpool bench load: {}\n", self.status().message()), 1;
  char tmpl[] = "/tmp/carpool-load-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return fmt::print(stderr, "carpool bench load: mkdtemp failed\n"), 1;
  const fs::path dir = tmpl, state = dir / "state", logs = dir / "logs";
  fs::create_directories(logs);
  const std::string socket = (state / "carpool.sock").string();
  auto run_cli = [&](std::vector<std::string> args, const std::string& label) -> bool {
    args.insert(args.begin(), *self);
    Result<std::vector<FinishedProcess>> r =
        RunScheduled({{label, std::move(args), 0}}, logs, -1, std::chrono::seconds(300));
    if (!r.ok()) fmt::print(stderr, "carpool bench load: {}\n", r.status().message());
    return r.ok();
  };
  const std::string sd = state.string();
  if (!run_cli({"dataset", "add", "fm", "--idx", images.string(), labels.string(), "--state-dir",
                sd, "-q"}, "add-fm") ||
      !run_cli({"dataset", "add", "fm-a", "--from", "fm", "--ids", "1:30001", "--state-dir", sd,
                "-q"}, "add-a") ||
      !run_cli({"dataset", "add", "fm-b", "--from", "fm", "--ids", "20001:50001", "--state-dir",
                sd, "-q"}, "add-b") ||
      !run_cli({"dataset", "add", "fm-s", "--from", "fm", "--ids", "50001:55001", "--state-dir",
                sd, "-q"}, "add-s")) {
    return 1;
  }
  // Room above --jobs: a job that just exited may still hold its place until the server has
  // handled its connection's close.
  std::vector<std::string> server_argv = {*self,      "server",
                                          "--state-dir", sd,
                                          "--lease",     "2s",
                                          "--cache-size", cache.server_flag(),
                                          "--max-jobs",  std::to_string(o.jobs + 16)};
  if (o.workers > 0) {
    server_argv.insert(server_argv.end(), {"--workers", std::to_string(o.workers)});
  }
  Result<pid_t> server = SpawnProcess(server_argv, logs / "server.out", logs / "server.err");
  if (!server.ok()) return fmt::print(stderr, "carpool bench load: {}\n", server.status().message()), 1;
  for (int i = 0; i < 200 && !Client::Connect(socket).ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const auto begin = Clock::now();
  auto now_s = [&] { return std::chrono::duration<double>(Clock::now() - begin).count(); };
  const Sample base = Measure(*server, socket, 0);
  const double duration = o.minutes * 60;
  fmt::print("carpool bench load: {} jobs at once for {:.0f} s, server pid {}, {} (logs {})\n"
             "  {}; {}\n",
             o.jobs, duration, *server, sd, logs.string(), DescribeCache(cache),
             DescribePreparedSet(kFmnistSet));
  PrintSample(base, base, 0);

  std::mt19937_64 rng(o.seed);
  std::map<pid_t, Live> live;
  std::vector<Sample> samples = {base};
  Outcome out;
  uint64_t spawned = 0, active_sum = 0, active_n = 0;
  double next_sample = 10;
  bool server_died = false;
  while (true) {
    const double t = now_s();
    const bool spawning = t < duration;
    // Reap.
    for (auto it = live.begin(); it != live.end();) {
      int status = 0;
      pid_t r = waitpid(it->first, &status, WNOHANG);
      if (r != it->first) {
        ++it;
        continue;
      }
      const Live& j = it->second;
      const fs::path out_file = logs / (j.plan.label + ".out");
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        ++out.finished;
        const std::string text = ReadText(out_file);
        std::optional<double> rate = JsonNumber(text, "samples_per_s");
        if (rate) {
          out.finished_jobs.push_back({j.plan, *rate, JsonNumber(text, "seconds").value_or(0),
                                       j.started, JsonNumber(text, "wait_ms_p99").value_or(0)});
        }
        for (auto [key, vec] : {std::pair{"wait_ms_p50", &out.wait_p50},
                                {"wait_ms_p99", &out.wait_p99}, {"wait_ms_max", &out.wait_max}}) {
          if (std::optional<double> v = JsonNumber(text, key)) vec->push_back(*v);
        }
      } else if (j.cut) {
        // counted when it was cut
      } else if (j.signalled && WIFSIGNALED(status)) {
        (WTERMSIG(status) == SIGKILL ? out.killed : out.disconnected) += 1;
      } else if (j.signalled) {  // a SIGTERM'd consume may exit 1 with its own message
        ++out.disconnected;
      } else {
        out.failures.push_back(fmt::format("{} ({} batch {} epochs {}) exited with status {}: {}",
                                           j.plan.label, j.plan.dataset, j.plan.batch,
                                           j.plan.epochs, status,
                                           FileTail(logs / (j.plan.label + ".err"), 3)));
      }
      it = live.erase(it);
    }
    if (!ChildRunning(*server)) {
      server_died = true;
      out.failures.push_back("the server exited: " + FileTail(logs / "server.err", 5));
      break;
    }
    // Churn: disconnects and kills that are due.
    for (auto& [pid, j] : live) {
      if (!j.signalled && t >= j.plan.stop_at_s) {
        kill(pid, j.plan.fate == Fate::kKill ? SIGKILL : SIGTERM);
        j.signalled = true;
      }
    }
    // New jobs.
    while (spawning && live.size() < o.jobs) {
      Plan p = Draw(rng, spawned++, duration, t);
      std::vector<std::string> argv = {*self, "consume", "--state-dir", sd, "--dataset", p.dataset,
                                       "--batch-size", std::to_string(p.batch), "--epochs",
                                       std::to_string(p.epochs), "--step-ms",
                                       std::to_string(p.step_ms), "--json"};
      Result<pid_t> pid = SpawnProcess(argv, logs / (p.label + ".out"), logs / (p.label + ".err"));
      if (!pid.ok()) {
        out.failures.push_back(fmt::format("{}: {}", p.label, pid.status().message()));
        break;
      }
      live[*pid] = Live{p, *pid, t, false};
    }
    active_sum += live.size();
    ++active_n;
    if (t >= next_sample) {
      samples.push_back(Measure(*server, socket, t));
      const Sample& s = samples.back();
      const Sample& prev = samples[samples.size() - 2];
      PrintSample(s, base, (s.deliveries - prev.deliveries) / std::max(1e-9, s.t - prev.t));
      next_sample += 10;
    }
    if (!spawning) {
      // The end: jobs still running are cut (SIGKILL), then the server must clean up after them.
      for (auto& [pid, j] : live) {
        if (!j.signalled) {
          kill(pid, SIGKILL);
          j.signalled = j.cut = true;
          ++out.cut_at_end;
        }
      }
      if (live.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Back to idle: the lease (2 s) removes jobs whose clients died; allow it twice over.
  Sample final_sample;
  for (int i = 0; i < 100 && !server_died; ++i) {
    final_sample = Measure(*server, socket, now_s());
    if (final_sample.jobs == 0 && final_sample.refcount_total == 0 && final_sample.pins == 0 &&
        final_sample.segments <= base.segments && final_sample.fds <= base.fds &&
        final_sample.samples_known == 0 && final_sample.idx_files == 0 &&
        final_sample.sample_states <= final_sample.cache_entries) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!server_died) PrintSample(final_sample, base, 0);
  std::vector<std::string> leaks;
  if (!server_died) {
    if (final_sample.jobs != 0) leaks.push_back(fmt::format("{} jobs left", final_sample.jobs));
    if (final_sample.refcount_total != 0) {
      leaks.push_back(fmt::format("refcount_total {}", final_sample.refcount_total));
    }
    if (final_sample.pins != 0) leaks.push_back(fmt::format("{} pins", final_sample.pins));
    if (final_sample.fds > base.fds) {
      leaks.push_back(fmt::format("{} fds (idle {})", final_sample.fds, base.fds));
    }
    if (final_sample.segments > base.segments) {
      leaks.push_back(fmt::format("{} segments (idle {})", final_sample.segments, base.segments));
    }
    // What no job uses is released; only the shapes of samples still cached may stay.
    if (final_sample.samples_known != 0 || final_sample.idx_files != 0 ||
        final_sample.sample_states > final_sample.cache_entries) {
      leaks.push_back(fmt::format(
          "per-sample state: {} samples known, {} states for {} cached samples, {} IDX files",
          final_sample.samples_known, final_sample.sample_states, final_sample.cache_entries,
          final_sample.idx_files));
    }
  }
  Result<double> stopped = StopProcess(*server, "server", std::chrono::seconds(10));
  if (!stopped.ok() && !server_died) out.failures.push_back(stopped.status().message());

  // A finished job's fair share: its demand, or an equal share of what the server delivered,
  // whichever is smaller.
  const double total_rate =
      samples.size() > 1 ? (samples.back().deliveries - base.deliveries) /
                               std::max(1e-9, samples.back().t) : 0;
  const double mean_active = active_n ? static_cast<double>(active_sum) / active_n : 1;
  const double equal_share = total_rate / std::max(1.0, mean_active);
  std::vector<double> vs_fair;
  Json per_job = Json::array();
  for (const Outcome::Finished& f : out.finished_jobs) {
    vs_fair.push_back(f.rate / std::max(1e-9, std::min(f.plan.demand, equal_share)));
    per_job.push_back({{"job", f.plan.label}, {"dataset", f.plan.dataset},
                       {"batch", f.plan.batch}, {"step_ms", f.plan.step_ms},
                       {"epochs", f.plan.epochs}, {"started_s", f.started},
                       {"seconds", f.seconds}, {"samples_per_s", f.rate},
                       {"demand", f.plan.demand}, {"vs_fair_share", vs_fair.back()},
                       {"wait_ms_p99", f.wait_p99}});
  }
  const uint64_t through = out.finished + out.disconnected + out.killed + out.cut_at_end;
  Json report = {
      {"seconds", now_s()}, {"jobs_at_once", o.jobs}, {"cache", CacheJson(cache)},
      {"prepared_set_bytes", kFmnistSet.bytes()}, {"jobs_through", through},
      {"finished", out.finished}, {"disconnected", out.disconnected}, {"killed", out.killed},
      {"cut_at_end", out.cut_at_end}, {"failures", out.failures}, {"leaks", leaks},
      {"rss_mib_idle", base.rss_kib / 1024.0},
      {"rss_mib_max", std::max_element(samples.begin(), samples.end(),
                                       [](const Sample& a, const Sample& b) {
                                         return a.rss_kib < b.rss_kib;
                                       })->rss_kib / 1024.0},
      {"rss_mib_end", final_sample.rss_kib / 1024.0},
      {"private_mib_idle", base.anon_kib / 1024.0},
      {"private_mib_max", std::max_element(samples.begin(), samples.end(),
                                           [](const Sample& a, const Sample& b) {
                                             return a.anon_kib < b.anon_kib;
                                           })->anon_kib / 1024.0},
      {"private_mib_end", final_sample.anon_kib / 1024.0},
      {"samples_known_end", final_sample.samples_known},
      {"sample_states_end", final_sample.sample_states},
      {"idx_files_end", final_sample.idx_files},
      {"server_samples_per_s", total_rate}, {"mean_jobs_at_once", mean_active},
      {"equal_share_samples_per_s", equal_share},
      {"finished_rate_vs_fair_share_p10", Quantile(vs_fair, 0.1)},
      {"finished_rate_vs_fair_share_median", Quantile(vs_fair, 0.5)},
      {"wait_ms_p50", Quantile(out.wait_p50, 0.5)}, {"wait_ms_p99", Quantile(out.wait_p99, 0.99)},
      {"wait_ms_max", out.wait_max.empty() ? 0.0 : *std::max_element(out.wait_max.begin(),
                                                                      out.wait_max.end())},
      {"finished_jobs", per_job}};
  if (!o.json_out.empty()) {
    std::FILE* f = std::fopen(o.json_out.c_str(), "w");
    if (f != nullptr) {
      fmt::print(f, "{}\n", report.dump(1));
      std::fclose(f);
    }
  }
  if (o.json) {
    fmt::print("{}\n", report.dump());
  } else {
    fmt::print(
        "{}\n"
        "jobs through {} ({} finished, {} disconnected mid-epoch, {} killed, {} cut at the end); "
        "server {:.0f} samples/s for {:.1f} jobs at once on average (an equal share {:.0f})\n"
        "finished jobs' rate / fair share (min(batch / step, equal share)): p10 {:.2f}, median "
        "{:.2f}\n"
        "wait for a batch over finished jobs: p50 {:.1f} ms, p99 {:.1f} ms, max {:.1f} ms\n"
        "server RSS (with the cache's shared pages): idle {:.1f} MiB, max {:.1f}, end {:.1f}; "
        "private: idle {:.1f}, max {:.1f}, end {:.1f}\n",
        DescribeCache(cache), through, out.finished, out.disconnected, out.killed,
        out.cut_at_end, total_rate, mean_active, equal_share,
        report["finished_rate_vs_fair_share_p10"].get<double>(),
        report["finished_rate_vs_fair_share_median"].get<double>(),
        report["wait_ms_p50"].get<double>(), report["wait_ms_p99"].get<double>(),
        report["wait_ms_max"].get<double>(), base.rss_kib / 1024.0,
        report["rss_mib_max"].get<double>(), final_sample.rss_kib / 1024.0,
        base.anon_kib / 1024.0, report["private_mib_max"].get<double>(),
        final_sample.anon_kib / 1024.0);
    for (const std::string& f : out.failures) fmt::print("FAILURE: {}\n", f);
    for (const std::string& l : leaks) fmt::print("LEAK: {}\n", l);
    fmt::print("{}\n", out.failures.empty() && leaks.empty()
                           ? "back to the idle baseline, no failure"
                           : "NOT clean: see above");
  }
  std::error_code ec;
  if (out.failures.empty() && leaks.empty()) fs::remove_all(dir, ec);
  return out.failures.empty() && leaks.empty() ? 0 : 1;
}

}  // namespace

// `carpool bench load` (tools/bench/bench_e2e_cmd.cc dispatches here).
int BenchLoad(int argc, char** argv) { return Load(argc, argv); }

}  // namespace carpool::tools
