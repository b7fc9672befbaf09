// The engine's statistics as JSON (`carpool status`, Job::Stats). docs/server.md lists the fields.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include <sys/resource.h>

#include "server/engine.h"
#include "server/engine_job.h"
#include "server/engine_snapshot.h"
#include "server/gpu_service.h"
#include "server/worker_pool.h"

namespace carpool {

JobSnapshot Engine::SnapshotJob(const Job& job) const {
  JobSnapshot j;
  if (Result<Scheduler::JobStats> s = scheduler_->Stats(job.source ? job.source->participant() : 0); s.ok()) {
    j.remaining = s->remaining;
    j.queue_depth = s->queued;
    j.rate = s->rate;
    j.held_s = s->held;
    j.client_bound = s->client_bound;
    j.pace = s->pace;
    if (s->leader) j.following = *s->leader;
    j.followed = s->followed;
  }
  // A rank's share of its job's entries is 1 / world_size.
  const uint64_t total = uint64_t{job.request.epochs} * job.dataset_size;
  j.progress = total == 0 ? 0.0
                          : static_cast<double>(job.consumed) * job.request.world_size / total;
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
  j.assembling = job.builds > 0;
  j.done = job.done;
  j.device = job.gpu ? fmt::format("cuda:{}", job.gpu->device()) : "cpu";
  j.prepare_spec = job.prepare_spec;
  // A CPU job on a dataset registered with decode=gpu decodes its encoded samples on the CPU.
  j.decoder = job.prepare.gpu_decode && job.gpu != nullptr && !job.gpu->decoder().empty()
                  ? "gpu-" + job.gpu->decoder() +
                        (job.decoder != nullptr && job.decoder->enabled() ? "-in-job" : "")
                  : "cpu";
  if (job.source != nullptr) job.source->Describe(j);
  return j;
}

EngineSnapshot Engine::SnapshotLocked() const {
  EngineSnapshot s;
  s.instance = options_.instance;
  s.uptime_s = Now();
  s.workers = workers_->size();
  s.pacing = scheduler_->pacing();
  s.lookahead = s.pacing.lookahead;
  s.policy = cache::EvictionPolicyName(options_.policy);
  for (const PrepareSpec& spec : keys_.specs()) s.prepare_specs.push_back(spec.ToString());
  for (const auto& [id, job] : jobs_) s.jobs.push_back(SnapshotJob(*job));
  s.jobs_created = jobs_created_;
  s.jobs_removed = jobs_removed_;
  s.cache = cache_->Stats();
  s.cached_preparations = preparations_;
  s.transient_preparations = transient_preparations_;
  s.gpu_decode_cpu_fallbacks = gpu_decode_cpu_fallbacks_;
  s.deliveries = deliveries_;
  s.batches = batches_;
  s.skipped = skipped_;
  s.bad_samples = samples_.states().Count(SampleState::kBad);
  s.pins = pins_;
  s.refcount_total = refs_.total;
  s.in_flight = samples_.states().Count(SampleState::kPreparing);
  s.samples_known = samples_.keys_in_use();
  s.sample_states = samples_.states().size();
  s.idx_files = reader_.idx_files_loaded();
  s.rounds = scheduler_->rounds();
  s.tree = scheduler_->tree().Nodes();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  s.cpu_seconds = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                  static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
  s.coordinator_seconds = coordinator_seconds_;
  const WorkerPool::Load load = workers_->CurrentLoad();  // lock order: mu_, then the pool's
  s.workers_busy = load.busy;
  s.worker_queue = load.queued;
  for (const auto& [name, count] : phases_.Now()) s.worker_phases.emplace_back(name, count);
  s.worker_lock_wait_seconds =
      static_cast<double>(worker_lock_wait_ns_.load(std::memory_order_relaxed)) * 1e-9;
  for (const auto& gpu : gpus_) s.gpus.push_back(gpu->Counters());
  return s;
}

EngineSnapshot Engine::Snapshot() const {
  MutexLock lock(mu_);
  return SnapshotLocked();
}

namespace {

// ordered_json keeps the fields in the order docs/server.md lists them.
using Json = nlohmann::ordered_json;

// Replaces bad UTF-8 (say, in a GPU name) instead of throwing inside the server.
std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

Json JobJson(const JobSnapshot& j) {
  return {{"id", j.id},
          {"dataset", j.dataset},
          {"batch_size", j.batch_size},
          {"epochs", j.epochs},
          {"epoch", j.epoch},
          {"progress", j.progress},
          {"rate", j.rate},
          {"remaining", j.remaining},
          {"queue_depth", j.queue_depth},
          {"deliveries", j.deliveries},
          {"batches", j.batches},
          {"skipped", j.skipped},
          {"dropped", j.dropped},
          {"prefetch", j.prefetch},
          {"unreleased", j.unreleased},
          {"assembling", j.assembling},
          {"done", j.done},
          {"device", j.device},
          {"prepare_spec", j.prepare_spec},
          {"decoder", j.decoder},
          {"job_key", j.job_key},
          {"rank", j.rank},
          {"world_size", j.world_size},
          {"padded", j.padded},
          {"held_s", j.held_s},
          {"client_bound", j.client_bound},
          {"pace", j.pace},
          {"following", j.following ? Json(*j.following) : Json(nullptr)},
          {"followed", j.followed}};
}

Json ServerJson(const EngineSnapshot& s) {
  Json jobs = Json::array();
  for (const JobSnapshot& j : s.jobs) jobs.push_back(JobJson(j));
  Json tree = Json::array();
  for (const SamplingTree::NodeStats& n : s.tree) {
    tree.push_back(
        {{"job", n.job}, {"remaining", n.remaining}, {"spine", n.spine}, {"leaf", n.leaf}});
  }
  Json phases = Json::object();
  for (const auto& [name, count] : s.worker_phases) phases[name] = count;
  Json gpus = Json::array();
  for (const GpuCounters& g : s.gpus) {
    gpus.push_back({{"device", g.device},
                    {"name", g.name},
                    {"batches", g.batches},
                    {"images", g.images},
                    {"uploads", g.uploads},
                    {"upload_bytes", g.upload_bytes},
                    {"resident_hits", g.resident_hits},
                    {"resident_evictions", g.resident_evictions},
                    {"resident_bytes", g.resident_bytes},
                    {"resident_capacity", g.resident_capacity},
                    {"pool_bytes", g.pool_bytes},
                    {"pool_slots", g.pool_slots},
                    {"assemble_seconds", g.assemble_seconds},
                    {"decoder", g.decoder.empty() ? "cpu" : g.decoder},
                    {"gpu_decodes", g.gpu_decodes},
                    {"cpu_fallbacks", g.cpu_fallbacks},
                    {"decoded_bytes", g.decoded_bytes},
                    {"undecodable", g.undecodable},
                    {"decode_seconds", g.decode_seconds},
                    {"job_decodes", g.job_decodes},
                    {"job_decode_failures", g.job_decode_failures},
                    {"overlapped_builds", g.overlapped_builds},
                    {"job_decode_seconds", g.job_decode_seconds},
                    {"build_phase_seconds",
                     {{"lock", g.phases.lock},
                      {"inspect", g.phases.inspect},
                      {"nvjpeg", g.phases.nvjpeg},
                      {"resize", g.phases.resize},
                      {"cpu_decode", g.phases.cpu_decode},
                      {"decode_wait", g.phases.decode_wait},
                      {"sync", g.phases.sync},
                      {"job_copy", g.phases.job_copy},
                      {"job_wait", g.phases.job_wait},
                      {"job_copy_out", g.phases.job_copy_out},
                      {"assemble", g.phases.assemble}}}});
  }
  const cache::CacheStats& c = s.cache;
  const uint64_t preparations = s.preparations();
  const double sharing = preparations == 0 ? 0.0 : static_cast<double>(s.deliveries) / preparations;
  return {{"instance", s.instance},
          {"uptime_s", s.uptime_s},
          {"workers", s.workers},
          {"lookahead", s.lookahead},
          {"pacing",
           {{"enabled", s.pacing.enabled},
            {"capacity_samples", s.pacing.capacity},
            {"window", s.pacing.window},
            {"owed", s.pacing.owed},
            {"derived_lookahead", s.pacing.derived_lookahead},
            {"holds", s.pacing.holds},
            {"lifts", s.pacing.lifts},
            {"spare_cpu", s.pacing.spare_cpu >= 0 ? Json(s.pacing.spare_cpu) : Json(nullptr)}}},
          {"policy", s.policy},
          {"prepare_specs", s.prepare_specs},
          {"jobs", std::move(jobs)},
          {"jobs_created", s.jobs_created},
          {"jobs_removed", s.jobs_removed},
          {"cache",
           {{"capacity_bytes", c.index.capacity_bytes},
            {"bytes_used", c.index.bytes_used},
            {"bytes_pinned", c.index.bytes_pinned},
            {"payload_bytes", c.payload_bytes},
            {"entries", c.index.entries},
            {"pending", c.pending},
            {"hits", c.index.hits},
            {"misses", c.index.misses},
            {"insertions", c.index.insertions},
            {"evictions", c.index.evictions}}},
          {"preparations", preparations},
          {"cached_preparations", s.cached_preparations},
          {"transient_preparations", s.transient_preparations},
          {"gpu_decode_cpu_fallbacks", s.gpu_decode_cpu_fallbacks},
          {"deliveries", s.deliveries},
          {"batches", s.batches},
          {"sharing_ratio", sharing},
          {"skipped", s.skipped},
          {"bad_samples", s.bad_samples},
          {"pins", s.pins},
          {"refcount_total", s.refcount_total},
          {"in_flight", s.in_flight},
          {"samples_known", s.samples_known},
          {"sample_states", s.sample_states},
          {"idx_files", s.idx_files},
          {"rounds", s.rounds},
          {"tree", std::move(tree)},
          {"cpu_seconds", s.cpu_seconds},
          {"coordinator_seconds", s.coordinator_seconds},
          {"workers_busy", s.workers_busy},
          {"worker_queue", s.worker_queue},
          {"worker_lock_wait_seconds", s.worker_lock_wait_seconds},
          {"worker_phases", phases},
          {"gpus", std::move(gpus)}};
}

}  // namespace

std::string Engine::Stats(uint64_t job_id) {
  // Copy under the lock, format after it: with 50 jobs the JSON is most of a status's time.
  if (job_id == 0) {
    EngineSnapshot snapshot;
    {
      MutexLock lock(mu_);
      snapshot = SnapshotLocked();
    }
    return Dump(ServerJson(snapshot));
  }
  std::optional<JobSnapshot> job;
  {
    MutexLock lock(mu_);
    auto it = jobs_.find(job_id);
    if (it != jobs_.end()) job = SnapshotJob(*it->second);
  }
  if (!job) return Dump(Json{{"id", job_id}, {"gone", true}});
  return Dump(JobJson(*job));
}

}  // namespace carpool
