#include "tests/e2e_util.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "carpool/client.h"
#include "datasets/catalog.h"
#include "server/instance_name.h"

namespace carpool::e2e {
std::string CarpoolBin() {
  const char* dir = std::getenv("CARPOOL_BIN_DIR");
  return dir != nullptr ? std::string(dir) + "/carpool" : std::string(CARPOOL_BIN);
}

std::string Slurp(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

pid_t SpawnProcess(const std::vector<std::string>& argv, const fs::path& out,
                   const fs::path& err) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int in = ::open("/dev/null", O_RDONLY);
    int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(in, 0);
    ::dup2(o, 1);
    ::dup2(e, 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

namespace {

CliResult Collect(int status, const fs::path& out, const fs::path& err) {
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), Slurp(out), Slurp(err)};
}

}  // namespace

namespace {

// The JSON document in `text`: the whole text, or else its last line that parses (a command's
// stdout may carry other lines before the summary). Null when nothing parses.
nlohmann::json ParseJson(const std::string& text) {
  nlohmann::json whole = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!whole.is_discarded()) return whole;
  std::istringstream lines(text);
  nlohmann::json last;
  for (std::string line; std::getline(lines, line);) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) last = std::move(j);
  }
  return last;
}

// The value of `key` in the outermost object that has it, breadth first (so "hits" finds
// "cache":{"hits":..} and "skipped" the server's own count before a job's). Null when absent.
nlohmann::json Find(const nlohmann::json& root, const std::string& key) {
  std::vector<const nlohmann::json*> level = {&root};
  while (!level.empty()) {
    std::vector<const nlohmann::json*> next;
    for (const nlohmann::json* v : level) {
      if (v->is_object()) {
        if (auto it = v->find(key); it != v->end()) return *it;
        for (const auto& item : v->items()) next.push_back(&item.value());
      }
    }
    level = std::move(next);
  }
  return nullptr;
}

}  // namespace

double JsonNumber(const std::string& json, const std::string& key) {
  const nlohmann::json v = Find(ParseJson(json), key);
  return v.is_number() ? v.get<double>() : std::nan("");
}

std::vector<std::string> JsonObjects(const std::string& json, const std::string& key) {
  std::vector<std::string> out;
  const nlohmann::json v = Find(ParseJson(json), key);
  if (!v.is_array()) return out;
  for (const nlohmann::json& item : v) {
    if (item.is_object()) out.push_back(item.dump());
  }
  return out;
}

std::vector<Delivery> ReadIds(const fs::path& file) {
  std::vector<Delivery> out;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    Delivery d{};
    if (std::sscanf(line.c_str(), "%u,%u,%d", &d.epoch, &d.sample, &d.label) == 3) {
      out.push_back(d);
    }
  }
  return out;
}

E2eEnv::E2eEnv() { fs::create_directories(state()); }

E2eEnv::~E2eEnv() {
  for (pid_t pid : children_) {
    if (::kill(pid, 0) == 0) ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  // A server killed with SIGKILL leaves its segments; a clean one removed them already.
  for (const std::string& name : Segments()) fs::remove(fs::path("/dev/shm") / name);
}

std::vector<std::string> E2eEnv::Segments() const {
  const std::string prefix = "carpool-" + InstanceNameForSocket(socket().string());
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    if (name == prefix || name.rfind(prefix + "-", 0) == 0) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

pid_t E2eEnv::Spawn(const std::vector<std::string>& args, const std::string& name) {
  std::vector<std::string> full = args;
  full.insert(full.begin(), CarpoolBin());
  pid_t pid = SpawnProcess(full, dir() / (name + ".out"), dir() / (name + ".err"));
  children_.push_back(pid);
  return pid;
}

CliResult E2eEnv::Wait(pid_t pid, const std::string& name) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  children_.erase(std::remove(children_.begin(), children_.end(), pid), children_.end());
  return Collect(status, dir() / (name + ".out"), dir() / (name + ".err"));
}

bool E2eEnv::WaitFor(pid_t pid, const std::string& name, std::chrono::milliseconds timeout,
                     CliResult* result) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      children_.erase(std::remove(children_.begin(), children_.end(), pid), children_.end());
      *result = Collect(status, dir() / (name + ".out"), dir() / (name + ".err"));
      return true;
    }
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

