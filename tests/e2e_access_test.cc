// Issue 10 item 7, access: a job of another user reaches a server only through `--group`. As root
// (CI), the test creates a group and an unprivileged user in it, starts one server with the
// default access (0600) and one with `--group`, and runs `carpool consume` as that user: refused
// by the first (a clear error, no hang), served by the second, refused by the second once the
// user's groups are dropped. Root starts the servers and generates the data set, so the user needs
// only to reach the `carpool` binary (copied into the test's 0755 temp dir when the build dir is
// closed to it) and the socket (the temp and state dirs are made 0755). Issue 21 item 7, least
// privilege: --group opens the socket only. Two members' jobs on one server cannot open each
// other's batch segments (memfds passed to each job's process alone) or the cache (0600), and
// both still get each epoch exactly once. Without root: skipped.
#include <fcntl.h>
#include <fmt/core.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>

#include "server/batch_pool.h"
#include "server/instance_name.h"
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

// A group G and users U0..Un-1 in it (supplementary; each user's primary group is its own), all
// named after this process and deleted again at scope exit, also when the test fails.
class TestAccounts {
 public:
  TestAccounts(const fs::path& log_dir, int users)
      : log_dir_(log_dir), group_("carpool_t_" + std::to_string(::getpid())) {
    for (int i = 0; i < users; ++i) {
      users_.push_back({fmt::format("carpool_tu{}_{}", i, ::getpid())});
    }
  }
  ~TestAccounts() {
    for (const User& u : users_) {
      if (!u.made) continue;  // its own primary group goes with it (USERGROUPS_ENAB)
      CliResult r = RunFor({"/usr/sbin/userdel", u.name}, log_dir_, "userdel");
      if (r.code != 0) ADD_FAILURE() << "userdel " << u.name << " failed; remove it: " << r.err;
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
    const struct group* gr = ::getgrnam(group_.c_str());
    ASSERT_TRUE(gr != nullptr);
    gid_ = gr->gr_gid;
    for (User& user : users_) {
      CliResult u = RunFor({"/usr/sbin/useradd", "--no-create-home", "--shell", "/usr/sbin/nologin",
                            "--groups", group_, user.name},
                           log_dir_, "useradd");
      ASSERT_EQ(u.code, 0) << "useradd " << user.name << ": " << u.err;
      user.made = true;
      const passwd* pw = ::getpwnam(user.name.c_str());
      ASSERT_TRUE(pw != nullptr);
      user.uid = pw->pw_uid;
      user.primary_gid = pw->pw_gid;
      ASSERT_NE(user.primary_gid, gid_);
    }
  }

  // argv run as user i: with its groups (G among them), or with its primary group only.
  std::vector<std::string> AsUser(std::vector<std::string> argv, bool in_group, int i = 0) const {
    const User& u = users_[i];
    std::vector<std::string> full = {"/usr/bin/setpriv", "--reuid=" + std::to_string(u.uid),
                                     "--regid=" + std::to_string(u.primary_gid),
                                     in_group ? "--init-groups" : "--clear-groups", "--"};
    full.insert(full.end(), argv.begin(), argv.end());
    return full;
  }

  const std::string& group() const { return group_; }
  gid_t gid() const { return gid_; }
  uid_t uid(int i) const { return users_[i].uid; }
  gid_t primary_gid(int i) const { return users_[i].primary_gid; }

 private:
  struct User {
    std::string name;
    bool made = false;
    uid_t uid = 0;
    gid_t primary_gid = 0;
  };
  fs::path log_dir_;
  std::string group_;
  bool group_made_ = false;
  gid_t gid_ = 0;
  std::vector<User> users_;
};

struct stat StatOf(const fs::path& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st;
}

// The socket of env's server has `mode` and group `gid`; its cache segment is the server's alone
// (0600) whatever the socket's access. Both owned by root.
void ExpectAccess(const E2eEnv& env, mode_t mode, gid_t gid) {
  const struct stat sock = StatOf(env.socket());
  EXPECT_TRUE(S_ISSOCK(sock.st_mode));
  EXPECT_EQ(sock.st_mode & 0777, mode) << env.socket();
  EXPECT_EQ(sock.st_uid, 0u);
  EXPECT_EQ(sock.st_gid, gid) << env.socket();
  const std::vector<std::string> segments = env.Segments();
  ASSERT_EQ(segments.size(), 1u) << "the cache segment only, before any job";
  const struct stat cache = StatOf(fs::path("/dev/shm") / segments[0]);
  EXPECT_EQ(cache.st_mode & 0777, 0600u) << segments[0];
  EXPECT_EQ(cache.st_uid, 0u);
  EXPECT_EQ(cache.st_gid, ::getegid()) << segments[0];
}

// The links to batch segments of env's server that root can see: names in /dev/shm, and the
// memfds in the fd and map_files folders of the server and of `clients`.
std::vector<std::string> BatchSegmentPaths(const E2eEnv& env, const std::vector<pid_t>& clients) {
  const std::string instance = InstanceNameForSocket(env.socket().string());
  std::vector<std::string> paths;
  for (const std::string& s : env.Segments()) {
    if (s.find("-job-") != std::string::npos) paths.push_back("/dev/shm/" + s);
  }
  std::vector<std::string> dirs = {fmt::format("/proc/{}/fd", env.server_pid())};
  for (pid_t pid : clients) {
    dirs.push_back(fmt::format("/proc/{}/fd", pid));
    dirs.push_back(fmt::format("/proc/{}/map_files", pid));
  }
  for (const std::string& dir : dirs) {
    for (std::string& link : BatchPool::SegmentLinks(dir, instance)) paths.push_back(link);
  }
  return paths;
}

// How user i of `accounts`, with its groups, fares opening each of `paths`: 'w' read-write, 'r'
// read-only, '-' neither. From a forked child that takes on the user's ids, as setpriv does.
std::string OpenAs(const TestAccounts& accounts, int i, const std::vector<std::string>& paths) {
  int out[2];
  if (::pipe(out) != 0) return "pipe failed";
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(out[0]);
    const gid_t groups[] = {accounts.primary_gid(i), accounts.gid()};
    if (::setgroups(2, groups) != 0 ||
        ::setresgid(accounts.primary_gid(i), accounts.primary_gid(i), accounts.primary_gid(i)) !=
            0 ||
        ::setresuid(accounts.uid(i), accounts.uid(i), accounts.uid(i)) != 0) {
      ::_exit(2);
    }
    for (const std::string& path : paths) {
      char result = '-';
      if (int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC); fd >= 0) {
        result = 'w';
        ::close(fd);
      } else if (fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
        result = 'r';
        ::close(fd);
      }
      if (::write(out[1], &result, 1) != 1) ::_exit(3);
    }
    ::_exit(0);
  }
  ::close(out[1]);
  std::string results;
  char c;
  while (::read(out[0], &c, 1) == 1) results.push_back(c);
  ::close(out[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "the child could not become the user";
  return results;
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

// Root only (else skipped): a log folder everyone may read, and test accounts with a carpool
// binary they can run. The accounts outlive each test's servers, which must not run under them.
class E2eAccessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) {
      GTEST_SKIP() << "not run: needs root to create test users and a group (useradd, groupadd, "
                      "setpriv); CI runs it as root";
    }
    fs::permissions(logs_.path(), fs::perms(0755));
  }
  void CreateAccounts(int users) {
    accounts_ = std::make_unique<TestAccounts>(logs_.path(), users);
    ASSERT_NO_FATAL_FAILURE(accounts_->Create());
    bin_ = BinaryForUser(*accounts_, logs_.path());
    ASSERT_FALSE(HasFailure());
  }

  TempDirForTest logs_;
  std::unique_ptr<TestAccounts> accounts_;
  std::string bin_;
};

