#include "datasets/state_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "datasets/temp_dir_for_test.h"

namespace carpool {
namespace {

// Sets environment variables for one test and restores them after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_;
  std::string old_;
};

TEST(StateDirTest, PrecedenceFlagEnvXdgHome) {
  TempDirForTest tmp;
  std::string home = (tmp.path() / "home").string(), xdg = (tmp.path() / "xdg").string();
  std::string env = (tmp.path() / "env").string(), flag = (tmp.path() / "flag").string();
  ScopedEnv h("HOME", home.c_str()), x("XDG_STATE_HOME", nullptr), c("CARPOOL_STATE_DIR", nullptr);
  EXPECT_EQ(*ResolveStateDir(""), tmp.path() / "home/.local/state/carpool");
  ScopedEnv x2("XDG_STATE_HOME", xdg.c_str());
  EXPECT_EQ(*ResolveStateDir(""), tmp.path() / "xdg/carpool");
  ScopedEnv c2("CARPOOL_STATE_DIR", env.c_str());
  EXPECT_EQ(*ResolveStateDir(""), tmp.path() / "env");
  Result<std::filesystem::path> f = ResolveStateDir(flag);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*f, tmp.path() / "flag");
  struct stat st;
  ASSERT_EQ(::stat(f->c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST(StateDirTest, FileInTheWayIsAnError) {
  TempDirForTest tmp;
  WriteTestFile(tmp.path() / "file", "x");
  Result<std::filesystem::path> r = ResolveStateDir((tmp.path() / "file").string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--state-dir"), std::string::npos);
}

}  // namespace
}  // namespace carpool
