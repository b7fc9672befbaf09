// `carpool dataset`: register, derive, inspect and generate datasets. This file dispatches to the
// verbs and holds the helpers they share.
#include "tools/dataset_cmd.h"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <string>

#include "datasets/state_dir.h"
#include "tools/command.h"

namespace carpool::tools {

namespace {

constexpr std::string_view kUsage = R"(usage: carpool dataset <verb> [options]

verbs:
  add NAME (--dir PATH | --list FILE.csv | --idx IMAGES LABELS | --tar SHARDS) [--prepare SPEC]
  add NAME --from DS (--classes a,b | --fraction F [--seed S] | --ids LO:HI)
  add NAME (--union | --intersect | --minus) A B [--prepare SPEC]
  ls                      list datasets
  show NAME               size, classes, source, prepare spec, overlap with the others
  rm NAME                 remove a dataset (sample ids stay reserved)
  overlap A B             |A|, |B|, |A∩B|, |A∪B|, Jaccard, |A∩B|/max(|A|,|B|)
  gen DIR --count N [--size 500x375] [--classes K] [--seed S] [--tar [--shard-size N]]
                          write synthetic JPEGs in image-folder layout, or as tar shards
  bench [--count N]       time registering a list of N files (default 1281167)
  bench --tar [--count N] prepare throughput from tar shards vs the folder, same images

common options: --state-dir DIR (else $CARPOOL_STATE_DIR, $XDG_STATE_HOME/carpool,
~/.local/state/carpool), --quiet, --json (add, ls, show, rm, overlap: one JSON object on
stdout, errors too: {"error": ...}); 'carpool dataset <verb> --help' for the rest.
)";

int Dataset(int argc, char** argv) {
  SetJsonOutput(std::any_of(argv + 1, argv + argc,
                            [](const char* a) { return std::string_view(a) == "--json"; }));
  if (argc < 2 || (JsonOutput() && std::string_view(argv[1]) == "--json")) {
    if (JsonOutput()) {
      PrintJsonError("", Status::InvalidArgument("missing verb; see 'carpool dataset --help'"),
                     true);
      return 2;
    }
    fmt::print(stderr, "{}", kUsage);
    return 2;
  }
  std::string_view verb = argv[1];
  if (verb == "--help" || verb == "-h" || verb == "help") {
    fmt::print("{}", kUsage);
    return 0;
  }
  std::string prog = fmt::format("carpool dataset {}", verb);
  argv[1] = prog.data();
  if (verb == "add") return DatasetAdd(argc - 1, argv + 1);
  if (verb == "gen") return DatasetGen(argc - 1, argv + 1);
  if (verb == "bench") return DatasetBench(argc - 1, argv + 1);
  if (verb == "ls" || verb == "show" || verb == "rm" || verb == "overlap") {
    return DatasetInspect(verb, argc - 1, argv + 1);
  }
  std::string unknown = fmt::format(
      "unknown verb \"{}\" (known: add, ls, show, rm, overlap, gen, bench); see 'carpool "
      "dataset --help'",
      verb);
  if (JsonOutput()) {
    PrintJsonError(verb, Status::InvalidArgument(unknown), true);
  } else {
    fmt::print(stderr, "carpool dataset: {}\n", unknown);
  }
  return 2;
}

const CommandRegistrar kRegistrar("dataset", "register, derive, inspect and generate datasets",
                                  Dataset);

}  // namespace

int Fail(std::string_view verb, const Status& status) {
  if (JsonOutput()) {
    PrintJsonError(verb, status, false);
  } else {
    fmt::print(stderr, "carpool dataset {}: {}\n", verb, status.message());
  }
  return 1;
}

std::optional<int> ParseVerbArgs(std::string_view verb, int argc, char** argv,
                                 const boost::program_options::options_description& opts,
                                 const boost::program_options::positional_options_description& pos,
                                 boost::program_options::variables_map* vm) {
  namespace po = boost::program_options;
  try {
    po::store(po::command_line_parser(argc, argv).options(opts).positional(pos).run(), *vm);
    if (vm->count("help")) {
      std::cout << opts;
      return 0;
    }
    po::notify(*vm);
  } catch (const po::error& e) {
    return UsageError(verb, e.what());
  }
  return std::nullopt;
}

int UsageError(std::string_view verb, std::string_view problem) {
  std::string message = fmt::format("{}; see 'carpool dataset {} --help'", problem, verb);
  if (JsonOutput()) {
    PrintJsonError(verb, Status::InvalidArgument(message), true);
  } else {
    fmt::print(stderr, "carpool dataset {}: {}\n", verb, message);
  }
  return 2;
}

Result<std::unique_ptr<Catalog>> OpenCatalog(std::string_view state_dir_flag) {
  Result<std::filesystem::path> dir = ResolveStateDir(state_dir_flag);
  if (!dir.ok()) return dir.status();
  return Catalog::Open(*dir);
}

ProgressBar::ProgressBar(bool quiet)
    : enabled_(!quiet && ::isatty(STDERR_FILENO) == 1), start_(Clock::now()) {}

void ProgressBar::Done() {
  if (drawn_) fmt::print(stderr, "\n");
  drawn_ = false;
}

void ProgressBar::Update(std::string_view phase, uint64_t done, uint64_t total) {
  if (!enabled_) return;
  Clock::time_point now = Clock::now();
  if (now - start_ < std::chrono::seconds(1)) return;
  bool final = total > 0 && done >= total;
  if (!final && drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  drawn_ = true;
  double secs = std::chrono::duration<double>(now - start_).count();
  if (total == 0) {
    fmt::print(stderr, "\r\033[K{:<16} {:>10} {:6.1f}s", phase, done, secs);
    return;
  }
  constexpr int kWidth = 30;
  int filled = static_cast<int>(kWidth * done / total);
  fmt::print(stderr, "\r\033[K{:<16} [{}{}] {:3}% {}/{} {:.1f}s", phase, std::string(filled, '#'),
             std::string(kWidth - filled, '.'), 100 * done / total, done, total, secs);
}

}  // namespace carpool::tools