TEST_F(E2eAccessTest, AnotherUserReachesTheServerOnlyThroughItsGroup) {
  ASSERT_NO_FATAL_FAILURE(CreateAccounts(1));

  // The default: owner only. The user, though in a group, is refused at once.
  E2eEnv closed;
  ASSERT_NO_FATAL_FAILURE(StartServerOnImages(closed, {}));
  ExpectAccess(closed, 0600, ::getegid());
  ExpectRefused(
      RunFor(accounts_->AsUser(ConsumeArgs(bin_, closed, 0), true), logs_.path(), "closed"),
      "a user of the group against the 0600 server");
  std::printf("refused by the 0600 server: %s", Slurp(logs_.path() / "closed.err").c_str());

  // --group G: 0660 and group G for the socket only. The job's batch segment is a memfd that the
  // server holds at 0600 and sends to the job's process alone: nothing of it in /dev/shm.
  E2eEnv shared;
  ASSERT_NO_FATAL_FAILURE(StartServerOnImages(shared, {"--group", accounts_->group()}));
  ExpectAccess(shared, 0660, accounts_->gid());
  EXPECT_EQ(shared.ServerLog().find("does not let them in"), std::string::npos)
      << shared.ServerLog();
  const pid_t job = SpawnProcess(accounts_->AsUser(ConsumeArgs(bin_, shared, 50), true),
                                 logs_.path() / "member.out", logs_.path() / "member.err");
  std::optional<struct stat> batch_segment;  // stat while the job runs: closed with the job
  std::vector<std::string> named;            // batch segments seen in /dev/shm: none, ever
  const auto deadline = std::chrono::steady_clock::now() + kNoHang;
  int status = 0;
  pid_t reaped = 0;
  while (reaped == 0 && std::chrono::steady_clock::now() < deadline) {
    reaped = ::waitpid(job, &status, WNOHANG);
    for (const std::string& path : BatchSegmentPaths(shared, {})) {
      struct stat st {};
      if (path.rfind("/dev/shm/", 0) == 0) {
        named.push_back(path);
      } else if (::stat(path.c_str(), &st) == 0) {
        batch_segment = st;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (reaped == 0) reaped = ::waitpid(job, &status, 0);
  EXPECT_EQ(reaped, job);
  const std::string member_out = Slurp(logs_.path() / "member.out");
  const std::string member_err = Slurp(logs_.path() / "member.err");
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << member_err;
  EXPECT_EQ(JsonNumber(member_out, "batches"), 10) << member_out;
  EXPECT_EQ(JsonNumber(member_out, "samples"), 80) << member_out;
  EXPECT_EQ(JsonNumber(member_out, "skipped"), 0) << member_out;
  EXPECT_TRUE(named.empty()) << "a batch segment was named in /dev/shm: " << named.front();
  ASSERT_TRUE(batch_segment.has_value()) << "never saw the server hold the job's batch segment";
  EXPECT_EQ(batch_segment->st_mode & 0777, 0600u);
  EXPECT_EQ(batch_segment->st_uid, 0u);
  std::printf("served by the --group %s server: %s", accounts_->group().c_str(),
              member_out.c_str());

  // The same user without its groups is refused by the --group server too.
  ExpectRefused(
      RunFor(accounts_->AsUser(ConsumeArgs(bin_, shared, 0), false), logs_.path(), "dropped"),
      "the user without group " + accounts_->group());
  std::printf("refused without the group: %s", Slurp(logs_.path() / "dropped.err").c_str());

  // Bad --group values stop the server at start with one line naming the value.
  const std::string nosuch = "carpool_nosuch_" + std::to_string(::getpid());
  CliResult unknown =
      RunFor({bin_, "server", "--group", nosuch, "--socket", (logs_.path() / "x.sock").string()},
             logs_.path(), "unknown-group");
  EXPECT_EQ(unknown.code, 1);
  EXPECT_NE(unknown.err.find("carpool server: --group '" + nosuch +
                             "' is not a group on this machine (getent group " + nosuch +
                             "); create it or pick one of the groups you are in"),
            std::string::npos)
      << unknown.err;
  CliResult not_member = RunFor(accounts_->AsUser({bin_, "server", "--group", accounts_->group(),
                                                   "--socket", (logs_.path() / "y.sock").string()},
                                                  false),
                                logs_.path(), "not-member");
  EXPECT_EQ(not_member.code, 1);
  EXPECT_NE(not_member.err.find("is neither root nor in that group"), std::string::npos)
      << not_member.err;
  std::printf("unknown group: %sserver run by a non-member: %s", unknown.err.c_str(),
              not_member.err.c_str());
}

// Issue 21 item 7, least privilege: two members of one --group server share it, but neither can
// open, read or write the other's batch segment or the cache (the old 0660 segments let them:
// one member could read another's batches and corrupt every job's samples in the cache). Both
// still get each epoch exactly once.
TEST_F(E2eAccessTest, MembersCannotOpenEachOthersBatchesOrTheCache) {
  ASSERT_NO_FATAL_FAILURE(CreateAccounts(2));
  E2eEnv env;
  ASSERT_NO_FATAL_FAILURE(StartServerOnImages(env, {"--group", accounts_->group()}));
  const std::vector<std::string> names = env.Segments();
  ASSERT_EQ(names.size(), 1u) << "the cache segment only, before any job";
  const std::string cache = "/dev/shm/" + names[0];

  // Each user's job writes its ids into a folder of its own; 300 ms steps keep both running
  // (10 batches each) while the other tries their segments.
  std::vector<pid_t> jobs;
  for (int i = 0; i < 2; ++i) {
    const fs::path own = env.dir() / fmt::format("user{}", i);
    fs::create_directories(own);
    ASSERT_EQ(::chown(own.c_str(), accounts_->uid(i), accounts_->primary_gid(i)), 0) << own;
    std::vector<std::string> argv = ConsumeArgs(bin_, env, 300);
    argv.insert(argv.end(), {"--ids-out", (own / "ids.csv").string()});
    jobs.push_back(SpawnProcess(accounts_->AsUser(argv, true, i),
                                logs_.path() / fmt::format("user{}.out", i),
                                logs_.path() / fmt::format("user{}.err", i)));
  }
  // Both jobs' segments, wherever root can see them: named in /dev/shm, or held as memfds. The
  // names, or else the server's descriptors, are one per job.
  const std::string server_fds = fmt::format("/proc/{}/fd/", env.server_pid());
  const auto one_per_job = [&](const std::string& p) {
    return p.rfind("/dev/shm/", 0) == 0 || p.rfind(server_fds, 0) == 0;
  };
  std::vector<std::string> segments;
  const auto deadline = std::chrono::steady_clock::now() + kNoHang;
  while (std::count_if(segments.begin(), segments.end(), one_per_job) < 2 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    segments = BatchSegmentPaths(env, jobs);
  }
  ASSERT_GE(std::count_if(segments.begin(), segments.end(), one_per_job), 2)
      << "never saw both jobs' batch segments";
  for (int i = 0; i < 2; ++i) {
    // Every way to a segment but the user's own process, and the cache.
    std::vector<std::string> paths = {cache};
    const std::string own = fmt::format("/proc/{}/", jobs[i]);
    for (const std::string& p : segments) {
      if (p.rfind(own, 0) != 0) paths.push_back(p);
    }
    const std::string results = OpenAs(*accounts_, i, paths);
    ASSERT_EQ(results.size(), paths.size()) << results;
    for (size_t k = 0; k < paths.size(); ++k) {
      EXPECT_EQ(results[k], '-') << "user " << i << " could open " << paths[k] << " "
                                 << (results[k] == 'w' ? "read-write" : "read-only");
    }
    std::printf("user %d, a member of %s, tried %zu ways to the cache and the batch segments: %s\n",
                i, accounts_->group().c_str(), paths.size(), results.c_str());
  }
  for (int i = 0; i < 2; ++i) {
    int status = 0;
    EXPECT_EQ(::waitpid(jobs[i], &status, 0), jobs[i]);
    const std::string out = Slurp(logs_.path() / fmt::format("user{}.out", i));
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << Slurp(logs_.path() / fmt::format("user{}.err", i));
    EXPECT_EQ(JsonNumber(out, "batches"), 10) << out;
    CheckEpochs(env, "gen", fmt::format("user{}/ids.csv", i), 2);
  }
}

}  // namespace
}  // namespace carpool::e2e