CliResult E2eEnv::Run(const std::vector<std::string>& args, const std::string& name) {
  return Wait(Spawn(args, name), name);
}

void E2eEnv::GenImages(const fs::path& dir, int count, const std::string& size, int classes) {
  CliResult gen = Run({"dataset", "gen", dir.string(), "--count", std::to_string(count), "--size",
                       size, "--classes", std::to_string(classes), "--threads", "1", "-q"},
                      "gen");
  ASSERT_EQ(gen.code, 0) << gen.err;
}

void E2eEnv::Dataset(std::vector<std::string> args) {
  args.insert(args.begin(), "dataset");
  args.push_back("--state-dir");
  args.push_back(state().string());
  CliResult r = Run(args, "dataset");
  ASSERT_EQ(r.code, 0) << r.err;
}

pid_t E2eEnv::Consume(std::vector<std::string> args, const std::string& name) {
  args.insert(args.begin(), "consume");
  args.push_back("--state-dir");
  args.push_back(state().string());
  return Spawn(args, name);
}

void E2eEnv::StartServer(std::vector<std::string> args) {
  args.insert(args.begin(), {"server", "--state-dir", state().string()});
  server_ = Spawn(args, "server");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    if (Client::Connect(socket().string()).ok()) return;
    int status = 0;
    if (::waitpid(server_, &status, WNOHANG) == server_) {
      children_.erase(std::remove(children_.begin(), children_.end(), server_), children_.end());
      server_ = -1;
      FAIL() << "server exited at start: " << ServerLog();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  FAIL() << "server did not accept connections within 20 s: " << ServerLog();
}

void E2eEnv::StopServer(int signal) {
  if (server_ < 0) return;
  ::kill(server_, signal);
  CliResult r = Wait(server_, "server");
  server_ = -1;
  if (signal != SIGKILL) {
    EXPECT_EQ(r.code, 0) << r.err;
  }
}

std::string E2eEnv::ServerLog() const { return Slurp(dir() / "server.err"); }

std::string E2eEnv::Status() {
  CliResult r = Run({"status", "--json", "--state-dir", state().string()}, "status");
  return r.code == 0 ? r.out : std::string();
}

bool E2eEnv::WaitForJobs(size_t jobs, std::chrono::milliseconds timeout,
                         const std::string& job_key) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    size_t listed = 0;
    for (const std::string& job : JsonObjects(Status(), "jobs")) {
      if (job_key.empty() || nlohmann::json::parse(job).value("job_key", "") == job_key) ++listed;
    }
    if (listed >= jobs) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void CheckEpochs(const E2eEnv& env, const std::string& dataset, const std::string& ids_file,
                 uint32_t epochs) {
  Result<std::unique_ptr<Catalog>> catalog = Catalog::Open(env.state());
  ASSERT_TRUE(catalog.ok()) << catalog.status().ToString();
  Result<DatasetInfo> info = (*catalog)->GetDataset(dataset);
  ASSERT_TRUE(info.ok());
  Result<std::vector<SampleRecord>> records = (*catalog)->GetSamples(info->ids);
  ASSERT_TRUE(records.ok());
  std::map<uint32_t, int32_t> label;
  for (const SampleRecord& r : *records) label[r.id] = r.label;

  std::vector<Delivery> got = ReadIds(env.dir() / ids_file);
  ASSERT_EQ(got.size(), uint64_t{epochs} * label.size()) << dataset;
  std::vector<std::multiset<uint32_t>> per_epoch(epochs);
  for (const Delivery& d : got) {
    ASSERT_LT(d.epoch, epochs);
    ASSERT_TRUE(label.count(d.sample)) << dataset << ": sample " << d.sample << " not in it";
    ASSERT_EQ(d.label, label[d.sample]) << dataset << ": sample " << d.sample;
    per_epoch[d.epoch].insert(d.sample);
  }
  for (uint32_t e = 0; e < epochs; ++e) {
    ASSERT_EQ(per_epoch[e].size(), label.size());
    std::set<uint32_t> distinct(per_epoch[e].begin(), per_epoch[e].end());
    EXPECT_EQ(distinct.size(), label.size()) << dataset << " epoch " << e << " repeats a sample";
  }
}


}  // namespace carpool::e2e
