// `carpool bench control`: how long `status` and a job's removal take while large joins are in
// flight (issue 21). It registers an ImageNet-sized dataset (1,281,167 samples as 1x1 IDX images)
// and a small one derived from it, starts a server, and probes it in two phases of equal length:
// idle, then with --joiners threads each joining the large dataset over and over. One thread asks
// for `status` on a fresh connection again and again; another removes small jobs made before the
// phase, evenly over it (a removal's time is from the goodbye until the server's jobs_removed
// counts it). It prints p50/p99/max of both in both phases and the ratio of the p99s.
#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "carpool/client.h"
#include "tools/bench/bench.h"
#include "tools/bench/bench_e2e_procs.h"
#include "tools/options.h"

namespace carpool::tools {
namespace {

namespace fs = std::filesystem;
namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

constexpr std::string_view kUsage = R"(usage: carpool bench control [options]

While --joiners threads each join a dataset of --samples samples over and over (1,281,167 by
default, ImageNet's size, as 1x1 IDX images), how long do `status` and a small job's removal take?
Two phases of --seconds each, idle and with the joins; in each, status is asked again and again
and --removals small jobs leave, evenly spread.
Prints p50, p99 and max for both, and p99 with joins over p99 idle. The goal (issue 21) is a p99
of at most 0.2 s with two joins in flight. docs/benchmarks.md shows a run.

Options)";

struct Options {
  uint32_t samples = 1281167;
  uint32_t joiners = 2;
  double seconds = 20;
  uint32_t workers = 2;
  uint32_t removals = 50;
  bool keep_logs = false;
  std::string json_out;
};

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// An IDX pair of n 1x1 images: the catalog and the server read every record's place, which is
// what a join of an ImageNet-sized dataset costs them.
void WriteIdx(const fs::path& images, const fs::path& labels, uint32_t n) {
  auto be32 = [](std::string& s, uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>(v >> shift));
  };
  std::string body(n, '\0');
  for (uint32_t i = 0; i < n; ++i) body[i] = static_cast<char>(i % 10);
  std::string head;
  be32(head, 0x803);
  be32(head, n);
  be32(head, 1);
  be32(head, 1);
  std::ofstream(images, std::ios::binary) << head << body;
  head.clear();
  be32(head, 0x801);
  be32(head, n);
  std::ofstream(labels, std::ios::binary) << head << body;
}

std::optional<uint64_t> JobsRemoved(Client& client) {
  Result<std::string> stats = client.Stats();
  if (!stats.ok()) return std::nullopt;
  std::optional<double> n = JsonNumber(*stats, "jobs_removed");
  if (!n) return std::nullopt;
  return static_cast<uint64_t>(*n);
}

struct Probes {
  std::vector<double> status_s, removal_s;
  uint64_t joins = 0;
  std::string error;
};

// A status on a fresh connection, as `carpool status` asks, until `until`.
void ProbeStatus(const std::string& socket, Clock::time_point until, Probes& out) {
  while (Clock::now() < until) {
    const auto t0 = Clock::now();
    Result<std::unique_ptr<Client>> c = Client::Connect(socket);
    if (!c.ok()) return void(out.error = c.status().ToString());
    Result<std::string> stats = (*c)->Stats();
    if (!stats.ok()) return void(out.error = stats.status().ToString());
    out.status_s.push_back(Since(t0));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

struct JobHandle {
  std::unique_ptr<Client> client;
  std::unique_ptr<Job> job;
};

// `n` small jobs that have each taken a batch: made before a phase, so that removing them is all
// the phase measures.
Result<std::vector<JobHandle>> MakeSmallJobs(const std::string& socket, uint32_t n) {
  std::vector<JobHandle> jobs;
  for (uint32_t i = 0; i < n; ++i) {
    Result<std::unique_ptr<Client>> c = Client::Connect(socket);
    if (!c.ok()) return c.status();
    Result<std::unique_ptr<Job>> job = (*c)->CreateJob(
        {.dataset = "small", .batch_size = 16, .epochs = 1000, .transform = "", .prefetch = 2,
         .silence_timeout = std::chrono::seconds(120)});
    if (!job.ok()) return job.status();
    Result<std::optional<Batch>> batch = (*job)->Next();
    if (!batch.ok()) return batch.status();
    jobs.push_back({std::move(*c), std::move(*job)});
  }
  return jobs;
}

// Removes the jobs evenly over [now, until): each from its goodbye until the server's
// jobs_removed counts it.
void ProbeRemovals(const std::string& socket, std::vector<JobHandle> jobs,
                   Clock::time_point until,
                   Probes& out) {
  Result<std::unique_ptr<Client>> watcher = Client::Connect(socket);
  if (!watcher.ok()) return void(out.error = watcher.status().ToString());
  const auto gap = (until - Clock::now()) / static_cast<int>(jobs.size() + 1);
  for (JobHandle& j : jobs) {
    std::this_thread::sleep_for(gap);
    std::optional<uint64_t> before = JobsRemoved(**watcher);
    if (!before) return void(out.error = "status has no jobs_removed");
    const auto t0 = Clock::now();
    j.job.reset();  // says bye
    while (true) {
      std::optional<uint64_t> now = JobsRemoved(**watcher);
      if (!now) return void(out.error = "status failed while waiting for a removal");
      if (*now > *before) break;
      if (Since(t0) > 60) return void(out.error = "a removal took over 60 s");
      // 5 ms apart: finer polling would itself load the engine's lock it measures.
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    out.removal_s.push_back(Since(t0));
  }
}

// Joins "big" over and over until `until`. Each new job replaces the joiner's previous one, whose
// removal (1.28M samples back to the table) then runs beside the next join, as when a sweep's
// trials end and start.
void Join(const std::string& socket, Clock::time_point until, std::atomic<uint64_t>& joins,
          std::string& error) {
  JobHandle last;
  while (Clock::now() < until) {
    Result<std::unique_ptr<Client>> c = Client::Connect(socket);
    if (!c.ok()) return void(error = c.status().ToString());
    Result<std::unique_ptr<Job>> job = (*c)->CreateJob(
        {.dataset = "big", .batch_size = 1024, .epochs = 1, .transform = "", .prefetch = 1,
         .silence_timeout = std::chrono::seconds(120)});
    if (!job.ok()) return void(error = job.status().ToString());
    ++joins;
    last = {std::move(*c), std::move(*job)};
  }
}

struct Phase {
  std::string name;
  Probes probes;
};

void PrintPhase(const Phase& p) {
  fmt::print("  {:<12} status p50 {:.4f} s p99 {:.4f} s max {:.4f} s ({} probes); removal p50 "
             "{:.4f} s p99 {:.4f} s max {:.4f} s ({}); joins done {}\n",
             p.name, Quantile(p.probes.status_s, 0.5), Quantile(p.probes.status_s, 0.99),
             Quantile(p.probes.status_s, 1.0), p.probes.status_s.size(),
             Quantile(p.probes.removal_s, 0.5), Quantile(p.probes.removal_s, 0.99),
             Quantile(p.probes.removal_s, 1.0), p.probes.removal_s.size(), p.probes.joins);
}

int Control(int argc, char** argv) {
  Options o;
  po::options_description opts;
  opts.add_options()("help,h", "show this help")(
      "samples", po::value(&o.samples), "samples of the joined dataset (default 1281167)")(
      "joiners", po::value(&o.joiners), "threads joining it at once (default 2)")(
      "seconds", po::value(&o.seconds), "length of each phase (default 20)")(
      "workers", po::value(&o.workers), "server workers (default 2)")(
      "removals", po::value(&o.removals), "small jobs removed per phase (default 50)")(
      "keep-logs", po::bool_switch(&o.keep_logs), "keep the server's log and the data")(
      "json-out", po::value(&o.json_out), "also write the results as JSON to FILE");
  po::variables_map vm;
  if (auto rc = ParseCommandLine(argc, argv, "carpool bench control", kUsage, opts, &vm)) return *rc;
  if (o.samples < 4096 || o.seconds <= 0 || o.removals == 0 || o.removals > 400) {
    fmt::print(stderr, "carpool bench control: --samples must be at least 4096, --seconds "
                       "positive and --removals 1..400 (got {}, {} and {})\n", o.samples,
               o.seconds, o.removals);
    return 2;
  }
  Result<std::string> self = SelfExe();
  if (!self.ok()) return fmt::print(stderr, "carpool bench control: {}\n", self.status().message()), 1;
  char tmpl[] = "/tmp/carpool-control-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return fmt::print(stderr, "carpool bench control: mkdtemp failed\n"), 1;
  const fs::path dir = tmpl, state = dir / "state", logs = dir / "logs";
  fs::create_directories(logs);
  const std::string sd = state.string(), socket = (state / "carpool.sock").string();
  fmt::print("carpool bench control: {} samples, {} joiners, {:.0f} s per phase (logs {})\n",
             o.samples, o.joiners, o.seconds, logs.string());
  WriteIdx(dir / "big-images", dir / "big-labels", o.samples);
  // One after the other: "small" is derived from "big".
  for (std::vector<std::string> args :
       {std::vector<std::string>{"add", "big", "--idx", (dir / "big-images").string(),
                                 (dir / "big-labels").string()},
        std::vector<std::string>{"add", "small", "--from", "big", "--ids", "1:2049"}}) {
    args.insert(args.begin(), {*self, "dataset"});
    args.insert(args.end(), {"--state-dir", sd, "-q"});
    Result<std::vector<FinishedProcess>> added =
        RunScheduled({{"add-" + args[3], args, 0}}, logs, -1, std::chrono::seconds(600));
    if (!added.ok()) {
      return fmt::print(stderr, "carpool bench control: {}\n", added.status().message()), 1;
    }
  }
  Result<pid_t> server = SpawnProcess(
      {*self, "server", "--state-dir", sd, "--workers", std::to_string(o.workers), "--lease", "10s",
       "--max-jobs", "1000"},
      logs / "server.out", logs / "server.err");
  if (!server.ok()) return fmt::print(stderr, "carpool bench control: {}\n", server.status().message()), 1;
  for (int i = 0; i < 200 && !Client::Connect(socket).ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  std::vector<Phase> phases = {{"idle", {}}, {"joining", {}}};
  std::string error;
  for (Phase& phase : phases) {
    Result<std::vector<JobHandle>> small = MakeSmallJobs(socket, o.removals);
    if (!small.ok()) {
      error = fmt::format("phase {}: a small job: {}", phase.name, small.status().ToString());
      break;
    }
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(o.seconds));
    std::atomic<uint64_t> joins{0};
    std::vector<std::string> join_errors(phase.name == "joining" ? o.joiners : 0);
    std::vector<std::thread> threads;
    for (std::string& e : join_errors) {
      threads.emplace_back([&, until] { Join(socket, until, joins, e); });
    }
    Probes removals;
    threads.emplace_back([&, until] { ProbeStatus(socket, until, phase.probes); });
    threads.emplace_back(
        [&, until] { ProbeRemovals(socket, std::move(*small), until, removals); });
    for (auto& t : threads) t.join();
    phase.probes.removal_s = std::move(removals.removal_s);
    if (!removals.error.empty()) phase.probes.error = removals.error;
    phase.probes.joins = joins;
    for (const std::string& e : join_errors) {
      if (!e.empty()) phase.probes.error = "a join failed: " + e;
    }
    PrintPhase(phase);
    if (!phase.probes.error.empty()) {
      error = fmt::format("phase {}: {}", phase.name, phase.probes.error);
      break;
    }
  }
  Result<double> stopped = StopProcess(*server, "server", std::chrono::seconds(30));
  if (!error.empty() || !stopped.ok()) {
    fmt::print(stderr, "carpool bench control: {}\n",
               error.empty() ? stopped.status().message() : error);
    return 1;
  }
  const Probes& idle = phases[0].probes;
  const Probes& joining = phases[1].probes;
  const double status_p99 = Quantile(joining.status_s, 0.99);
  const double removal_p99 = Quantile(joining.removal_s, 0.99);
  const bool met = status_p99 <= 0.2 && removal_p99 <= 0.2 && joining.joins >= o.joiners;
  fmt::print("  p99 with joins / idle: status {:.1f}x, removal {:.1f}x; goal p99 <= 0.2 s with "
             "{} joins in flight: {}\n",
             status_p99 / std::max(1e-6, Quantile(idle.status_s, 0.99)),
             removal_p99 / std::max(1e-6, Quantile(idle.removal_s, 0.99)), o.joiners,
             met ? "met" : "NOT met");
  if (!o.json_out.empty()) {
    nlohmann::ordered_json j;
    for (const Phase& p : phases) {
      j[p.name] = {{"status_p50_s", Quantile(p.probes.status_s, 0.5)},
                   {"status_p99_s", Quantile(p.probes.status_s, 0.99)},
                   {"status_max_s", Quantile(p.probes.status_s, 1.0)},
                   {"removal_p50_s", Quantile(p.probes.removal_s, 0.5)},
                   {"removal_p99_s", Quantile(p.probes.removal_s, 0.99)},
                   {"removal_max_s", Quantile(p.probes.removal_s, 1.0)},
                   {"probes", p.probes.status_s.size()},
                   {"joins", p.probes.joins}};
    }
    j["goal_met"] = met;
    std::ofstream(o.json_out) << j.dump(2) << "\n";
  }
  if (!o.keep_logs) fs::remove_all(dir);
  return 0;
}

}  // namespace

int BenchControl(int argc, char** argv) { return Control(argc, argv); }

}  // namespace carpool::tools
