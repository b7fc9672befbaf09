#include "tools/sim_nodes_mode.h"

#include <fmt/core.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "common/splitmix.h"
#include "sampler/node_partition.h"

namespace carpool::tools {
namespace {

struct EpochCoverage {
  Roaring seen;
  uint64_t deliveries = 0;
};

struct NodeSummary {
  uint32_t node = 0;
  uint64_t jobs = 0;  // jobs with samples on this node
  SimSummary summary;
};

}  // namespace

int RunNodesMode(const std::vector<SimJob>& jobs, const NodesModeOptions& o) {
  // Per job (by its index in `jobs`), per epoch: the samples delivered on any node.
  std::vector<std::map<uint64_t, EpochCoverage>> coverage(jobs.size());
  std::vector<NodeSummary> nodes;
  uint64_t assignments = 0, distinct = 0;
  for (uint32_t k = 0; k < o.nodes; ++k) {
    std::vector<SimJob> local;
    std::vector<size_t> origin;  // local job -> index in `jobs`
    for (size_t i = 0; i < jobs.size(); ++i) {
      SimJob part = jobs[i];
      part.dataset = NodePart(jobs[i].dataset, o.partition_seed, k, o.nodes);
      if (part.dataset.isEmpty()) continue;  // too small a dataset to reach every node
      local.push_back(std::move(part));
      origin.push_back(i);
    }
    NodeSummary ns{k, local.size(), {}};
    if (!local.empty()) {
      Result<std::unique_ptr<Simulation>> sim = Simulation::Create(
          std::move(local), {.epochs = o.epochs, .seed = SplitMix64(o.seed + k)});
      if (!sim.ok()) {
        fmt::print(stderr, "carpool sim: node {}: {}\n", k, sim.status().message());
        return 1;
      }
      Simulation& s = **sim;
      SimStats stats(s);
      ns.summary = RunToEnd(s, stats, [&](const RoundRecord& r) {
        for (const Assignment& a : r.assignments) {
          for (JobId j : a.jobs) {
            EpochCoverage& c = coverage[origin[j]][r.epoch[j]];
            c.seen.add(a.sample);
            ++c.deliveries;
          }
        }
      });
      assignments += ns.summary.assignments;
      distinct += ns.summary.distinct;
    }
    nodes.push_back(std::move(ns));
  }
  const double ratio = distinct == 0 ? 0.0 : static_cast<double>(assignments) / distinct;

  using Json = nlohmann::ordered_json;
  Json per_node = Json::array(), per_job = Json::array();
  for (const NodeSummary& n : nodes) {
    per_node.push_back({{"node", n.node},
                        {"jobs", n.jobs},
                        {"rounds", n.summary.rounds},
                        {"assignments", n.summary.assignments},
                        {"distinct_round_samples", n.summary.distinct},
                        {"sharing_ratio", n.summary.sharing_ratio}});
  }
  bool exact = true;
  for (size_t i = 0; i < jobs.size(); ++i) {
    Json epochs = Json::array();
    for (const auto& [epoch, c] : coverage[i]) {
      const uint64_t size = jobs[i].dataset.cardinality();
      const uint64_t missing = size - (c.seen & jobs[i].dataset).cardinality();
      const uint64_t repeated = c.deliveries - c.seen.cardinality();
      exact = exact && missing == 0 && repeated == 0;
      epochs.push_back({{"epoch", epoch},
                        {"samples", c.seen.cardinality()},
                        {"missing", missing},
                        {"repeated", repeated}});
    }
    per_job.push_back({{"name", jobs[i].name}, {"epochs", std::move(epochs)}});
  }
  if (o.json) {
    const Json summary = {{"nodes", o.nodes},
                          {"partition_seed", o.partition_seed},
                          {"assignments", assignments},
                          {"distinct_round_samples", distinct},
                          {"sharing_ratio", ratio},
                          {"every_epoch_exactly_once", exact},
                          {"per_node", std::move(per_node)},
                          {"jobs", std::move(per_job)}};
    fmt::print("{}\n", summary.dump());
    return 0;
  }
  fmt::print("nodes                       {} (partition seed {})\n", o.nodes, o.partition_seed);
  for (const NodeSummary& n : nodes) {
    fmt::print("node {:<22} {} jobs, {} rounds, {} assignments, {} distinct, sharing ratio {:.4f}\n",
               n.node, n.jobs, n.summary.rounds, n.summary.assignments, n.summary.distinct,
               n.summary.sharing_ratio);
  }
  fmt::print("all nodes                   {} assignments, {} distinct, sharing ratio {:.4f}\n",
             assignments, distinct, ratio);
  for (const Json& j : per_job) {
    std::string line;
    for (const Json& e : j["epochs"]) {
      line += fmt::format(" e{}: {} samples, {} missing, {} repeated;",
                          e["epoch"].get<uint64_t>(), e["samples"].get<uint64_t>(),
                          e["missing"].get<uint64_t>(), e["repeated"].get<uint64_t>());
    }
    fmt::print("job {:<23}{}\n", j["name"].get<std::string>(), line);
  }
  fmt::print("every epoch of every job exactly once over the nodes: {}\n", exact ? "yes" : "NO");
  return 0;
}

}  // namespace carpool::tools
