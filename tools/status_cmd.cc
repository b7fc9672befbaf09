// `carpool status`: the server's statistics (docs/server.md), as a table or as the server's JSON.
#include <fmt/core.h>

#include <boost/program_options.hpp>
#include <cctype>
#include <chrono>
#include <map>
#include <memory>
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

// A minimal JSON reader for the server's own stats (objects, arrays, strings without escapes
// beyond \" and \\, numbers, true/false/null): enough to print a table.
struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = Kind::kNull;
  double number = 0;
  std::string text;
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  const Json& operator[](const std::string& key) const {
    static const Json kNull;
    auto it = fields.find(key);
    return it == fields.end() ? kNull : it->second;
  }
  std::string Str() const {
    if (kind == Kind::kString) return text;
    if (kind == Kind::kBool) return number != 0 ? "yes" : "no";
    if (kind == Kind::kNumber) {
      return number == static_cast<double>(static_cast<int64_t>(number))
                 ? fmt::format("{}", static_cast<int64_t>(number))
                 : fmt::format("{:.2f}", number);
    }
    return "-";
  }
};

class JsonParser {
 public:
  explicit JsonParser(std::string_view s) : s_(s) {}
  bool Parse(Json* out) {
    if (!Value(out)) return false;
    Skip();
    return i_ == s_.size();
  }

 private:
  void Skip() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool Eat(char c) {
    Skip();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  bool String(std::string* out) {
    if (!Eat('"')) return false;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\' && i_ + 1 < s_.size()) ++i_;
      out->push_back(s_[i_++]);
    }
    return Eat('"');
  }
  bool Value(Json* v) {
    Skip();
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '{') {
      v->kind = Json::Kind::kObject;
      ++i_;
      if (Eat('}')) return true;
      do {
        std::string key;
        if (!String(&key) || !Eat(':') || !Value(&v->fields[key])) return false;
      } while (Eat(','));
      return Eat('}');
    }
    if (c == '[') {
      v->kind = Json::Kind::kArray;
      ++i_;
      if (Eat(']')) return true;
      do {
        v->items.emplace_back();
        if (!Value(&v->items.back())) return false;
      } while (Eat(','));
      return Eat(']');
    }
    if (c == '"') {
      v->kind = Json::Kind::kString;
      return String(&v->text);
    }
    for (std::string_view word : {"true", "false", "null"}) {
      if (s_.substr(i_, word.size()) == word) {
        i_ += word.size();
        v->kind = word == "null" ? Json::Kind::kNull : Json::Kind::kBool;
        v->number = word == "true";
        return true;
      }
    }
    size_t used = 0;
    try {
      v->number = std::stod(std::string(s_.substr(i_, 40)), &used);
    } catch (const std::exception&) {
      return false;
    }
    v->kind = Json::Kind::kNumber;
    i_ += used;
    return true;
  }

  std::string_view s_;
  size_t i_ = 0;
};

void PrintTable(const Json& s) {
  fmt::print("server {}  up {} s  workers {}  look-ahead {}  policy {}\n", s["instance"].Str(),
             s["uptime_s"].Str(), s["workers"].Str(), s["lookahead"].Str(), s["policy"].Str());
  fmt::print("\n{:>4} {:<20} {:>6} {:>7} {:>9} {:>10} {:>7} {:>11} {:>8}\n", "job", "dataset",
             "batch", "epoch", "progress", "rate/s", "queue", "deliveries", "skipped");
  for (const Json& j : s["jobs"].items) {
    fmt::print("{:>4} {:<20} {:>6} {:>7} {:>8.1f}% {:>10} {:>7} {:>11} {:>8}\n", j["id"].Str(),
               j["dataset"].Str(), j["batch_size"].Str(),
               fmt::format("{}/{}", j["epoch"].number + 1, j["epochs"].Str()),
               100 * j["progress"].number, j["rate"].Str(), j["queue_depth"].Str(),
               j["deliveries"].Str(), j["skipped"].Str());
  }
  if (s["jobs"].items.empty()) fmt::print("   (no jobs)\n");
  const Json& c = s["cache"];
  fmt::print(
      "\ncache: {} of {} bytes used, {} pinned, {} entries; hits {}, misses {}, evictions {}\n",
      c["bytes_used"].Str(), c["capacity_bytes"].Str(), c["bytes_pinned"].Str(),
      c["entries"].Str(), c["hits"].Str(), c["misses"].Str(), c["evictions"].Str());
  fmt::print(
      "work:  {} preparations ({} transient), {} deliveries, sharing ratio {}, {} skipped "
      "({} bad samples)\n",
      s["preparations"].Str(), s["transient_preparations"].Str(), s["deliveries"].Str(),
      s["sharing_ratio"].Str(), s["skipped"].Str(), s["bad_samples"].Str());
  fmt::print("refs:  {} reference counts, {} pins, {} rounds\n", s["refcount_total"].Str(),
             s["pins"].Str(), s["rounds"].Str());
  if (!s["tree"].items.empty()) {
    fmt::print("\ntree (by position): job |R| |N_p| |L_p|\n");
    for (const Json& n : s["tree"].items) {
      fmt::print("  {:>4} {:>9} {:>9} {:>9}\n", n["job"].Str(), n["remaining"].Str(),
                 n["spine"].Str(), n["leaf"].Str());
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
      Json parsed;
      if (!JsonParser(*stats).Parse(&parsed)) {
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
