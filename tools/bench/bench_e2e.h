// `carpool bench e2e`: scenarios of training jobs run two ways in the same run, each job a real
// process. carpool: one `carpool server` process and a `carpool consume` process per job.
// Baseline: a `carpool bench standalone` process per job (tools/bench/standalone_loader.h), the
// worker threads split across the jobs so that the total equals the server's. CPU time is the
// kernel's (wait4) for every process of a side, the server included. Thread-compatible.
#ifndef CARPOOL_TOOLS_BENCH_BENCH_E2E_H_
#define CARPOOL_TOOLS_BENCH_BENCH_E2E_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "carpool/status.h"
#include "tools/cache_fraction.h"

namespace carpool::tools {

struct E2eJob {
  std::string dataset;
  double start_s = 0;    // after the scenario starts
  uint32_t step_ms = 0;  // simulated training time per batch
};

struct E2eScenario {
  std::string name;
  std::string description;
  std::vector<E2eJob> jobs;
};

struct E2eSetup {
  std::string exe;                  // the carpool binary
  std::filesystem::path state_dir;  // the catalog holding the datasets
  std::filesystem::path log_dir;    // sockets and per-process logs
  uint32_t workers = 4;             // the server's threads = the baseline's total
  uint32_t batch_size = 32;
  uint32_t epochs = 1;
  uint32_t prefetch = 4;  // batches, for both sides
  std::string transform;
  std::string cache_size;  // `carpool server --cache-size` (CacheChoice::server_flag)
  std::string follow = "on";  // `carpool server --follow`
};

struct E2eJobResult {
  std::string dataset;
  uint64_t samples = 0;
  double start_s = 0;  // spawn and exit, seconds after the scenario began
  double end_s = 0;
  double cpu_s = 0;      // this job's process
  uint32_t threads = 0;  // baseline: its worker threads

  double rate() const { return end_s > start_s ? samples / (end_s - start_s) : 0.0; }
};

struct E2eSideResult {
  std::vector<E2eJobResult> jobs;
  double cpu_s = 0;         // every process of the side (carpool: server + jobs)
  double server_cpu_s = 0;  // carpool only
  uint64_t preparations = 0;
  uint64_t deliveries = 0;

  uint64_t samples() const;
  double wall_s() const;          // first spawn to last exit
  double rate() const;            // samples / wall_s
  double cpu_per_sample() const;  // CPU seconds per delivered sample
  double cores_used() const { return wall_s() > 0 ? cpu_s / wall_s() : 0.0; }
  double preps_per_delivery() const;
};

// One row: a scenario at one cache size. The baseline has no cache, so it runs once per
// scenario, in the row of the run's first cache; the other rows reuse that measurement.
struct E2eScenarioResult {
  E2eScenario scenario;
  CacheChoice cache;
  E2eSideResult carpool;
  E2eSideResult baseline;
  bool baseline_reused = false;
};

// bench/torchvision_jobs.py for `jobs` jobs (ImageFolder + DataLoader per job, the same total
// workers), reaped with wait4 so that cpu_s covers the script and all its descendants.
struct E2eTorchResult {
  size_t jobs = 0;
  std::vector<double> job_rates;  // samples/s per job, as the job measured it
  uint64_t samples = 0;
  double wall_s = 0;  // first job start to last job end
  double cpu_s = 0;

  double rate() const { return wall_s > 0 ? samples / wall_s : 0.0; }
  double cpu_per_sample() const { return samples > 0 ? cpu_s / samples : 0.0; }
};

Result<E2eTorchResult> RunTorchvision(const E2eSetup& setup, const std::string& python,
                                      const std::string& script,
                                      const std::filesystem::path& image_dir, size_t jobs,
                                      uint32_t step_ms);

// Worker threads of baseline job i of n, out of `total`: total/n, the remainder to the first
// jobs, at least 1 (so the total exceeds `total` only when n > total).
uint32_t BaselineWorkers(uint32_t total, size_t n, size_t i);

Result<E2eSideResult> RunCarpoolSide(const E2eSetup& setup, const E2eScenario& scenario);
Result<E2eSideResult> RunBaselineSide(const E2eSetup& setup, const E2eScenario& scenario);

}  // namespace carpool::tools

#endif  // CARPOOL_TOOLS_BENCH_BENCH_E2E_H_
