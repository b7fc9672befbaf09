#include "tools/bench/bench_e2e_procs.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

namespace carpool::tools {
namespace {

using Clock = std::chrono::steady_clock;

double CpuSeconds(const rusage& ru) {
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) return "exit code 127: could not exec";
  if (WIFEXITED(status)) return fmt::format("exit code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("signal {}", strsignal(WTERMSIG(status)));
  return fmt::format("wait status {}", status);
}

// Kills and reaps every child in `running` (pid -> label).
void KillAll(const std::map<pid_t, size_t>& running) {
  for (const auto& [pid, index] : running) kill(pid, SIGKILL);
  for (const auto& [pid, index] : running) waitpid(pid, nullptr, 0);
}

}  // namespace

Result<std::string> SelfExe() {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) {
    return Status::IOError(fmt::format("cannot read /proc/self/exe: {}", ec.message()));
  }
  return p.string();
}

Result<pid_t> SpawnProcess(const std::vector<std::string>& argv, const std::filesystem::path& out,
                           const std::filesystem::path& err) {
  if (argv.empty()) return Status::InvalidArgument("SpawnProcess: empty argv");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    return Status::IOError(
        fmt::format("cannot fork for \"{}\": {}", argv[0], std::strerror(errno)));
  }
  if (pid == 0) {
    // Only async-signal-safe calls until exec. SIGTERM when the benchmark dies, so that an
    // interrupted run leaves no jobs behind and the server still removes its segments.
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) _exit(126);
    const int in = open("/dev/null", O_RDONLY);
    const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (in < 0 || o < 0 || e < 0 || dup2(in, STDIN_FILENO) < 0 || dup2(o, STDOUT_FILENO) < 0 ||
        dup2(e, STDERR_FILENO) < 0) {
      _exit(126);
    }
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

Result<std::vector<FinishedProcess>> RunScheduled(const std::vector<ScheduledProcess>& procs,
                                                  const std::filesystem::path& log_dir, pid_t watch,
                                                  std::chrono::seconds timeout) {
  const Clock::time_point t0 = Clock::now();
  auto since = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  std::vector<FinishedProcess> done(procs.size());
  std::vector<bool> started(procs.size(), false);
  std::map<pid_t, size_t> running;
  size_t finished = 0;
  auto fail = [&](Status s) -> Status {
    KillAll(running);
    return s;
  };
  while (finished < procs.size()) {
    for (size_t i = 0; i < procs.size(); ++i) {
      if (started[i] || since() < procs[i].start_s) continue;
      const std::filesystem::path out = log_dir / (procs[i].label + ".out");
      const std::filesystem::path err = log_dir / (procs[i].label + ".err");
      Result<pid_t> pid = SpawnProcess(procs[i].argv, out, err);
      if (!pid.ok()) return fail(pid.status());
      started[i] = true;
      done[i].label = procs[i].label;
      done[i].start_s = since();
      running.emplace(*pid, i);
    }
    int status = 0;
    rusage ru{};
    const pid_t pid = wait4(-1, &status, WNOHANG, &ru);
    if (pid > 0 && pid == watch) {
      return fail(Status::Unavailable(
          fmt::format("the server exited during the run ({})", DescribeExit(status))));
    }
    if (pid > 0 && running.count(pid) > 0) {
      const size_t i = running[pid];
      running.erase(pid);
      ++finished;
      done[i].end_s = since();
      done[i].cpu_s = CpuSeconds(ru);
      const std::filesystem::path err = log_dir / (procs[i].label + ".err");
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        return fail(Status::Internal(fmt::format("{} failed ({}): {}; logs in {}", procs[i].label,
                                                 DescribeExit(status), FileTail(err, 3),
                                                 log_dir.string())));
      }
      done[i].stdout_text = ReadText(log_dir / (procs[i].label + ".out"));
      continue;  // reap others at once, before sleeping
    }
    if (since() > static_cast<double>(timeout.count())) {
      return fail(Status::Unavailable(fmt::format(
          "the run took longer than {} s; {} processes were still running and were killed",
          timeout.count(), running.size())));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return done;
}

Result<double> StopProcess(pid_t pid, std::string_view label, std::chrono::seconds grace) {
  kill(pid, SIGTERM);
  const Clock::time_point deadline = Clock::now() + grace;
  int status = 0;
  rusage ru{};
  for (;;) {
    const pid_t r = wait4(pid, &status, WNOHANG, &ru);
    if (r == pid) break;
    if (r < 0) {
      return Status::Internal(fmt::format("waiting for {}: {}", label, std::strerror(errno)));
    }
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      wait4(pid, &status, 0, &ru);
      return Status::Unavailable(fmt::format(
          "{} did not stop within {} s of SIGTERM and was killed", label, grace.count()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const bool clean = (WIFEXITED(status) && WEXITSTATUS(status) == 0) ||
                     (WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
  if (!clean) {
    return Status::Internal(fmt::format("{} ended badly ({})", label, DescribeExit(status)));
  }
  return CpuSeconds(ru);
}

bool ChildRunning(pid_t pid) { return waitpid(pid, nullptr, WNOHANG) == 0; }

std::optional<double> JsonNumber(std::string_view json, std::string_view key) {
  const nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return std::nullopt;
  const auto it = doc.find(std::string(key));
  if (it == doc.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

std::string ReadText(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string FileTail(const std::filesystem::path& path, int lines) {
  const std::string text = ReadText(path);
  size_t pos = text.size();
  if (pos > 0 && text[pos - 1] == '\n') --pos;
  for (int i = 0; i < lines && pos != std::string::npos && pos > 0; ++i) {
    pos = text.rfind('\n', pos - 1);
  }
  std::string tail = text.substr(pos == std::string::npos ? 0 : pos);
  while (!tail.empty() && (tail.front() == '\n')) tail.erase(0, 1);
  while (!tail.empty() && (tail.back() == '\n')) tail.pop_back();
  for (char& c : tail) {
    if (c == '\n') c = '|';
  }
  return tail.empty() ? "(no stderr)" : tail;
}

std::string LoadAverages() {
  std::string text = ReadText("/proc/loadavg");
  std::istringstream in(text);
  std::string a, b, c;
  in >> a >> b >> c;
  return fmt::format("{} {} {}", a, b, c);
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

}  // namespace carpool::tools
