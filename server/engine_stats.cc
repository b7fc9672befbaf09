// The engine's statistics as JSON (`carpool status`, Job::Stats). docs/server.md lists the fields.
#include <fmt/format.h>

#include <string>

#include <sys/resource.h>

#include "server/engine.h"
#include "server/engine_job.h"
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

std::string Engine::JobJson(const Job& job) const {
  uint64_t remaining = 0, queued = 0;
  double rate = 0;
  if (Result<Scheduler::JobStats> s = scheduler_->Stats(job.sched); s.ok()) {
    remaining = s->remaining;
    queued = s->queued;
    rate = s->rate;
  }
  const uint64_t total = uint64_t{job.request.epochs} * job.dataset_size;
  const double progress = total == 0 ? 0.0 : static_cast<double>(job.consumed) / total;
  return fmt::format(
      "{{\"id\":{},\"dataset\":{},\"batch_size\":{},\"epochs\":{},\"epoch\":{},\"progress\":{:.4f},"
      "\"rate\":{:.2f},\"remaining\":{},\"queue_depth\":{},\"deliveries\":{},\"batches\":{},"
      "\"skipped\":{},\"dropped\":{},\"prefetch\":{},\"unreleased\":{},\"assembling\":{},"
      "\"done\":{},\"device\":{}}}",
      job.id, JsonString(job.request.dataset), job.request.batch_size, job.request.epochs,
      job.epoch, progress, rate, remaining, queued, job.deliveries, job.batches, job.skipped,
      job.dropped, job.request.prefetch, job.pool->PublishedCount(), job.assembling, job.done,
      JsonString(job.gpu ? fmt::format("cuda:{}", job.gpu->device()) : "cpu"));
}

std::string Engine::ServerJson() const {
  std::string jobs;
  for (const auto& [id, job] : jobs_) jobs += (jobs.empty() ? "" : ",") + JobJson(*job);
  std::string tree;
  for (const SamplingTree::NodeStats& n : scheduler_->tree().Nodes()) {
    tree += fmt::format("{}{{\"job\":{},\"remaining\":{},\"spine\":{},\"leaf\":{}}}",
                        tree.empty() ? "" : ",", n.job, n.remaining, n.spine, n.leaf);
  }
  std::string gpus;
  for (const auto& gpu : gpus_) {
    const GpuCounters g = gpu->Counters();
    gpus += fmt::format(
        "{}{{\"device\":{},\"name\":{},\"batches\":{},\"images\":{},\"uploads\":{},"
        "\"upload_bytes\":{},\"resident_hits\":{},\"resident_evictions\":{},"
        "\"resident_bytes\":{},\"resident_capacity\":{},\"pool_bytes\":{},\"pool_slots\":{},"
        "\"assemble_seconds\":{:.6f}}}",
        gpus.empty() ? "" : ",", g.device, JsonString(g.name), g.batches, g.images, g.uploads,
        g.upload_bytes, g.resident_hits, g.resident_evictions, g.resident_bytes,
        g.resident_capacity, g.pool_bytes, g.pool_slots, g.assemble_seconds);
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double cpu_seconds =
      static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
      static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
  const cache::CacheStats c = cache_->Stats();
  const uint64_t preparations = preparations_ + transient_preparations_;
  const double sharing = preparations == 0 ? 0.0 : static_cast<double>(deliveries_) / preparations;
  return fmt::format(
      "{{\"instance\":{},\"uptime_s\":{:.3f},\"workers\":{},\"lookahead\":{},\"policy\":{},"
      "\"jobs\":[{}],\"jobs_created\":{},\"jobs_removed\":{},"
      "\"cache\":{{\"capacity_bytes\":{},\"bytes_used\":{},\"bytes_pinned\":{},\"payload_bytes\":{},"
      "\"entries\":{},\"pending\":{},\"hits\":{},\"misses\":{},\"insertions\":{},\"evictions\":{}}},"
      "\"preparations\":{},\"cached_preparations\":{},\"transient_preparations\":{},"
      "\"deliveries\":{},\"batches\":{},\"sharing_ratio\":{:.4f},\"skipped\":{},\"bad_samples\":{},"
      "\"pins\":{},\"refcount_total\":{},\"in_flight\":{},\"rounds\":{},\"tree\":[{}],"
      "\"cpu_seconds\":{:.3f},\"coordinator_seconds\":{:.3f},\"gpus\":[{}]}}",
      JsonString(options_.instance), Now(), workers_->size(), options_.lookahead,
      JsonString(cache::EvictionPolicyName(options_.policy)), jobs, jobs_created_, jobs_removed_,
      c.index.capacity_bytes, c.index.bytes_used, c.index.bytes_pinned, c.payload_bytes,
      c.index.entries, c.pending, c.index.hits, c.index.misses, c.index.insertions,
      c.index.evictions, preparations, preparations_, transient_preparations_, deliveries_,
      batches_, sharing, skipped_, states_.Count(SampleState::kBad), pins_, refs_.total,
      states_.Count(SampleState::kPreparing),
      scheduler_->rounds(), tree, cpu_seconds, coordinator_seconds_, gpus);
}

std::string Engine::Stats(uint64_t job_id) {
  std::lock_guard lock(mu_);
  if (job_id == 0) return ServerJson();
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return fmt::format("{{\"id\":{},\"gone\":true}}", job_id);
  return JobJson(*it->second);
}

}  // namespace carpool
