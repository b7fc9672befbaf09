// `carpool report FILE [--out PNG]`: runs the Python package's report (client/python/carpool/
// report.py, matplotlib) on a series that `carpool status --watch S --json-lines FILE` recorded.
// The plotting lives in Python; this command finds report.py and an interpreter for it.
#include <fmt/core.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tools/command.h"

namespace carpool::tools {
namespace {

namespace fs = std::filesystem;

// Where the package is, and the interpreter that layout implies (empty: none implied).
struct PythonPackage {
  fs::path pythonpath;  // the folder holding carpool/report.py
  std::string python;
};

// The layouts, first hit wins: the platform wheel (carpool/bin/carpool beside carpool/report.py),
// the bundle (bin/carpool, python/carpool/), the source tree this binary was built from.
std::optional<PythonPackage> FindPackage(std::vector<std::string>* tried) {
  std::error_code ec;
  const fs::path exe_dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  const fs::path wheel = exe_dir.parent_path().parent_path();
  const fs::path bundle = exe_dir.parent_path() / "python";
  const fs::path source = CARPOOL_SOURCE_PYTHON_DIR;
  for (const fs::path& dir : {wheel, bundle, source}) {
    tried->push_back((dir / "carpool" / "report.py").string());
    if (ec || !fs::exists(dir / "carpool" / "report.py")) continue;
    PythonPackage found{dir, ""};
    // A wheel in <prefix>/lib/pythonX.Y/site-packages (a venv): that prefix's own interpreter.
    const fs::path prefix_python = dir.parent_path().parent_path().parent_path() / "bin/python3";
    if (dir == wheel && dir.filename() == "site-packages" && fs::exists(prefix_python)) {
      found.python = prefix_python.string();
    }
    if (dir == source && fs::exists(CARPOOL_SOURCE_PYTHON)) found.python = CARPOOL_SOURCE_PYTHON;
    return found;
  }
  return std::nullopt;
}

int RunReport(int argc, char** argv) {
  std::vector<std::string> tried;
  std::optional<PythonPackage> package = FindPackage(&tried);
  if (!package) {
    std::string list;
    for (const std::string& t : tried) list += (list.empty() ? "" : ", ") + t;
    fmt::print(stderr,
               "carpool report: the Python package's report was not found (looked for {}); use "
               "the platform wheel or the bundle, or run 'python3 -m carpool.report FILE' with "
               "client/python on PYTHONPATH\n",
               list);
    return 1;
  }
  const char* env_python = std::getenv("CARPOOL_PYTHON");
  std::string python = env_python != nullptr && *env_python != '\0' ? env_python
                       : !package->python.empty()                   ? package->python
                                                                    : "python3";
  // report.py is loaded by its path, without the package's __init__ (numpy, libcarpool.so): the
  // drawing needs matplotlib only, and a missing matplotlib gets report.py's own message.
  const std::string report = (package->pythonpath / "carpool" / "report.py").string();
  std::vector<std::string> words = {
      python, "-c",
      "import importlib.util as u, sys\n"
      "spec = u.spec_from_file_location('carpool_report', sys.argv[1])\n"
      "module = u.module_from_spec(spec)\n"
      "spec.loader.exec_module(module)\n"
      "sys.exit(module.main(sys.argv[2:]))\n",
      report};
  for (int i = 1; i < argc; ++i) words.emplace_back(argv[i]);
  std::vector<char*> exec_argv;
  for (std::string& w : words) exec_argv.push_back(w.data());
  exec_argv.push_back(nullptr);
  std::fflush(stdout);
  execvp(python.c_str(), exec_argv.data());
  fmt::print(stderr,
             "carpool report: cannot run the Python interpreter \"{}\": {}; set CARPOOL_PYTHON to "
             "a Python 3 with matplotlib (e.g. /usr/bin/python3 with python3-matplotlib)\n",
             python, std::strerror(errno));
  return 1;
}

const CommandRegistrar kRegistrar(
    "report", "a PNG of a series recorded by 'carpool status --watch S --json-lines FILE'",
    RunReport);

}  // namespace
}  // namespace carpool::tools
