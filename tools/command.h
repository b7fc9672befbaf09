// Subcommands of the `carpool` CLI register themselves here, one file per command, so that
// adding a command never touches the dispatcher. Thread-compatible: registration happens during
// static initialization, before main.
#ifndef CARPOOL_TOOLS_COMMAND_H_
#define CARPOOL_TOOLS_COMMAND_H_

#include <string_view>
#include <vector>

namespace carpool::tools {

// argv[0] is "carpool <name>"; the rest are the command's own arguments. Returns the exit code.
using CommandFn = int (*)(int argc, char** argv);

struct Command {
  std::string_view name;
  std::string_view summary;  // one line for `carpool --help`
  CommandFn run;
};

std::vector<Command>& Commands();

struct CommandRegistrar {
  CommandRegistrar(std::string_view name, std::string_view summary, CommandFn run) {
    Commands().push_back({name, summary, run});
  }
};

}  // namespace carpool::tools

#endif  // CARPOOL_TOOLS_COMMAND_H_
