#pragma once
// The share of the CPU that other processes leave to this one (idle, or used by this process),
// for the pacing's lift: DESIGN.md has a faster job pay for its laggers' re-preparations "with
// spare CPU only" (docs/scheduler.md "Pacing"). The server's own use counts as spare: where the
// server fills the CPU (a GPU node decoding JPEGs), re-preparations compete with its own work,
// and holding the leader would only idle its GPU; where training processes fill it (a CPU
// sweep), they would take CPU from the trials.
//
// Where the process's cgroup (v2) or one above it sets a CPU quota (a container's limit), the
// share is 1 - (usage - own) / quota over the interval, from the tightest quota's `cpu.stat`; the
// host's /proc/stat share over all CPUs caps it. Without a quota, /proc/stat alone. This process's
// CPU time comes from /proc/self/stat. Values are decayed over `time_constant` seconds. Not
// thread-safe: the engine's coordinator owns it.

#include <optional>
#include <string>

namespace carpool {

// Where HostCpu reads; tests point it at files of their own.
struct HostCpuFiles {
  std::string proc_stat = "/proc/stat";
  std::string self_cgroup = "/proc/self/cgroup";  // "0::/PATH" under cgroup v2
  std::string cgroup_root = "/sys/fs/cgroup";
  std::string self_stat = "/proc/self/stat";  // utime and stime, in clock ticks
};

class HostCpu {
 public:
  using Files = HostCpuFiles;
  explicit HostCpu(Files files = {}, double time_constant = 2.0, double min_interval = 0.25);

  // Reads the counters when `min_interval` seconds have passed since the last read (`now`: any
  // monotonic clock in seconds) and returns the decayed spare share in [0, 1]; nullopt until two
  // reads a positive interval apart, or when no counter can be read. Cost: three or four small
  // file reads per `min_interval`, O(1) otherwise.
  std::optional<double> Sample(double now);

 private:
  struct Counters {
    std::optional<double> host_idle, host_total;  // /proc/stat, in jiffies
    std::optional<double> usage_s;                // cpu.stat usage_usec of the quota's cgroup
    std::optional<double> own_ticks;              // this process's utime + stime
  };
  Counters Read() const;
  void FindQuota();

  Files files_;
  double time_constant_, min_interval_;
  std::string quota_dir_;  // the cgroup whose quota is the tightest; empty: none
  double quota_cores_ = 0;
  bool searched_ = false;
  std::optional<double> last_read_;
  Counters last_;
  double ticks_per_s_;
  std::optional<double> spare_;
};

}  // namespace carpool
