#include "cache/client_access.h"

#include <errno.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <vector>

namespace carpool::cache {
namespace {

// One getgrnam_r/getgrgid_r call, with a buffer grown until the entry fits. nullopt: no entry.
template <typename Lookup>
std::optional<group> LookUpGroup(Lookup lookup, std::vector<char>& buf) {
  buf.resize(1024);
  for (;;) {
    group g{};
    group* found = nullptr;
    const int err = lookup(&g, buf.data(), buf.size(), &found);
    if (err == ERANGE && buf.size() < (1u << 20)) {
      buf.resize(buf.size() * 2);
      continue;
    }
    if (err != 0 || found == nullptr) return std::nullopt;
    return g;
  }
}

std::optional<gid_t> GroupId(const std::string& name) {
  std::vector<char> buf;
  std::optional<group> g =
      LookUpGroup([&](group* g, char* b, size_t n,
                      group** r) { return ::getgrnam_r(name.c_str(), g, b, n, r); },
                  buf);
  if (!g) return std::nullopt;
  return g->gr_gid;
}

// The group's name, or its number when it has none.
std::string GroupName(gid_t gid) {
  std::vector<char> buf;
  std::optional<group> g = LookUpGroup(
      [&](group* g, char* b, size_t n, group** r) { return ::getgrgid_r(gid, g, b, n, r); }, buf);
  return g ? std::string(g->gr_name) : std::to_string(gid);
}

std::string UserName() {
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (::getpwuid_r(::geteuid(), &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr) {
    return pw.pw_name;
  }
  return std::to_string(::geteuid());
}

// The effective group and the supplementary groups of this process.
std::vector<gid_t> OwnGroups() {
  std::vector<gid_t> groups(std::max(0, ::getgroups(0, nullptr)));
  groups.resize(std::max(0, ::getgroups(static_cast<int>(groups.size()), groups.data())));
  groups.push_back(::getegid());
  return groups;
}

// "id -Gn: a b c", for errors that suggest a group.
std::string OwnGroupNames() {
  std::vector<std::string> names;
  for (gid_t g : OwnGroups()) {
    std::string name = GroupName(g);
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return fmt::format("id -Gn: {}", fmt::join(names, " "));
}

}  // namespace

Result<ClientAccess> ResolveClientGroup(std::string_view value) {
  const std::string text(value);
  std::optional<gid_t> gid = GroupId(text);
  if (!gid) {
    gid_t number = 0;
    const char* end = text.data() + text.size();
    auto [at, ec] = std::from_chars(text.data(), end, number);
    // (gid_t)-1 means "leave the group as it is" to chown, never a group.
    if (!text.empty() && ec == std::errc() && at == end && number != static_cast<gid_t>(-1)) {
      gid = number;
    }
  }
  if (!gid) {
    return Status::InvalidArgument(fmt::format(
        "--group '{}' is not a group on this machine (getent group {}); create it or pick one of "
        "the groups you are in ({})",
        text, text, OwnGroupNames()));
  }
  const std::vector<gid_t> own = OwnGroups();
  if (::geteuid() != 0 && std::find(own.begin(), own.end(), *gid) == own.end()) {
    const std::string user = UserName();
    return Status::InvalidArgument(fmt::format(
        "--group '{}' (gid {}): user {} is neither root nor in that group, so the server may not "
        "give its socket to it; add the user (usermod -aG {} {}, then log in "
        "again) or pick one of the groups you are in ({})",
        text, *gid, user, GroupName(*gid), user, OwnGroupNames()));
  }
  return ClientAccess{*gid};
}

Status ApplyClientAccess(const std::string& path, const ClientAccess& access) {
  const std::string what = fmt::format("the socket {}", path);
  if (access.group && ::chown(path.c_str(), static_cast<uid_t>(-1), *access.group) != 0) {
    return Status::IOError(fmt::format(
        "cannot give {} to group {} (gid {}): {}; the server's user must be root or in the group",
        what, GroupName(*access.group), *access.group, std::strerror(errno)));
  }
  if (::chmod(path.c_str(), access.mode()) != 0) {
    return Status::IOError(
        fmt::format("cannot set mode {:o} on {}: {}", access.mode(), what, std::strerror(errno)));
  }
  return Status::OK();
}

std::string FirstDirClosedToGroup(const std::string& path, gid_t group) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path file = fs::absolute(path, ec);
  if (ec) return "";
  std::vector<fs::path> dirs;  // from the file's directory up to the root
  for (fs::path d = file.parent_path(); !d.empty(); d = d.parent_path()) {
    dirs.push_back(d);
    if (d == d.root_path()) break;
  }
  for (auto d = dirs.rbegin(); d != dirs.rend(); ++d) {
    struct stat st {};
    if (::stat(d->c_str(), &st) != 0) continue;
    const bool searchable = st.st_gid == group ? (st.st_mode & S_IXGRP) : (st.st_mode & S_IXOTH);
    if (!searchable) return d->string();
  }
  return "";
}

}  // namespace carpool::cache
