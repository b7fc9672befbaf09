// Issue 10 item 7, access: a job of another user reaches a server only through `--group`. As root
// (CI), the test creates a group and an unprivileged user in it, starts one server with the
// default access (0600) and one with `--group`, and runs `carpool consume` as that user: refused
// by the first (a clear error, no hang), served by the second, refused by the second once the
// user's groups are dropped. Root starts the servers and generates the data set, so the user needs
// only to reach the `carpool` binary (copied into the test's 0755 temp dir when the build dir is
// closed to it) and the socket (the temp and state dirs are made 0755). Without root: skipped.
#include <grp.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <thread>

#include "tests/e2e_util.h"

namespace carpool::e2e {
namespace {

constexpr auto kNoHang = std::chrono::seconds(30);

// Runs argv (argv[0] a path) with output into dir/name.{out,err}; kills it after `timeout`, which
// is a failure of the test (code -1).
CliResult RunFor(const std::vector<std::string>& argv, const fs::path& dir, const std::string& name,
                 std::chrono::milliseconds timeout = kNoHang) {
  const fs::path out = dir / (name + ".out"), err = dir / (name + ".err");
  const pid_t pid = SpawnProcess(argv, out, err);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      ADD_FAILURE() << argv[0] << " (" << name << ") still ran after " << timeout.count()
                    << " ms: a hang";
      return {-1, Slurp(out), Slurp(err)};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), Slurp(out), Slurp(err)};
}

// A group G and a user U in it (supplementary; U's primary group is its own), both named after
// this process and deleted again at scope exit, also when the test fails.
class TestAccounts {
 public:
  explicit TestAccounts(const fs::path& log_dir)
      : log_dir_(log_dir),
        group_("carpool_t_" + std::to_string(::getpid())),
        user_("carpool_tu_" + std::to_string(::getpid())) {}
  ~TestAccounts() {
    if (user_made_) {  // its own primary group goes with it (USERGROUPS_ENAB)
      CliResult r = RunFor({"/usr/sbin/userdel", user_}, log_dir_, "userdel");
      if (r.code != 0) ADD_FAILURE() << "userdel " << user_ << " failed; remove it: " << r.err;
    }
    if (group_made_) {
      CliResult r = RunFor({"/usr/sbin/groupdel", group_}, log_dir_, "groupdel");
      if (r.code != 0) ADD_FAILURE() << "groupdel " << group_ << " failed; remove it: " << r.err;
    }
  }
  TestAccounts(const TestAccounts&) = delete;
  TestAccounts& operator=(const TestAccounts&) = delete;

  void Create() {
    CliResult g = RunFor({"/usr/sbin/groupadd", group_}, log_dir_, "groupadd");
    ASSERT_EQ(g.code, 0) << "groupadd " << group_ << ": " << g.err;
    group_made_ = true;
    CliResult u = RunFor({"/usr/sbin/useradd", "--no-create-home", "--shell", "/usr/sbin/nologin",
                          "--groups", group_, user_},
                         log_dir_, "useradd");
    ASSERT_EQ(u.code, 0) << "useradd " << user_ << ": " << u.err;
    user_made_ = true;
    const passwd* pw = ::getpwnam(user_.c_str());
    const struct group* gr = ::getgrnam(group_.c_str());
    ASSERT_TRUE(pw != nullptr && gr != nullptr);
    uid_ = pw->pw_uid;
    primary_gid_ = pw->pw_gid;
    gid_ = gr->gr_gid;
    ASSERT_NE(primary_gid_, gid_);
  }

  // argv run as U: with its groups (G among them), or with its primary group only.
  std::vector<std::string> AsUser(std::vector<std::string> argv, bool in_group) const {
    std::vector<std::string> full = {"/usr/bin/setpriv", "--reuid=" + std::to_string(uid_),
                                     "--regid=" + std::to_string(primary_gid_),
                                     in_group ? "--init-groups" : "--clear-groups", "--"};
    full.insert(full.end(), argv.begin(), argv.end());
    return full;
  }

  const std::string& group() const { return group_; }
  gid_t gid() const { return gid_; }

 private:
  fs::path log_dir_;
  std::string group_, user_;
  bool group_made_ = false, user_made_ = false;
  uid_t uid_ = 0;
  gid_t primary_gid_ = 0, gid_ = 0;
};

