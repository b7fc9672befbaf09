#include "cache/client_access.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace carpool::cache {
namespace {

namespace fs = std::filesystem;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A fresh directory under the temp dir, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "carpool-access-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data()) != nullptr ? tmpl : std::string();
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

TEST(ClientAccessTest, DefaultIsOwnerOnly) {
  EXPECT_FALSE(ClientAccess{}.group.has_value());
  EXPECT_EQ(ClientAccess{}.mode(), 0600u);
  EXPECT_EQ(ClientAccess{::getegid()}.mode(), 0660u);
}

TEST(ClientAccessTest, ResolvesOwnGroupByNameAndNumber) {
  const struct group* own = ::getgrgid(::getegid());
  ASSERT_NE(own, nullptr);
  Result<ClientAccess> by_name = ResolveClientGroup(own->gr_name);
  ASSERT_TRUE(by_name.ok()) << by_name.status().ToString();
  EXPECT_EQ(by_name->group, ::getegid());
  Result<ClientAccess> by_number = ResolveClientGroup(std::to_string(::getegid()));
  ASSERT_TRUE(by_number.ok()) << by_number.status().ToString();
  EXPECT_EQ(by_number->group, ::getegid());
}

TEST(ClientAccessTest, UnknownGroupNamesTheValueAndWhatToDo) {
  const std::string name = fmt::format("carpool_nosuch_{}", ::getpid());
  for (const std::string& bad :
       {name, std::string(""), std::string("12x"), std::string("4294967295")}) {
    Result<ClientAccess> r = ResolveClientGroup(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(r.status().message(),
                         fmt::format("--group '{}' is not a group on this machine (getent group "
                                     "{}); create it or pick one of the groups you are in (id -Gn:",
                                     bad, bad)))
        << r.status().message();
  }
}

TEST(ClientAccessTest, GroupOfWhichThisUserIsNoMemberIsRefused) {
  if (::geteuid() == 0) GTEST_SKIP() << "root may give files to any group";
  // A gid this process is not in: none of its groups, and not (gid_t)-1.
  std::vector<gid_t> own(::getgroups(0, nullptr));
  own.resize(::getgroups(static_cast<int>(own.size()), own.data()));
  own.push_back(::getegid());
  gid_t other = 0;
  while (std::find(own.begin(), own.end(), other) != own.end()) ++other;
  Result<ClientAccess> r = ResolveClientGroup(std::to_string(other));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "is neither root nor in that group"))
      << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), "usermod -aG")) << r.status().message();
}

TEST(ClientAccessTest, AppliesGroupAndModeToAPath) {
  TempDir tmp;
  const fs::path file = tmp.path() / "f";
  std::ofstream(file) << "x";
  ASSERT_TRUE(ApplyClientAccess(file.string(), ClientAccess{::getegid()}).ok());
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, ::getegid());
  Status missing = ApplyClientAccess((tmp.path() / "none").string(), ClientAccess{});
  EXPECT_FALSE(missing.ok());
  EXPECT_TRUE(Contains(missing.message(), "cannot set mode 600 on the socket"))
      << missing.message();
}

TEST(ClientAccessTest, FindsTheDirectoryClosedToTheGroup) {
  TempDir tmp;
  fs::permissions(tmp.path(), fs::perms(0755));
  const fs::path dir = tmp.path() / "state";
  fs::create_directories(dir);
  const std::string socket = (dir / "carpool.sock").string();
  // The directories above the temp dir: whatever they are, they are the same in each case.
  const std::string above = FirstDirClosedToGroup(tmp.path().string() + "/x", ::getegid());
  if (!above.empty()) GTEST_SKIP() << above << " is closed already; cannot test below it";

  fs::permissions(dir, fs::perms(0700));
  EXPECT_EQ(FirstDirClosedToGroup(socket, ::getegid()), dir.string());
  fs::permissions(dir, fs::perms(0710));  // the dir's group is ours: group x lets members in
  EXPECT_EQ(FirstDirClosedToGroup(socket, ::getegid()), "");
  // For a group that is not the dir's, only the others' x counts.
  EXPECT_EQ(FirstDirClosedToGroup(socket, ::getegid() + 1), dir.string());
  fs::permissions(dir, fs::perms(0701));
  EXPECT_EQ(FirstDirClosedToGroup(socket, ::getegid() + 1), "");
  EXPECT_EQ(FirstDirClosedToGroup(socket, ::getegid()), dir.string());
}

}  // namespace
}  // namespace carpool::cache
