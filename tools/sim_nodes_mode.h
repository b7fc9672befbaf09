// `carpool sim --nodes K`: a sweep whose jobs each span K nodes, one server per node. Node k
// simulates the jobs on their parts of the datasets (sampler/node_partition.h) with its own coins;
// the summary gives each node's sharing, the sharing over all nodes, and each job's per-epoch
// coverage over the nodes (every sample once per epoch: none missing, none repeated).
#ifndef CARPOOL_TOOLS_SIM_NODES_MODE_H_
#define CARPOOL_TOOLS_SIM_NODES_MODE_H_

#include <cstdint>
#include <vector>

#include "sim/sim.h"

namespace carpool::tools {

struct NodesModeOptions {
  uint32_t nodes = 1;
  uint64_t partition_seed = 0;
  uint64_t epochs = 1;
  uint64_t seed = 1;
  bool json = false;
};

// Runs the K node simulations and prints the summary; returns the exit code.
int RunNodesMode(const std::vector<SimJob>& jobs, const NodesModeOptions& options);

}  // namespace carpool::tools

#endif  // CARPOOL_TOOLS_SIM_NODES_MODE_H_
