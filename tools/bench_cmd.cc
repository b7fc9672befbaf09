// `carpool bench`: registers the benchmarks of the carpool_bench library (tools/bench/). The
// registration lives here, in the binary, so that the library needs no static initializer that
// the linker could drop.
#include "tools/bench/bench.h"
#include "tools/command.h"

namespace carpool::tools {
namespace {

const CommandRegistrar kRegistrar("bench", "end-to-end benchmarks: carpool against baselines",
                                  RunBench);

}  // namespace
}  // namespace carpool::tools
