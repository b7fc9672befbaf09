// Child processes for `carpool bench e2e`: spawned with stdout and stderr in files, reaped with
// wait4 so that each child's CPU time (all its threads, and its own reaped children) is measured
// by the kernel, not estimated. Thread-compatible: one scenario at a time per process, since
// reaping uses wait4(-1).
#ifndef CARPOOL_TOOLS_BENCH_BENCH_E2E_PROCS_H_
#define CARPOOL_TOOLS_BENCH_BENCH_E2E_PROCS_H_

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "carpool/status.h"

namespace carpool::tools {

// A process to start `start_s` seconds after RunScheduled begins.
struct ScheduledProcess {
  std::string label;  // names its log files: <log_dir>/<label>.out and .err
  std::vector<std::string> argv;
  double start_s = 0;
};

struct FinishedProcess {
  std::string label;
  double start_s = 0;  // spawn time, seconds after RunScheduled began
  double end_s = 0;    // reap time, same clock
  double cpu_s = 0;    // user + system CPU of the process, from wait4
  std::string stdout_text;
};

// The path of the running executable (/proc/self/exe).
Result<std::string> SelfExe();

// Starts argv[0] (a path) with stdout and stderr redirected to the given files. The child gets
// SIGTERM if this process dies (PR_SET_PDEATHSIG). REQUIRES: called from the main thread, since
// the parent-death signal follows the thread that forked.
Result<pid_t> SpawnProcess(const std::vector<std::string>& argv, const std::filesystem::path& out,
                           const std::filesystem::path& err);

// Spawns each process at its start time and waits for all of them. Any non-zero exit, or the
// exit of `watch` (e.g. the server; -1 for none), or `timeout` fails the run: the remaining
// children are killed and reaped, and the error quotes the failing child's stderr tail.
Result<std::vector<FinishedProcess>> RunScheduled(const std::vector<ScheduledProcess>& procs,
                                                  const std::filesystem::path& log_dir, pid_t watch,
                                                  std::chrono::seconds timeout);

// Sends SIGTERM, waits up to `grace`, then SIGKILL. Returns the CPU seconds of the process, or an
// error naming its exit status if it did not exit cleanly (0 or by SIGTERM).
Result<double> StopProcess(pid_t pid, std::string_view label, std::chrono::seconds grace);

// True while `pid` (a child) runs; reaps it (and returns false) once it has exited.
bool ChildRunning(pid_t pid);

// The q-quantile of `v` (nearest rank, q in [0, 1]; 1 is the maximum); 0 for none. O(n log n).
double Quantile(std::vector<double> v, double q);

// The number `key` of a JSON object's top level, if the text is one object and has it.
std::optional<double> JsonNumber(std::string_view json, std::string_view key);

// The last `lines` lines of a text file ("" if unreadable).
std::string FileTail(const std::filesystem::path& path, int lines);
std::string ReadText(const std::filesystem::path& path);

// /proc/loadavg's three load averages, "1.23 4.56 7.89".
std::string LoadAverages();

}  // namespace carpool::tools

#endif  // CARPOOL_TOOLS_BENCH_BENCH_E2E_PROCS_H_