struct stat StatOf(const fs::path& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st;
}

// The socket and the cache segment of env's server have `mode` and group `gid`, owned by root.
void ExpectAccess(const E2eEnv& env, mode_t mode, gid_t gid) {
  const struct stat sock = StatOf(env.socket());
  EXPECT_TRUE(S_ISSOCK(sock.st_mode));
  EXPECT_EQ(sock.st_mode & 0777, mode) << env.socket();
  EXPECT_EQ(sock.st_uid, 0u);
  EXPECT_EQ(sock.st_gid, gid) << env.socket();
  const std::vector<std::string> segments = env.Segments();
  ASSERT_EQ(segments.size(), 1u) << "the cache segment only, before any job";
  const struct stat cache = StatOf(fs::path("/dev/shm") / segments[0]);
  EXPECT_EQ(cache.st_mode & 0777, mode) << segments[0];
  EXPECT_EQ(cache.st_uid, 0u);
  EXPECT_EQ(cache.st_gid, gid) << segments[0];
}

// A carpool binary the user can run: the build's, or else a copy in `dir` (0755).
std::string BinaryForUser(const TestAccounts& accounts, const fs::path& dir) {
  CliResult direct = RunFor(accounts.AsUser({CarpoolBin(), "--help"}, true), dir, "bin-check");
  if (direct.code == 0) return CarpoolBin();
  const fs::path copy = dir / "carpool";
  fs::copy_file(CarpoolBin(), copy, fs::copy_options::overwrite_existing);
  fs::permissions(copy, fs::perms(0755));
  CliResult copied = RunFor(accounts.AsUser({copy.string(), "--help"}, true), dir, "bin-copy");
  EXPECT_EQ(copied.code, 0) << "the test user can run neither " << CarpoolBin() << " ("
                            << direct.err << ") nor a copy in " << dir << " (" << copied.err
                            << "); make the build dir's parents world-searchable (chmod o+x)";
  return copy.string();
}

// A server with `server_args`, on 40 generated 32x32 JPEGs ("gen"), in a temp dir everyone may
// enter (so that only the socket's own mode decides).
void StartServerOnImages(E2eEnv& env, std::vector<std::string> server_args) {
  fs::permissions(env.dir(), fs::perms(0755));
  fs::permissions(env.state(), fs::perms(0755));
  ASSERT_NO_FATAL_FAILURE(env.GenImages(env.dir() / "images", 40, "32x32"));
  ASSERT_NO_FATAL_FAILURE(env.Dataset(
      {"add", "gen", "--dir", (env.dir() / "images").string(), "--prepare", "resize=32,crop=32"}));
  ASSERT_NO_FATAL_FAILURE(env.StartServer(std::move(server_args)));
}

// `carpool consume` of 2 epochs of "gen" in batches of 8 (10 batches) on env's server.
std::vector<std::string> ConsumeArgs(const std::string& bin, const E2eEnv& env, int step_ms) {
  std::vector<std::string> argv = {bin, "consume", "--socket", env.socket().string()};
  for (const char* arg : {"--dataset", "gen", "--batch-size", "8", "--epochs", "2", "--json"}) {
    argv.push_back(arg);
  }
  argv.push_back("--step-ms=" + std::to_string(step_ms));
  return argv;
}

void ExpectRefused(const CliResult& r, const std::string& what) {
  EXPECT_EQ(r.code, 1) << what << ": " << r.out << r.err;
  EXPECT_NE(r.err.find("is not open to this user (Permission denied)"), std::string::npos)
      << what << ": " << r.err;
  EXPECT_NE(r.err.find("--group"), std::string::npos) << what << ": " << r.err;
}

