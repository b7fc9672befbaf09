// Support for the multi-process end-to-end tests (issue 5): a temporary state dir, the `carpool`
// binary run as real processes (server, consume, status, dataset), and reading the server's JSON
// stats. Thread-compatible.
#ifndef CARPOOL_TESTS_E2E_UTIL_H_
#define CARPOOL_TESTS_E2E_UTIL_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "datasets/temp_dir_for_test.h"

namespace carpool::e2e {

namespace fs = std::filesystem;

inline const fs::path kFmnist = "/usr/share/datasets/fashion-mnist";

// How many times a sanitizer slows this build (TSan: 5-15x), for the few timeouts that bound the
// server's work rather than what a test measures (docs/sanitizers.md).
#if defined(__SANITIZE_THREAD__)
inline constexpr int kSanitizerSlowdown = 15;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr int kSanitizerSlowdown = 15;
#else
inline constexpr int kSanitizerSlowdown = 1;
#endif
#else
inline constexpr int kSanitizerSlowdown = 1;
#endif

struct CliResult {
  int code = -1;  // exit code, or 128 + signal
  std::string out, err;
};

// The `carpool` binary under test: $CARPOOL_BIN_DIR/carpool (set by ctest), else the build's.
std::string CarpoolBin();
// The whole content of a file ("" when it cannot be read).
std::string Slurp(const fs::path& file);
// fork+exec of argv (argv[0] a path) with stdin from /dev/null and stdout/stderr into files.
pid_t SpawnProcess(const std::vector<std::string>& argv, const fs::path& out, const fs::path& err);

// The number "key" in a JSON text (or in its last JSON line), taken from the outermost object
// that has the key; NaN when absent or not a number.
double JsonNumber(const std::string& json, const std::string& key);
// The objects of the array "key", each as JSON text; empty when absent.
std::vector<std::string> JsonObjects(const std::string& json, const std::string& key);

// `epoch,sample_id,label` lines as written by `carpool consume --ids-out`.
struct Delivery {
  uint32_t epoch;
  uint32_t sample;
  int32_t label;
};
std::vector<Delivery> ReadIds(const fs::path& file);

class E2eEnv;
// Every epoch in `ids_file` (under env.dir(), written by `consume --ids-out`) delivers each sample
// of `dataset` exactly once, with the catalog's label. Fails the calling test otherwise.
void CheckEpochs(const E2eEnv& env, const std::string& dataset, const std::string& ids_file,
                 uint32_t epochs);

class E2eEnv {
 public:
  E2eEnv();
  ~E2eEnv();  // kills what is still running and removes the server's leftover segments
  E2eEnv(const E2eEnv&) = delete;
  E2eEnv& operator=(const E2eEnv&) = delete;

  const fs::path& dir() const { return tmp_.path(); }
  fs::path state() const { return tmp_.path() / "state"; }
  fs::path socket() const { return state() / "carpool.sock"; }

  // Runs `carpool ARGS` to completion (stdout/stderr captured). `name` names the output files.
  CliResult Run(const std::vector<std::string>& args, const std::string& name = "run");
  // Starts `carpool ARGS` in the background; Wait collects it.
  pid_t Spawn(const std::vector<std::string>& args, const std::string& name);
  CliResult Wait(pid_t pid, const std::string& name);
  // Waits up to `timeout` for the process to exit; false if it is still running.
  bool WaitFor(pid_t pid, const std::string& name, std::chrono::milliseconds timeout,
               CliResult* result);

  // `carpool dataset gen DIR` of `count` JPEGs of `size` ("WxH"); fails the test on error.
  void GenImages(const fs::path& dir, int count, const std::string& size, int classes = 2);
  // `carpool dataset ARGS --state-dir state()`; fails the test on a non-zero exit.
  void Dataset(std::vector<std::string> args);
  // `carpool consume ARGS --state-dir state()` in the background.
  pid_t Consume(std::vector<std::string> args, const std::string& name);
  // Starts `carpool server --state-dir state() ARGS` and waits until it accepts connections.
  void StartServer(std::vector<std::string> args = {});
  void StopServer(int signal);  // sends `signal` and waits for the exit
  pid_t server_pid() const { return server_; }
  std::string ServerLog() const;
  // `carpool status --json`; empty on failure.
  std::string Status();
  // Polls Status() until it lists at least `jobs` jobs (a DDP job lists each rank), of `job_key`
  // when not empty; false when `timeout` passes first. Waits out the clients' start, which a
  // sanitizer slows by seconds.
  bool WaitForJobs(size_t jobs, std::chrono::milliseconds timeout, const std::string& job_key = "");
  // This server instance's shared-memory segments now in /dev/shm, sorted.
  std::vector<std::string> Segments() const;

 private:
  TempDirForTest tmp_;
  pid_t server_ = -1;
  std::vector<pid_t> children_;
};

}  // namespace carpool::e2e

#endif  // CARPOOL_TESTS_E2E_UTIL_H_
