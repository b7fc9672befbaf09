// `carpool status`: the server's statistics (docs/server.md), as a table or as the server's JSON,
// or recorded as a series of JSON lines (--watch SECONDS --json-lines FILE) for `carpool report`.
#include <fmt/core.h>

#include <boost/program_options.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "carpool/client.h"
#include "tools/command.h"
#include "tools/options.h"
#include "tools/socket_path.h"

namespace carpool::tools {
namespace {

namespace po = boost::program_options;

using Json = nlohmann::json;

// `obj[key]`, or null where obj is not an object or lacks the key (an older or newer server).
const Json& Field(const Json& obj, const char* key) {
  static const Json kNull;
  if (!obj.is_object()) return kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

// A table cell: integers as they are, other numbers to 2 decimals, booleans as yes/no.
std::string Str(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (v.is_number_integer()) return v.dump();
  if (v.is_number()) {
    const double number = v.get<double>();
    return number == static_cast<double>(static_cast<int64_t>(number))
               ? fmt::format("{}", static_cast<int64_t>(number))
               : fmt::format("{:.2f}", number);
  }
  return "-";
}

std::string Str(const Json& obj, const char* key) { return Str(Field(obj, key)); }

double Number(const Json& obj, const char* key) {
  const Json& v = Field(obj, key);
  return v.is_number() ? v.get<double>() : 0.0;
}

// The items of an array field; empty where the field is missing or not an array.
const Json& Items(const Json& obj, const char* key) {
  static const Json kEmpty = Json::array();
  const Json& v = Field(obj, key);
  return v.is_array() ? v : kEmpty;
}

void PrintTable(const Json& s) {
  const Json& pacing = Field(s, "pacing");
  fmt::print("server {}  up {} s  workers {}  look-ahead {}{}  policy {}\n", Str(s, "instance"),
             Str(s, "uptime_s"), Str(s, "workers"), Str(s, "lookahead"),
             Field(pacing, "derived_lookahead").is_boolean() &&
                     Field(pacing, "derived_lookahead").get<bool>()
                 ? " (derived)"
                 : "",
             Str(s, "policy"));
  const Json& spare = Field(pacing, "spare_cpu");
  fmt::print(
      "pacing {}: window {} samples of {} in the cache, {} owed, {} holds, {} lifts, spare CPU "
      "{}\n",
      Field(pacing, "enabled").is_boolean() && Field(pacing, "enabled").get<bool>() ? "on" : "off",
      Str(pacing, "window"), Str(pacing, "capacity_samples"), Str(pacing, "owed"),
      Str(pacing, "holds"), Str(pacing, "lifts"),
      spare.is_number() ? fmt::format("{:.0f}%", 100 * spare.get<double>()) : "not known");
  fmt::print("\n{:>4} {:<20} {:>6} {:>7} {:>9} {:>10} {:>7} {:>11} {:>8} {:>7} {:>8}\n", "job",
             "dataset", "batch", "epoch", "progress", "rate/s", "queue", "deliveries", "skipped",
             "held/s", "follows");
  for (const Json& j : Items(s, "jobs")) {
    const Json& leader = Field(j, "following");
    fmt::print("{:>4} {:<20} {:>6} {:>7} {:>8.1f}% {:>10} {:>7} {:>11} {:>8} {:>7.2f} {:>8}\n",
               Str(j, "id"), Str(j, "dataset"), Str(j, "batch_size"),
               fmt::format("{}/{}", Number(j, "epoch") + 1, Str(j, "epochs")),
               100 * Number(j, "progress"), Str(j, "rate"), Str(j, "queue_depth"),
               Str(j, "deliveries"), Str(j, "skipped"), Number(j, "held_s"),
               leader.is_number() ? Str(leader) : "-");
  }
  if (Items(s, "jobs").empty()) fmt::print("   (no jobs)\n");
  const Json& c = Field(s, "cache");
  fmt::print(
      "\ncache: {} of {} bytes used, {} pinned, {} entries; hits {}, misses {}, evictions {}\n",
      Str(c, "bytes_used"), Str(c, "capacity_bytes"), Str(c, "bytes_pinned"), Str(c, "entries"),
      Str(c, "hits"), Str(c, "misses"), Str(c, "evictions"));
  fmt::print(
      "work:  {} preparations ({} transient), {} deliveries, sharing ratio {}, {} skipped "
      "({} bad samples)\n",
      Str(s, "preparations"), Str(s, "transient_preparations"), Str(s, "deliveries"),
      Str(s, "sharing_ratio"), Str(s, "skipped"), Str(s, "bad_samples"));
  fmt::print("refs:  {} reference counts, {} pins, {} rounds\n", Str(s, "refcount_total"),
             Str(s, "pins"), Str(s, "rounds"));
  if (!Items(s, "tree").empty()) {
    fmt::print("\ntree (by position): job |R| |N_p| |L_p|\n");
    for (const Json& n : Items(s, "tree")) {
      fmt::print("  {:>4} {:>9} {:>9} {:>9}\n", Str(n, "job"), Str(n, "remaining"), Str(n, "spine"),
                 Str(n, "leaf"));
    }
  }
}

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void OnStopSignal(int signal) { g_stop_signal = signal; }

// `--watch` alone keeps its old meaning (refresh every --interval-ms); `--watch SECONDS` sets the
// period. Boost's implicit values never take the next word, so it is folded into --watch=SECONDS
// (status takes no positional words, so the word after --watch can only be its value).
// A negative number is taken too, so that its error names the value rather than an option "-1".
bool IsWatchValue(const std::string& word) {
  if (word.empty()) return false;
  if (word[0] != '-') return true;
  return word.size() > 1 && (std::isdigit(static_cast<unsigned char>(word[1])) || word[1] == '.');
}

std::vector<std::string> FoldWatchValue(int argc, char** argv) {
  std::vector<std::string> words(argv, argv + argc);
  for (size_t i = 1; i + 1 < words.size(); ++i) {
    if (words[i] == "--watch" && IsWatchValue(words[i + 1])) {
      words[i] += "=" + words[i + 1];
      words.erase(words.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    }
  }
  return words;
}

// SECONDS of --watch: a number in [0.05, 86400]; nullopt (after one error line) otherwise.
std::optional<double> ParseWatchSeconds(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double seconds = std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || *end != '\0' || !(seconds >= 0.05 && seconds <= 86400)) {
    fmt::print(stderr,
               "carpool status: --watch \"{}\" is not a period in seconds between 0.05 and 86400; "
               "pass e.g. --watch 1 or --watch 0.5\n",
               text);
    return std::nullopt;
  }
  return seconds;
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Sleeps until `deadline` in short slices, so that SIGINT/SIGTERM end the wait within 50 ms.
void SleepUntil(std::chrono::steady_clock::time_point deadline) {
  while (!g_stop_signal && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_until(
        std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(50)));
  }
}

// Appends {"time": unix s, "elapsed_s": s since the first record, "status": {...}} per line every
// `seconds` until SIGINT/SIGTERM (exit 0) or the server goes away (exit 0, one message). A server
// never reached is exit 1: there is no series to keep. Each line is flushed as written.
int RecordSeries(Client* client, const std::string& path, double seconds) {
  const bool to_stdout = path == "-";
  std::FILE* out = to_stdout ? stdout : std::fopen(path.c_str(), "w");
  if (out == nullptr) {
    fmt::print(stderr,
               "carpool status: cannot write --json-lines \"{}\": {}; pass a writable path\n", path,
               std::strerror(errno));
    return 1;
  }
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;  // no SA_RESTART: a Stats() blocked in recv returns early
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  const std::string where = to_stdout ? "stdout" : path;
  fmt::print(stderr, "carpool status: recording every {} s to {}; Ctrl-C stops\n", seconds, where);
  const auto start = std::chrono::steady_clock::now();
  const auto period = std::chrono::duration<double>(seconds);
  int rc = 0;
  uint64_t records = 0;
  for (;;) {
    Result<std::string> stats = client->Stats();
    if (g_stop_signal) {
      fmt::print(stderr, "carpool status: stopped by signal {}; {} records in {}\n",
                 static_cast<int>(g_stop_signal), records, where);
      break;
    }
    if (!stats.ok()) {
      fmt::print(stderr, "carpool status: the server went away ({}); {} records in {}\n",
                 stats.status().ToString(), records, where);
      break;
    }
    // Ordered, so that each line starts with its timestamps rather than ends with them.
    nlohmann::ordered_json status =
        nlohmann::ordered_json::parse(*stats, nullptr, /*allow_exceptions=*/false);
    if (status.is_discarded()) {
      fmt::print(stderr, "carpool status: the server's reply is not JSON: {}\n", *stats);
      rc = 1;
      break;
    }
    nlohmann::ordered_json line;
    line["time"] = UnixSeconds();
    line["elapsed_s"] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    line["status"] = std::move(status);
    if (std::fprintf(out, "%s\n", line.dump().c_str()) < 0 || std::fflush(out) != 0) {
      fmt::print(stderr, "carpool status: writing {} failed: {}\n", where, std::strerror(errno));
      rc = 1;
      break;
    }
    ++records;
    SleepUntil(start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           period * static_cast<double>(records)));
  }
  if (!to_stdout && std::fclose(out) != 0 && rc == 0) {
    fmt::print(stderr, "carpool status: closing {} failed: {}\n", where, std::strerror(errno));
    rc = 1;
  }
  return rc;
}

int ShowStatus(int argc, char** argv) {
  std::string state_dir, socket, watch, json_lines;
  uint32_t interval_ms = 1000;
  po::options_description opts;
  opts.add_options()("help,h", "show this help")("json", "print the server's JSON")(
      "watch", po::value(&watch)->implicit_value(""),
      "[SECONDS] refresh until interrupted, every SECONDS (default: --interval-ms)")(
      "interval-ms", po::value(&interval_ms), "refresh period with a bare --watch (default 1000)")(
      "json-lines", po::value(&json_lines),
      "with --watch SECONDS: append the status as one JSON object per line to FILE ('-': "
      "stdout) until interrupted or the server goes away")(
      "socket", po::value(&socket), "server socket (default <state-dir>/carpool.sock)")(
      "state-dir", po::value(&state_dir), "state directory holding the socket");
  po::variables_map vm;
  std::vector<std::string> words = FoldWatchValue(argc, argv);
  std::vector<char*> folded;
  for (std::string& w : words) folded.push_back(w.data());
  if (auto rc = ParseCommandLine(
          static_cast<int>(folded.size()), folded.data(), "carpool status",
          "usage: carpool status [--json] [--watch [SECONDS]] [--json-lines FILE]\n\nThe "
          "server's jobs, cache and sharing. `--watch SECONDS --json-lines FILE` records a series "
          "for `carpool report FILE`.\n\noptions:\n",
          opts, &vm)) {
    return *rc;
  }
  std::optional<double> seconds;
  if (!watch.empty() && !(seconds = ParseWatchSeconds(watch))) return 2;
  if (vm.count("json-lines") && !seconds) {
    fmt::print(stderr,
               "carpool status: --json-lines \"{}\" records a series and needs its period: add "
               "--watch SECONDS, e.g. --watch 1\n",
               json_lines);
    return 2;
  }
  if (seconds && vm.count("interval-ms")) {
    fmt::print(stderr,
               "carpool status: --watch {} and --interval-ms {} both set the period; pass "
               "one of them\n",
               watch, interval_ms);
    return 2;
  }
  if (vm.count("json-lines") && vm.count("json")) {
    fmt::print(stderr, "carpool status: --json-lines always writes JSON; drop --json\n");
    return 2;
  }
  Result<std::string> path = ResolveSocketPath(socket, state_dir);
  Result<std::unique_ptr<Client>> client =
      path.ok() ? Client::Connect(*path) : Result<std::unique_ptr<Client>>(path.status());
  if (!client.ok()) {
    fmt::print(stderr, "carpool status: {}\n", client.status().ToString());
    return 1;
  }
  if (vm.count("json-lines")) return RecordSeries(client->get(), json_lines, *seconds);
  const auto period = seconds ? std::chrono::duration_cast<std::chrono::milliseconds>(
                                    std::chrono::duration<double>(*seconds))
                              : std::chrono::milliseconds(interval_ms);
  for (;;) {
    Result<std::string> stats = (*client)->Stats();
    if (!stats.ok()) {
      fmt::print(stderr, "carpool status: {}\n", stats.status().ToString());
      return 1;
    }
    if (vm.count("watch")) fmt::print("\x1b[H\x1b[2J");
    if (vm.count("json")) {
      fmt::print("{}\n", *stats);
    } else {
      const Json parsed = Json::parse(*stats, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded()) {
        fmt::print(stderr, "carpool status: the server's reply is not JSON: {}\n", *stats);
        return 1;
      }
      PrintTable(parsed);
    }
    std::fflush(stdout);
    if (!vm.count("watch")) return 0;
    std::this_thread::sleep_for(period);
  }
}

const CommandRegistrar kRegistrar("status", "show the server's jobs, cache and sharing",
                                  ShowStatus);

}  // namespace
}  // namespace carpool::tools
