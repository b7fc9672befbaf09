// The tables and JSON of `carpool bench e2e`, and its two goals (issue 6): at N = 4 in sync,
// aggregate throughput >= 3x the baseline's, and each job within 25% of its N = 1 speed. A row is
// a scenario at one cache size; the goals and the torchvision comparison read the rows of the
// run's first cache (by default the one that holds the whole prepared set).
// Stateless functions: thread-safe.
#ifndef CARPOOL_TOOLS_BENCH_BENCH_E2E_REPORT_H_
#define CARPOOL_TOOLS_BENCH_BENCH_E2E_REPORT_H_

#include <optional>
#include <string>
#include <vector>

#include "tools/bench/bench_e2e.h"
#include "tools/cache_fraction.h"

namespace carpool::tools {

struct E2eRunInfo {
  uint64_t images = 0;
  std::string data_dir;
  std::string prepare;
  std::string transform;
  uint32_t batch_size = 0;
  uint32_t epochs = 0;
  uint32_t prefetch = 0;
  uint32_t workers = 0;
  uint32_t step_ms = 0;
  uint32_t repeat = 1;  // runs per scenario and side; the best is reported
  PreparedSet prepared;             // every sample of the e2e dataset
  std::vector<CacheChoice> caches;  // the server's cache of each row, in row order
  std::string load_before;  // /proc/loadavg at the start and the end of the run
  std::string load_after;
  double seconds = 0;  // the whole run
};

struct E2eGoals {
  std::optional<double> sync4_vs_baseline;  // aggregate samples/s, carpool / baseline
  std::optional<double> sync4_vs_sync1;     // slowest carpool job at N=4 / carpool job at N=1
  bool aggregate_met() const { return sync4_vs_baseline && *sync4_vs_baseline >= 3.0; }
  bool per_job_met() const { return sync4_vs_sync1 && *sync4_vs_sync1 >= 0.75; }
};

E2eGoals ComputeE2eGoals(const std::vector<E2eScenarioResult>& results);

void PrintE2eTables(const E2eRunInfo& info, const std::vector<E2eScenarioResult>& results,
                    const std::vector<E2eTorchResult>& torch);

std::string E2eJson(const E2eRunInfo& info, const std::vector<E2eScenarioResult>& results,
                    const std::vector<E2eTorchResult>& torch);

}  // namespace carpool::tools

#endif  // CARPOOL_TOOLS_BENCH_BENCH_E2E_REPORT_H_
