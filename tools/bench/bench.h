// The benchmarks behind `carpool bench` (the carpool_bench library): tools/bench_cmd.cc registers
// RunBench as the command, which calls these explicitly, so the linker keeps them without any
// static registration inside the library. Each takes argv with argv[0] the verb; returns the exit
// code.
#ifndef CARPOOL_TOOLS_BENCH_BENCH_H_
#define CARPOOL_TOOLS_BENCH_BENCH_H_

namespace carpool::tools {

// `carpool bench <e2e|standalone|load|control> [options]` (tools/bench/bench_e2e_cmd.cc).
int RunBench(int argc, char** argv);

int BenchLoad(int argc, char** argv);     // tools/bench/bench_load.cc
int BenchControl(int argc, char** argv);  // tools/bench/bench_control.cc

}  // namespace carpool::tools

#endif  // CARPOOL_TOOLS_BENCH_BENCH_H_
