// Pieces shared by the files of `carpool dataset` (dataset_cmd*.cc, dataset_gen.cc).
#ifndef CARPOOL_TOOLS_DATASET_CMD_H_
#define CARPOOL_TOOLS_DATASET_CMD_H_

#include <boost/program_options.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "carpool/status.h"
#include "datasets/catalog.h"
#include "datasets/source.h"

namespace carpool::tools {

// A one-line progress bar on stderr. It draws only when stderr is a terminal, --quiet is off and
// the work has run for more than a second. Thread-compatible (ProgressFn contract: one caller at
// a time).
class ProgressBar {
 public:
  explicit ProgressBar(bool quiet);
  ~ProgressBar() { Done(); }
  // Ends the bar's line, if one was drawn, so that other output starts on a fresh line.
  void Done();
  void Update(std::string_view phase, uint64_t done, uint64_t total);
  ProgressFn Fn() {
    return [this](std::string_view p, uint64_t d, uint64_t t) { Update(p, d, t); };
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_;
  bool drawn_ = false;
  Clock::time_point start_, last_draw_;
};

// "carpool dataset <verb>: <message>" on stderr; returns the exit code 1. With --json, the
// object of PrintJsonError on stdout instead.
int Fail(std::string_view verb, const Status& status);

// --json (dataset_cmd_json.cc): set by the dispatcher when argv holds --json; each verb then
// prints exactly one JSON object on stdout, success or error. Not thread-safe: set before use.
void SetJsonOutput(bool on);
bool JsonOutput();
// One object on one line of stdout.
void PrintJson(const nlohmann::json& object);
// {"error": message, "code": StatusCode value, "status": its name, "usage": usage, "verb": verb}.
void PrintJsonError(std::string_view verb, const Status& status, bool usage);
// name, samples, ids [min, max] ([] if empty), classes, prepare, source, created_unix.
nlohmann::json DatasetJson(const DatasetInfo& d);

// Parses argv into `vm` with `opts` (which must hold "help") and `pos`. Returns an exit code
// when the verb should stop now: 0 after printing --help, 2 after printing a usage error.
std::optional<int> ParseVerbArgs(std::string_view verb, int argc, char** argv,
                                 const boost::program_options::options_description& opts,
                                 const boost::program_options::positional_options_description& pos,
                                 boost::program_options::variables_map* vm);

// Prints "carpool dataset <verb>: <problem>; see --help" and returns the usage exit code 2 (with
// --json, as an error object with "usage": true and code InvalidArgument).
int UsageError(std::string_view verb, std::string_view problem);

// Resolves the state dir (flag, env, XDG, home) and opens its catalog.
Result<std::unique_ptr<Catalog>> OpenCatalog(std::string_view state_dir_flag);

// The synthetic images of `carpool dataset gen`: image i has class i mod classes and depends only
// on (seed, i). In folder layout it is class_CCC/img_NNNNNNNN.jpg; in tar shards the members
// img_NNNNNNNN.jpg and img_NNNNNNNN.cls of train-SSSSSS.tar.
struct SynthSpec {
  int width = 500, height = 375, classes = 10, quality = 90;
  uint64_t seed = 0;
};
std::string SynthKey(uint64_t index);
std::string SynthClassDir(const SynthSpec& spec, uint64_t index);
std::string SynthShardName(uint64_t shard);
Result<std::vector<uint8_t>> SynthesizeJpeg(const SynthSpec& spec, uint64_t index);
// Writes images [0, count) into `dir` in folder layout (shard_size 0) or as tar shards of
// shard_size images, on `threads` threads (0: all cores). Returns the JPEG bytes written.
Result<uint64_t> WriteSynthetic(const std::filesystem::path& dir, const SynthSpec& spec,
                                uint64_t count, uint64_t shard_size, unsigned threads,
                                ProgressBar* bar);

// Subcommands; argv[0] is "carpool dataset <verb>".
int DatasetAdd(int argc, char** argv);
int DatasetGen(int argc, char** argv);
int DatasetBench(int argc, char** argv);
int DatasetBenchTar(int argc, char** argv);  // bench --tar
int DatasetInspect(std::string_view verb, int argc, char** argv);  // ls, show, rm, overlap

}  // namespace carpool::tools

#endif  // CARPOOL_TOOLS_DATASET_CMD_H_
