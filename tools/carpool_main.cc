// The `carpool` CLI: dispatches to the subcommands registered through tools/command.h.
#include <fmt/core.h>

#include <algorithm>
#include <string>
#include <string_view>

#include "protocol/protocol.h"
#include "tools/command.h"

namespace carpool::tools {

std::vector<Command>& Commands() {
  static std::vector<Command> commands;
  return commands;
}

namespace {

void PrintUsage(std::FILE* out) {
  auto cmds = Commands();
  std::sort(cmds.begin(), cmds.end(),
            [](const Command& a, const Command& b) { return a.name < b.name; });
  fmt::print(out, "usage: carpool <command> [options]   (carpool <command> --help for details)\n\n");
  fmt::print(out, "commands:\n");
  for (const auto& c : cmds) fmt::print(out, "  {:<10} {}\n", c.name, c.summary);
}

}  // namespace
}  // namespace carpool::tools

int main(int argc, char** argv) {
  using carpool::tools::Commands;
  if (argc < 2) {
    carpool::tools::PrintUsage(stderr);
    return 2;
  }
  std::string_view name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    carpool::tools::PrintUsage(stdout);
    return 0;
  }
  if (name == "--version" || name == "version") {
    fmt::print("carpool {} (protocol {})\n", CARPOOL_VERSION, carpool::protocol::kProtocolVersion);
    return 0;
  }
  for (const auto& c : Commands()) {
    if (c.name == name) {
      std::string prog = "carpool " + std::string(name);
      argv[1] = prog.data();
      return c.run(argc - 1, argv + 1);
    }
  }
  std::string known;
  for (const auto& c : Commands()) known += (known.empty() ? "" : ", ") + std::string(c.name);
  fmt::print(stderr, "carpool: unknown command \"{}\" (known: {}); see 'carpool --help'\n", name,
             known);
  return 2;
}
