#include "server/host_cpu.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

namespace carpool {
namespace {

std::optional<std::string> FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

// "QUOTA PERIOD" in cores; nullopt for "max PERIOD" (no quota) or an unreadable file.
std::optional<double> QuotaCores(const std::string& dir) {
  const std::optional<std::string> line = FirstLine(dir + "/cpu.max");
  if (!line) return std::nullopt;
  std::istringstream in(*line);
  std::string quota;
  double period = 0;
  if (!(in >> quota >> period) || quota == "max" || period <= 0) return std::nullopt;
  try {
    const double q = std::stod(quota);
    if (q > 0) return q / period;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// utime + stime from /proc/<pid>/stat: the 12th and 13th fields after the command's ')'.
std::optional<double> OwnTicks(const std::string& path) {
  const std::optional<std::string> line = FirstLine(path);
  if (!line) return std::nullopt;
  const size_t paren = line->rfind(')');
  if (paren == std::string::npos) return std::nullopt;
  std::istringstream in(line->substr(paren + 1));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 0; i < 11; ++i) {
    if (!(in >> field)) return std::nullopt;
  }
  if (!(in >> utime >> stime)) return std::nullopt;
  return utime + stime;
}

}  // namespace

HostCpu::HostCpu(Files files, double time_constant, double min_interval)
    : files_(std::move(files)),
      time_constant_(time_constant),
      min_interval_(min_interval),
      ticks_per_s_(static_cast<double>(std::max(1L, sysconf(_SC_CLK_TCK)))) {}

void HostCpu::FindQuota() {
  searched_ = true;
  // cgroup v2: the line "0::/PATH"; a v1 host has no such line and keeps /proc/stat alone.
  std::ifstream in(files_.self_cgroup);
  std::string line, path;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  }
  if (path.empty()) return;
  // A quota may sit on any ancestor (a pod's, above its containers'): the tightest one binds.
  for (;;) {
    const std::string dir = files_.cgroup_root + (path == "/" ? "" : path);
    if (const std::optional<double> cores = QuotaCores(dir)) {
      if (quota_dir_.empty() || *cores < quota_cores_) {
        quota_dir_ = dir;
        quota_cores_ = *cores;
      }
    }
    if (path == "/" || path.empty()) break;
    const size_t slash = path.find_last_of('/');
    path = slash == 0 ? "/" : path.substr(0, slash);
  }
}

HostCpu::Counters HostCpu::Read() const {
  Counters c;
  if (const std::optional<std::string> line = FirstLine(files_.proc_stat);
      line && line->rfind("cpu ", 0) == 0) {
    // user nice system idle iowait irq softirq steal (guest time is inside user already)
    std::istringstream in(line->substr(4));
    double v[8] = {};
    int n = 0;
    while (n < 8 && in >> v[n]) ++n;
    if (n >= 5) {
      double total = 0;
      for (int i = 0; i < n; ++i) total += v[i];
      c.host_idle = v[3] + v[4];
      c.host_total = total;
    }
  }
  c.own_ticks = OwnTicks(files_.self_stat);
  if (!quota_dir_.empty()) {
    std::ifstream in(quota_dir_ + "/cpu.stat");
    std::string key;
    double value = 0;
    while (in >> key >> value) {
      if (key == "usage_usec") {
        c.usage_s = value / 1e6;
        break;
      }
    }
  }
  return c;
}

std::optional<double> HostCpu::Sample(double now) {
  if (last_read_ && now - *last_read_ < min_interval_) return spare_;
  if (!searched_) FindQuota();
  const Counters c = Read();
  std::optional<double> share;
  if (last_read_ && now > *last_read_) {
    // This process's CPU over the interval, in ticks (as /proc/stat counts) and in seconds.
    const double own = c.own_ticks && last_.own_ticks ? *c.own_ticks - *last_.own_ticks : 0.0;
    if (c.host_total && last_.host_total && *c.host_total > *last_.host_total) {
      const double total = *c.host_total - *last_.host_total;
      share = (*c.host_idle - *last_.host_idle + own) / total;
    }
    if (c.usage_s && last_.usage_s && quota_cores_ > 0) {
      const double others = *c.usage_s - *last_.usage_s - own / ticks_per_s_;
      share = std::min(share.value_or(1.0), 1.0 - others / ((now - *last_read_) * quota_cores_));
    }
  }
  if (share) {
    const double s = std::clamp(*share, 0.0, 1.0);
    const double keep = spare_ ? std::exp(-(now - *last_read_) / time_constant_) : 0.0;
    spare_ = keep * spare_.value_or(s) + (1 - keep) * s;
  }
  last_read_ = now;
  last_ = c;
  return spare_;
}

}  // namespace carpool
