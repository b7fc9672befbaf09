#include "tools/options.h"

#include <fmt/core.h>

#include <sstream>

namespace carpool::tools {

namespace po = boost::program_options;

std::optional<int> ParseCommandLine(int argc, char** argv, std::string_view prog,
                                    std::string_view usage, const po::options_description& opts,
                                    po::variables_map* vm) {
  try {
    po::store(po::command_line_parser(argc, argv).options(opts).run(), *vm);
    if (vm->count("help")) {
      std::ostringstream help;
      help << opts;
      fmt::print("{}{}", usage, help.str());
      return 0;
    }
    po::notify(*vm);
  } catch (const po::error& e) {
    fmt::print(stderr, "{}: {}; see '{} --help'\n", prog, e.what(), prog);
    return 2;
  }
  return std::nullopt;
}

Result<bool> ParseOnOff(std::string_view flag, const std::string& value) {
  if (value == "on" || value == "off") return value == "on";
  return Status::InvalidArgument(fmt::format("--{} \"{}\": use on or off", flag, value));
}

Status SetOnOff(std::string_view flag, const std::string& value, bool* out) {
  const Result<bool> on = ParseOnOff(flag, value);
  if (!on.ok()) return on.status();
  *out = *on;
  return Status::OK();
}

}  // namespace carpool::tools
