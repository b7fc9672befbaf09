// Argument parsing shared by the CLI's subcommands (Boost.Program_options). Thread-compatible.
#ifndef CARPOOL_TOOLS_OPTIONS_H_
#define CARPOOL_TOOLS_OPTIONS_H_

#include <boost/program_options.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "carpool/status.h"

namespace carpool::tools {

// Parses argv against `opts`. With --help prints `usage` then the options and returns 0; on a bad
// argument prints one line "<prog>: <problem>; see '<prog> --help'" and returns 2. Otherwise
// returns nullopt and fills `vm`. --help is checked before required options are enforced.
std::optional<int> ParseCommandLine(int argc, char** argv, std::string_view prog,
                                    std::string_view usage,
                                    const boost::program_options::options_description& opts,
                                    boost::program_options::variables_map* vm);

// An on|off flag's value: true for "on", false for "off"; anything else is InvalidArgument
// naming the flag and the value ("--pacing \"maybe\": use on or off"). O(1).
Result<bool> ParseOnOff(std::string_view flag, const std::string& value);
// The same, into `*out` (left as it was on an error). O(1).
Status SetOnOff(std::string_view flag, const std::string& value, bool* out);

}  // namespace carpool::tools

#endif  // CARPOOL_TOOLS_OPTIONS_H_
