#include "datasets/state_dir.h"

#include <fmt/core.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>

namespace carpool {

namespace {

std::string EnvOrEmpty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace

Result<std::filesystem::path> ResolveStateDir(std::string_view flag_value) {
  namespace fs = std::filesystem;
  fs::path dir;
  std::string origin;
  if (!flag_value.empty()) {
    dir = fs::path(flag_value);
    origin = "--state-dir";
  } else if (std::string env = EnvOrEmpty("CARPOOL_STATE_DIR"); !env.empty()) {
    dir = env;
    origin = "$CARPOOL_STATE_DIR";
  } else if (std::string xdg = EnvOrEmpty("XDG_STATE_HOME"); !xdg.empty()) {
    dir = fs::path(xdg) / "carpool";
    origin = "$XDG_STATE_HOME";
  } else if (std::string home = EnvOrEmpty("HOME"); !home.empty()) {
    dir = fs::path(home) / ".local" / "state" / "carpool";
    origin = "$HOME";
  } else {
    return Status::FailedPrecondition(
        "no state dir: none of --state-dir, $CARPOOL_STATE_DIR, $XDG_STATE_HOME or $HOME is set; "
        "pass --state-dir DIR");
  }
  std::error_code ec;
  dir = fs::absolute(dir, ec);
  if (ec) {
    return Status::IOError(
        fmt::format("state dir \"{}\" (from {}): {}", dir.string(), origin, ec.message()));
  }
  if (!dir.parent_path().empty()) fs::create_directories(dir.parent_path(), ec);
  if (!ec && ::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    ec = std::error_code(errno, std::generic_category());
  }
  if (ec || !fs::is_directory(dir)) {
    return Status::IOError(
        fmt::format("cannot create state dir \"{}\" (from {}): {}; pass a writable --state-dir",
                    dir.string(), origin, ec ? ec.message() : "exists and is not a directory"));
  }
  return dir;
}

}  // namespace carpool
