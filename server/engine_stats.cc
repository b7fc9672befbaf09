// The engine's statistics as JSON (`carpool status`, Job::Stats). docs/server.md lists the fields.
#include <fmt/format.h>

#include <string>

#include <sys/resource.h>

#include "server/engine.h"
#include "server/engine_job.h"
#include "server/engine_snapshot.h"
#include "server/gpu_service.h"

namespace carpool {
namespace {

// Dataset names are validated by the catalog ([A-Za-z0-9._-]), but escape anyway.
std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

JobSnapshot Engine::SnapshotJob(const Job& job) const {
  JobSnapshot j;
  if (Result<Scheduler::JobStats> s = scheduler_->Stats(job.sched); s.ok()) {
    j.remaining = s->remaining;
    j.queue_depth = s->queued;
    j.rate = s->rate;
  }
  const uint64_t total = uint64_t{job.request.epochs} * job.dataset_size;
  j.progress = total == 0 ? 0.0 : static_cast<double>(job.consumed) / total;
  j.id = job.id;
  j.dataset = job.request.dataset;
  j.batch_size = job.request.batch_size;
  j.epochs = job.request.epochs;
  j.epoch = job.epoch;
  j.deliveries = job.deliveries;
  j.batches = job.batches;
  j.skipped = job.skipped;
  j.dropped = job.dropped;
  j.prefetch = job.request.prefetch;
  j.unreleased = job.pool->PublishedCount();
  j.assembling = job.assembling;
  j.done = job.done;
  j.device = job.gpu ? fmt::format("cuda:{}", job.gpu->device()) : "cpu";
  return j;
}

EngineSnapshot Engine::SnapshotLocked() const {
  EngineSnapshot s;
  s.instance = options_.instance;
  s.uptime_s = Now();
  s.workers = workers_->size();
  s.lookahead = options_.lookahead;
  s.policy = cache::EvictionPolicyName(options_.policy);
  for (const auto& [id, job] : jobs_) s.jobs.push_back(SnapshotJob(*job));
  s.jobs_created = jobs_created_;
  s.jobs_removed = jobs_removed_;
  s.cache = cache_->Stats();
  s.cached_preparations = preparations_;
  s.transient_preparations = transient_preparations_;
  s.deliveries = deliveries_;
  s.batches = batches_;
  s.skipped = skipped_;
  s.bad_samples = states_.Count(SampleState::kBad);
  s.pins = pins_;
  s.refcount_total = refs_.total;
  s.in_flight = states_.Count(SampleState::kPreparing);
  s.rounds = scheduler_->rounds();
  s.tree = scheduler_->tree().Nodes();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  s.cpu_seconds = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                  static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
  s.coordinator_seconds = coordinator_seconds_;
  for (const auto& gpu : gpus_) s.gpus.push_back(gpu->Counters());
  return s;
}

EngineSnapshot Engine::Snapshot() const {
  std::lock_guard lock(mu_);
  return SnapshotLocked();
}

namespace {

std::string JobJson(const JobSnapshot& j) {
  return fmt::format(
      "{{\"id\":{},\"dataset\":{},\"batch_size\":{},\"epochs\":{},\"epoch\":{},\"progress\":{:.4f},"
      "\"rate\":{:.2f},\"remaining\":{},\"queue_depth\":{},\"deliveries\":{},\"batches\":{},"
      "\"skipped\":{},\"dropped\":{},\"prefetch\":{},\"unreleased\":{},\"assembling\":{},"
      "\"done\":{},\"device\":{}}}",
      j.id, JsonString(j.dataset), j.batch_size, j.epochs, j.epoch, j.progress, j.rate,
      j.remaining, j.queue_depth, j.deliveries, j.batches, j.skipped, j.dropped, j.prefetch,
      j.unreleased, j.assembling, j.done, JsonString(j.device));
}

std::string ServerJson(const EngineSnapshot& s) {
  std::string jobs;
  for (const JobSnapshot& j : s.jobs) jobs += (jobs.empty() ? "" : ",") + JobJson(j);
  std::string tree;
  for (const SamplingTree::NodeStats& n : s.tree) {
    tree += fmt::format("{}{{\"job\":{},\"remaining\":{},\"spine\":{},\"leaf\":{}}}",
                        tree.empty() ? "" : ",", n.job, n.remaining, n.spine, n.leaf);
  }
  std::string gpus;
  for (const GpuCounters& g : s.gpus) {
    gpus += fmt::format(
        "{}{{\"device\":{},\"name\":{},\"batches\":{},\"images\":{},\"uploads\":{},"
        "\"upload_bytes\":{},\"resident_hits\":{},\"resident_evictions\":{},"
        "\"resident_bytes\":{},\"resident_capacity\":{},\"pool_bytes\":{},\"pool_slots\":{},"
        "\"assemble_seconds\":{:.6f}}}",
        gpus.empty() ? "" : ",", g.device, JsonString(g.name), g.batches, g.images, g.uploads,
        g.upload_bytes, g.resident_hits, g.resident_evictions, g.resident_bytes,
        g.resident_capacity, g.pool_bytes, g.pool_slots, g.assemble_seconds);
  }
  const cache::CacheStats& c = s.cache;
  const uint64_t preparations = s.preparations();
  const double sharing =
      preparations == 0 ? 0.0 : static_cast<double>(s.deliveries) / preparations;
  return fmt::format(
      "{{\"instance\":{},\"uptime_s\":{:.3f},\"workers\":{},\"lookahead\":{},\"policy\":{},"
      "\"jobs\":[{}],\"jobs_created\":{},\"jobs_removed\":{},"
      "\"cache\":{{\"capacity_bytes\":{},\"bytes_used\":{},\"bytes_pinned\":{},\"payload_bytes\":{},"
      "\"entries\":{},\"pending\":{},\"hits\":{},\"misses\":{},\"insertions\":{},\"evictions\":{}}},"
      "\"preparations\":{},\"cached_preparations\":{},\"transient_preparations\":{},"
      "\"deliveries\":{},\"batches\":{},\"sharing_ratio\":{:.4f},\"skipped\":{},\"bad_samples\":{},"
      "\"pins\":{},\"refcount_total\":{},\"in_flight\":{},\"rounds\":{},\"tree\":[{}],"
      "\"cpu_seconds\":{:.3f},\"coordinator_seconds\":{:.3f},\"gpus\":[{}]}}",
      JsonString(s.instance), s.uptime_s, s.workers, s.lookahead, JsonString(s.policy), jobs,
      s.jobs_created, s.jobs_removed, c.index.capacity_bytes, c.index.bytes_used,
      c.index.bytes_pinned, c.payload_bytes, c.index.entries, c.pending, c.index.hits,
      c.index.misses, c.index.insertions, c.index.evictions, preparations,
      s.cached_preparations, s.transient_preparations, s.deliveries, s.batches, sharing,
      s.skipped, s.bad_samples, s.pins, s.refcount_total, s.in_flight, s.rounds, tree,
      s.cpu_seconds, s.coordinator_seconds, gpus);
}

}  // namespace

std::string Engine::Stats(uint64_t job_id) {
  std::lock_guard lock(mu_);
  if (job_id == 0) return ServerJson(SnapshotLocked());
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return fmt::format("{{\"id\":{},\"gone\":true}}", job_id);
  return JobJson(SnapshotJob(*it->second));
}

}  // namespace carpool
