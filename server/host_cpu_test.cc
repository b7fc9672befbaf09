#include "server/host_cpu.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

namespace carpool {
namespace {

namespace fs = std::filesystem;

// A fake /proc and cgroup tree in a temporary folder.
class HostCpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ =
        fs::temp_directory_path() /
        ("carpool_host_cpu_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
         "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "cg/pod/ctr");
    files_.proc_stat = (root_ / "stat").string();
    files_.self_cgroup = (root_ / "cgroup").string();
    files_.cgroup_root = (root_ / "cg").string();
    files_.self_stat = (root_ / "self_stat").string();
    Write("cgroup", "0::/pod/ctr\n");
    Own(0);
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(root_ / name) << text;
  }
  // /proc/stat's first line: user nice system idle iowait irq softirq steal guest guest_nice.
  void Stat(int busy, int idle) {
    Write("stat", "cpu  " + std::to_string(busy) + " 0 0 " + std::to_string(idle) +
                      " 0 0 0 0 0 0\ncpu0 1 2 3 4\n");
  }

  // /proc/self/stat with `ticks` of user time (a command name with a space and a parenthesis).
  void Own(int ticks) {
    Write("self_stat", "4242 (carpool (x) y) S 1 2 3 0 -1 4194304 10 0 0 0 " +
                           std::to_string(ticks) + " 0 0 0 20 0 9 0 100 0 0\n");
  }

  fs::path root_;
  HostCpu::Files files_;
};

TEST_F(HostCpuTest, TheHostsIdleShareFromProcStat) {
  HostCpu cpu(files_, /*time_constant=*/1e-9, /*min_interval=*/0.25);
  Stat(100, 100);
  EXPECT_FALSE(cpu.Sample(0).has_value()) << "one read measures nothing";
  Stat(130, 110);  // 30 busy, 10 idle
  EXPECT_NEAR(*cpu.Sample(1), 0.25, 1e-9);
  Stat(130, 150);
  EXPECT_NEAR(*cpu.Sample(1.1), 0.25, 1e-9) << "within min_interval: not read again";
  EXPECT_NEAR(*cpu.Sample(2), 1.0, 1e-9);
}

// What this process itself uses is spare too: its re-preparations compete with its own work.
TEST_F(HostCpuTest, ThisProcesssOwnCpuCountsAsSpare) {
  HostCpu cpu(files_, 1e-9, 0.25);
  Stat(0, 0);
  cpu.Sample(0);
  Stat(90, 10);  // 90 busy of 100, 60 of them this process's
  Own(60);
  EXPECT_NEAR(*cpu.Sample(1), 0.7, 1e-9);
  Stat(190, 10);  // all busy, by others
  EXPECT_NEAR(*cpu.Sample(2), 0.0, 1e-9);
}

TEST_F(HostCpuTest, DecaysOverItsTimeConstant) {
  HostCpu cpu(files_, /*time_constant=*/2.0, /*min_interval=*/0.25);
  Stat(0, 0);
  cpu.Sample(0);
  Stat(0, 100);
  EXPECT_NEAR(*cpu.Sample(1), 1.0, 1e-9) << "the first measure is taken whole";
  Stat(100, 100);
  EXPECT_NEAR(*cpu.Sample(3), std::exp(-1.0), 1e-9) << "2 s of a busy CPU: 1/e of the idle left";
}

// A container's quota binds before the host's idle CPUs; the tightest quota on the way up wins,
// and its cgroup's usage is the one counted.
TEST_F(HostCpuTest, TheTightestCgroupQuotaBinds) {
  Write("cg/pod/ctr/cpu.max", "max 100000\n");
  Write("cg/pod/cpu.max", "150000 100000\n");  // 1.5 cores
  Write("cg/cpu.max", "400000 100000\n");
  HostCpu cpu(files_, 1e-9, 0.25);
  Stat(0, 0);  // the host idles throughout
  Write("cg/pod/cpu.stat", "usage_usec 1000000\nuser_usec 900000\n");
  Write("cg/pod/ctr/cpu.stat", "usage_usec 0\n");
  cpu.Sample(0);
  Stat(0, 1000);
  Write("cg/pod/cpu.stat", "usage_usec 2200000\n");  // 1.2 s of CPU in 1 s: 0.8 of 1.5 cores
  EXPECT_NEAR(*cpu.Sample(1), 0.2, 1e-9);
  Write("cg/pod/cpu.stat", "usage_usec 3400000\n");  // 1.2 s again, 0.3 s of it this process's
  Own(static_cast<int>(0.3 * sysconf(_SC_CLK_TCK)));
  Stat(0, 2000);
  EXPECT_NEAR(*cpu.Sample(2), 0.4, 1e-9);
  Own(static_cast<int>(0.3 * sysconf(_SC_CLK_TCK)));
  Write("cg/pod/cpu.stat", "usage_usec 5800000\n");  // over the quota (a burst): none spare
  Stat(0, 3000);
  EXPECT_NEAR(*cpu.Sample(3), 0.0, 1e-9);
}

TEST_F(HostCpuTest, WithoutQuotaOrCgroupV2TheHostAloneCounts) {
  Write("cgroup", "12:cpu,cpuacct:/docker/abc\n");  // cgroup v1
  Write("cg/cpu.max", "100000 100000\n");
  HostCpu cpu(files_, 1e-9, 0.25);
  Stat(0, 0);
  cpu.Sample(0);
  Stat(40, 60);
  EXPECT_NEAR(*cpu.Sample(1), 0.6, 1e-9);
}

TEST_F(HostCpuTest, NothingReadableMeansNotKnown) {
  files_.proc_stat = (root_ / "missing").string();
  HostCpu cpu(files_, 1e-9, 0.25);
  EXPECT_FALSE(cpu.Sample(0).has_value());
  EXPECT_FALSE(cpu.Sample(1).has_value());
  Write("missing", "garbage\n");
  EXPECT_FALSE(cpu.Sample(2).has_value());
}

// This machine's own /proc/self/stat is parsed: against a host the fake /proc/stat shows fully
// busy, only this process's CPU time (spent here spinning) can make a share spare.
TEST_F(HostCpuTest, TheRealProcSelfStatIsRead) {
  if (!fs::exists("/proc/self/stat")) GTEST_SKIP() << "no /proc/self/stat on this machine";
  files_.self_stat = "/proc/self/stat";
  HostCpu cpu(files_, 1e-9, 0.0);
  Stat(0, 0);
  cpu.Sample(0);
  const std::clock_t start = std::clock();
  volatile double spin = 0;
  // 0.1 s of CPU, against 1,000 s of ticks all busy.
  while (std::clock() - start < CLOCKS_PER_SEC / 10) spin = spin + 1;
  Stat(100000, 0);
  const std::optional<double> spare = cpu.Sample(1);
  ASSERT_TRUE(spare.has_value());
  EXPECT_GT(*spare, 0.0) << "this process's 0.1 s of CPU was not read from /proc/self/stat";
  EXPECT_LT(*spare, 0.01);
}

}  // namespace
}  // namespace carpool
