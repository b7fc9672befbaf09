#include "tools/bench/bench_e2e.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>

#include "carpool/client.h"
#include "tools/bench/bench_e2e_procs.h"

namespace carpool::tools {
namespace {

using std::chrono::seconds;

constexpr seconds kRunTimeout{1800};
constexpr seconds kServerStartTimeout{30};
constexpr seconds kServerStopGrace{20};

std::vector<std::string> JobArgs(const E2eSetup& setup, const E2eJob& job, size_t i) {
  return {"--dataset",    job.dataset,
          "--batch-size", std::to_string(setup.batch_size),
          "--epochs",     std::to_string(setup.epochs),
          "--transform",  setup.transform,
          "--prefetch",   std::to_string(setup.prefetch),
          "--step-ms",    std::to_string(job.step_ms),
          "--seed",       std::to_string(i + 1),
          "--json"};
}

// Waits until the server answers on `socket`, or fails if it exits first.
Status WaitForServer(pid_t server, const std::string& socket, const std::filesystem::path& err) {
  const auto deadline = std::chrono::steady_clock::now() + kServerStartTimeout;
  for (;;) {
    if (!ChildRunning(server)) {
      return Status::Unavailable(
          fmt::format("carpool server exited at start: {}", FileTail(err, 3)));
    }
    if (Client::Connect(socket).ok()) return Status::OK();
    if (std::chrono::steady_clock::now() > deadline) {
      return Status::Unavailable(fmt::format("carpool server did not answer on {} within {} s",
                                             socket, kServerStartTimeout.count()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Fills the per-job results from the finished processes' JSON lines.
Status CollectJobs(const E2eScenario& scenario, const std::vector<FinishedProcess>& done,
                   E2eSideResult* side) {
  for (size_t i = 0; i < done.size(); ++i) {
    std::optional<double> samples = JsonNumber(done[i].stdout_text, "samples");
    if (!samples) {
      return Status::Internal(fmt::format("{} printed no \"samples\" in its JSON: \"{}\"",
                                          done[i].label, done[i].stdout_text));
    }
    E2eJobResult r;
    r.dataset = scenario.jobs[i].dataset;
    r.samples = static_cast<uint64_t>(*samples);
    r.start_s = done[i].start_s;
    r.end_s = done[i].end_s;
    r.cpu_s = done[i].cpu_s;
    side->cpu_s += r.cpu_s;
    if (std::optional<double> p = JsonNumber(done[i].stdout_text, "preparations")) {
      side->preparations += static_cast<uint64_t>(*p);
    }
    if (std::optional<double> t = JsonNumber(done[i].stdout_text, "workers")) {
      r.threads = static_cast<uint32_t>(*t);
    }
    side->jobs.push_back(std::move(r));
  }
  return Status::OK();
}

}  // namespace

uint64_t E2eSideResult::samples() const {
  uint64_t n = 0;
  for (const E2eJobResult& j : jobs) n += j.samples;
  return n;
}

double E2eSideResult::wall_s() const {
  if (jobs.empty()) return 0;
  double first = jobs[0].start_s, last = jobs[0].end_s;
  for (const E2eJobResult& j : jobs) {
    first = std::min(first, j.start_s);
    last = std::max(last, j.end_s);
  }
  return last - first;
}

double E2eSideResult::rate() const {
  const double w = wall_s();
  return w > 0 ? samples() / w : 0.0;
}

double E2eSideResult::cpu_per_sample() const { return samples() > 0 ? cpu_s / samples() : 0.0; }

double E2eSideResult::preps_per_delivery() const {
  return deliveries > 0 ? static_cast<double>(preparations) / deliveries : 0.0;
}

uint32_t BaselineWorkers(uint32_t total, size_t n, size_t i) {
  if (n == 0) return 0;
  const uint32_t share = static_cast<uint32_t>(total / n);
  const uint32_t extra = i < total % n ? 1 : 0;
  return std::max<uint32_t>(1, share + extra);
}

Result<E2eSideResult> RunCarpoolSide(const E2eSetup& setup, const E2eScenario& scenario) {
  const std::string prefix = scenario.name + "-carpool";
  const std::string socket = (setup.log_dir / (prefix + ".sock")).string();
  const std::filesystem::path server_out = setup.log_dir / (prefix + "-server.out");
  const std::filesystem::path server_err = setup.log_dir / (prefix + "-server.err");
  std::filesystem::remove(socket);
  Result<pid_t> server =
      SpawnProcess({setup.exe, "server", "--state-dir", setup.state_dir.string(), "--socket",
                    socket, "--workers", std::to_string(setup.workers), "--cache-size",
                    setup.cache_size, "--follow", setup.follow},
                   server_out, server_err);
  if (!server.ok()) return server.status();
  auto abandon = [&](Status s) -> Status {
    (void)StopProcess(*server, "carpool server", kServerStopGrace);
    return s;
  };
  if (Status s = WaitForServer(*server, socket, server_err); !s.ok()) return abandon(s);

  std::vector<ScheduledProcess> procs;
  for (size_t i = 0; i < scenario.jobs.size(); ++i) {
    ScheduledProcess p;
    p.label = fmt::format("{}-job{}", prefix, i);
    p.argv = {setup.exe, "consume", "--socket", socket};
    for (std::string& a : JobArgs(setup, scenario.jobs[i], i)) p.argv.push_back(std::move(a));
    p.start_s = scenario.jobs[i].start_s;
    procs.push_back(std::move(p));
  }
  Result<std::vector<FinishedProcess>> done =
      RunScheduled(procs, setup.log_dir, *server, kRunTimeout);
  if (!done.ok()) return abandon(done.status());

  E2eSideResult side;
  if (Status s = CollectJobs(scenario, *done, &side); !s.ok()) return abandon(s);
  side.preparations = 0;  // the server's figure, below, not the jobs'
  Result<std::unique_ptr<Client>> client = Client::Connect(socket);
  if (!client.ok()) return abandon(client.status());
  Result<std::string> stats = (*client)->Stats();
  if (!stats.ok()) return abandon(stats.status());
  std::optional<double> preparations = JsonNumber(*stats, "preparations");
  std::optional<double> deliveries = JsonNumber(*stats, "deliveries");
  if (!preparations || !deliveries) {
    return abandon(Status::Internal(
        fmt::format("the server's stats lack \"preparations\" or \"deliveries\": {}", *stats)));
  }
  side.preparations = static_cast<uint64_t>(*preparations);
  side.deliveries = static_cast<uint64_t>(*deliveries);
  Result<double> server_cpu = StopProcess(*server, "carpool server", kServerStopGrace);
  if (!server_cpu.ok()) return server_cpu.status();
  side.server_cpu_s = *server_cpu;
  side.cpu_s += *server_cpu;
  if (side.deliveries != side.samples()) {
    return Status::Internal(
        fmt::format("the server counted {} deliveries but the jobs received {} samples; see {}",
                    side.deliveries, side.samples(), setup.log_dir.string()));
  }
  return side;
}

Result<E2eSideResult> RunBaselineSide(const E2eSetup& setup, const E2eScenario& scenario) {
  const std::string prefix = scenario.name + "-baseline";
  std::vector<ScheduledProcess> procs;
  for (size_t i = 0; i < scenario.jobs.size(); ++i) {
    ScheduledProcess p;
    p.label = fmt::format("{}-job{}", prefix, i);
    p.argv = {setup.exe,
              "bench",
              "standalone",
              "--state-dir",
              setup.state_dir.string(),
              "--workers",
              std::to_string(BaselineWorkers(setup.workers, scenario.jobs.size(), i))};
    for (std::string& a : JobArgs(setup, scenario.jobs[i], i)) p.argv.push_back(std::move(a));
    p.start_s = scenario.jobs[i].start_s;
    procs.push_back(std::move(p));
  }
  Result<std::vector<FinishedProcess>> done = RunScheduled(procs, setup.log_dir, -1, kRunTimeout);
  if (!done.ok()) return done.status();
  E2eSideResult side;
  if (Status s = CollectJobs(scenario, *done, &side); !s.ok()) return s;
  side.deliveries = side.samples();
  return side;
}

Result<E2eTorchResult> RunTorchvision(const E2eSetup& setup, const std::string& python,
                                      const std::string& script,
                                      const std::filesystem::path& image_dir, size_t jobs,
                                      uint32_t step_ms) {
  ScheduledProcess p;
  p.label = fmt::format("torchvision-{}", jobs);
  p.argv = {python,         script,
            "--root",       image_dir.string(),
            "--jobs",       std::to_string(jobs),
            "--workers",    std::to_string(setup.workers),
            "--batch-size", std::to_string(setup.batch_size),
            "--epochs",     std::to_string(setup.epochs),
            "--step-ms",    std::to_string(step_ms)};
  Result<std::vector<FinishedProcess>> done = RunScheduled({p}, setup.log_dir, -1, kRunTimeout);
  if (!done.ok()) return done.status();
  E2eTorchResult r;
  r.jobs = jobs;
  r.cpu_s = (*done)[0].cpu_s;
  const std::string& out = (*done)[0].stdout_text;
  size_t begin = 0;
  while (begin < out.size()) {
    size_t end = out.find('\n', begin);
    if (end == std::string::npos) end = out.size();
    const std::string_view line(out.data() + begin, end - begin);
    if (line.find("\"aggregate\"") != std::string_view::npos) {
      r.samples = static_cast<uint64_t>(JsonNumber(line, "samples").value_or(0));
      r.wall_s = JsonNumber(line, "wall_s").value_or(0);
    } else if (std::optional<double> rate = JsonNumber(line, "samples_per_s")) {
      r.job_rates.push_back(*rate);
    }
    begin = end + 1;
  }
  if (r.job_rates.size() != jobs || r.samples == 0) {
    return Status::Internal(fmt::format("{} printed {} job lines (expected {}) or no aggregate: {}",
                                        script, r.job_rates.size(), jobs, out));
  }
  return r;
}

}  // namespace carpool::tools