TEST(E2eAccessTest, AnotherUserReachesTheServerOnlyThroughItsGroup) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "not run: needs root to create a test user and group (useradd, groupadd, "
                    "setpriv); CI runs it as root";
  }
  TempDirForTest logs;
  fs::permissions(logs.path(), fs::perms(0755));
  TestAccounts accounts(logs.path());  // outlives the servers below, which it must not run under
  ASSERT_NO_FATAL_FAILURE(accounts.Create());
  const std::string bin = BinaryForUser(accounts, logs.path());
  ASSERT_FALSE(::testing::Test::HasFailure());

  // The default: owner only. The user, though in a group, is refused at once.
  E2eEnv closed;
  ASSERT_NO_FATAL_FAILURE(StartServerOnImages(closed, {}));
  ExpectAccess(closed, 0600, ::getegid());
  ExpectRefused(RunFor(accounts.AsUser(ConsumeArgs(bin, closed, 0), true), logs.path(), "closed"),
                "a user of the group against the 0600 server");
  std::printf("refused by the 0600 server: %s", Slurp(logs.path() / "closed.err").c_str());

  // --group G: 0660 and group G for the socket, the cache segment and each batch segment.
  E2eEnv shared;
  ASSERT_NO_FATAL_FAILURE(StartServerOnImages(shared, {"--group", accounts.group()}));
  ExpectAccess(shared, 0660, accounts.gid());
  EXPECT_EQ(shared.ServerLog().find("does not let them in"), std::string::npos)
      << shared.ServerLog();
  const pid_t job = SpawnProcess(accounts.AsUser(ConsumeArgs(bin, shared, 50), true),
                                 logs.path() / "member.out", logs.path() / "member.err");
  std::optional<struct stat> batch_segment;  // stat while the job runs: removed with the job
  const auto deadline = std::chrono::steady_clock::now() + kNoHang;
  // The server creates a segment, then gives it the group and mode (fchown, fchmod) before any
  // client hears of it; a stat in between sees 0600 (one fresh-clone CI run did), so look until
  // the mode is final or the time is up.
  const auto settled = [&] {
    return batch_segment && (batch_segment->st_mode & 0777) == 0660 &&
           batch_segment->st_gid == accounts.gid();
  };
  while (!settled() && std::chrono::steady_clock::now() < deadline) {
    for (const std::string& s : shared.Segments()) {
      struct stat st {};
      if (s.find("-job-") != std::string::npos && ::stat(("/dev/shm/" + s).c_str(), &st) == 0) {
        batch_segment = st;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  int status = 0;
  EXPECT_EQ(::waitpid(job, &status, 0), job);
  const std::string member_out = Slurp(logs.path() / "member.out");
  const std::string member_err = Slurp(logs.path() / "member.err");
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << member_err;
  EXPECT_EQ(JsonNumber(member_out, "batches"), 10) << member_out;
  EXPECT_EQ(JsonNumber(member_out, "samples"), 80) << member_out;
  EXPECT_EQ(JsonNumber(member_out, "skipped"), 0) << member_out;
  ASSERT_TRUE(batch_segment.has_value()) << "never saw the job's batch segment";
  EXPECT_EQ(batch_segment->st_mode & 0777, 0660u);
  EXPECT_EQ(batch_segment->st_gid, accounts.gid());
  std::printf("served by the --group %s server: %s", accounts.group().c_str(), member_out.c_str());

  // The same user without its groups is refused by the --group server too.
  ExpectRefused(RunFor(accounts.AsUser(ConsumeArgs(bin, shared, 0), false), logs.path(), "dropped"),
                "the user without group " + accounts.group());
  std::printf("refused without the group: %s", Slurp(logs.path() / "dropped.err").c_str());

  // Bad --group values stop the server at start with one line naming the value.
  const std::string nosuch = "carpool_nosuch_" + std::to_string(::getpid());
  CliResult unknown =
      RunFor({bin, "server", "--group", nosuch, "--socket", (logs.path() / "x.sock").string()},
             logs.path(), "unknown-group");
  EXPECT_EQ(unknown.code, 1);
  EXPECT_NE(unknown.err.find("carpool server: --group '" + nosuch +
                             "' is not a group on this machine (getent group " + nosuch +
                             "); create it or pick one of the groups you are in"),
            std::string::npos)
      << unknown.err;
  CliResult not_member = RunFor(accounts.AsUser({bin, "server", "--group", accounts.group(),
                                                 "--socket", (logs.path() / "y.sock").string()},
                                                false),
                                logs.path(), "not-member");
  EXPECT_EQ(not_member.code, 1);
  EXPECT_NE(not_member.err.find("is neither root nor in that group"), std::string::npos)
      << not_member.err;
  std::printf("unknown group: %sserver run by a non-member: %s", unknown.err.c_str(),
              not_member.err.c_str());
}

}  // namespace
}  // namespace carpool::e2e
