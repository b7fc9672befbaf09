// `carpool status`: the server's statistics (docs/server.md), as a table or as the server's JSON.
#include <fmt/core.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
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
  fmt::print("pacing {}: window {} samples of {} in the cache, {} owed, {} holds, {} lifts\n",
             Field(pacing, "enabled").is_boolean() && Field(pacing, "enabled").get<bool>() ? "on"
                                                                                           : "off",
             Str(pacing, "window"), Str(pacing, "capacity_samples"), Str(pacing, "owed"),
             Str(pacing, "holds"), Str(pacing, "lifts"));
  fmt::print("\n{:>4} {:<20} {:>6} {:>7} {:>9} {:>10} {:>7} {:>11} {:>8} {:>7}\n", "job",
             "dataset", "batch", "epoch", "progress", "rate/s", "queue", "deliveries", "skipped",
             "held/s");
  for (const Json& j : Items(s, "jobs")) {
    fmt::print("{:>4} {:<20} {:>6} {:>7} {:>8.1f}% {:>10} {:>7} {:>11} {:>8} {:>7.2f}\n",
               Str(j, "id"), Str(j, "dataset"), Str(j, "batch_size"),
               fmt::format("{}/{}", Number(j, "epoch") + 1, Str(j, "epochs")),
               100 * Number(j, "progress"), Str(j, "rate"), Str(j, "queue_depth"),
               Str(j, "deliveries"), Str(j, "skipped"), Number(j, "held_s"));
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

int ShowStatus(int argc, char** argv) {
  std::string state_dir, socket;
  uint32_t interval_ms = 1000;
  po::options_description opts;
  opts.add_options()("help,h", "show this help")("json", "print the server's JSON")(
      "watch", "refresh until interrupted")(
      "interval-ms", po::value(&interval_ms), "refresh period with --watch (default 1000)")(
      "socket", po::value(&socket), "server socket (default <state-dir>/carpool.sock)")(
      "state-dir", po::value(&state_dir), "state directory holding the socket");
  po::variables_map vm;
  if (auto rc = ParseCommandLine(argc, argv, "carpool status",
                                 "usage: carpool status [--json] [--watch]\n\nThe server's jobs, "
                                 "cache and sharing.\n\noptions:\n",
                                 opts, &vm)) {
    return *rc;
  }
  Result<std::string> path = ResolveSocketPath(socket, state_dir);
  Result<std::unique_ptr<Client>> client =
      path.ok() ? Client::Connect(*path) : Result<std::unique_ptr<Client>>(path.status());
  if (!client.ok()) {
    fmt::print(stderr, "carpool status: {}\n", client.status().ToString());
    return 1;
  }
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
    std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
  }
}

const CommandRegistrar kRegistrar("status", "show the server's jobs, cache and sharing",
                                  ShowStatus);

}  // namespace
}  // namespace carpool::tools
