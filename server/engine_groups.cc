// Data-parallel jobs: the ranks that join with one job key are one participant of the sampling
// tree. Each global batch (world_size x batch_size decisions) is split into the ranks' slices, as
// DistributedSampler splits an epoch, and every rank gets the same number of batches per epoch:
// the last global batch of an epoch is dropped (drop_last) or padded with repeats of its first
// decisions to a multiple of world_size. docs/ddp.md describes the semantics.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <utility>

#include "common/log.h"
#include "server/engine.h"
#include "server/engine_job.h"

namespace carpool {
namespace {

// The first field in which a rank's request differs from its group's, or "" when none does.
std::string Mismatch(const protocol::CreateJob& a, const protocol::CreateJob& b) {
  if (a.world_size != b.world_size) {
    return fmt::format("world_size {} (the job's first rank said {})", a.world_size, b.world_size);
  }
  if (a.dataset != b.dataset) {
    return fmt::format("dataset \"{}\" (the job's first rank said \"{}\")", a.dataset, b.dataset);
  }
  if (a.batch_size != b.batch_size) {
    return fmt::format("batch_size {} (the job's first rank said {})", a.batch_size, b.batch_size);
  }
  if (a.epochs != b.epochs) {
    return fmt::format("epochs {} (the job's first rank said {})", a.epochs, b.epochs);
  }
  if (a.transform != b.transform) {
    return fmt::format("transform \"{}\" (the job's first rank said \"{}\")", a.transform,
                       b.transform);
  }
  if (a.drop_last != b.drop_last) {
    return fmt::format("drop_last {} (the job's first rank said {})", a.drop_last, b.drop_last);
  }
  if (a.seed != b.seed) {
    return fmt::format("seed {} (the job's first rank said {})", a.seed, b.seed);
  }
  if (a.node != b.node || a.nodes != b.nodes) {
    return fmt::format("node {} of {} (the job's first rank said node {} of {})", a.node, a.nodes,
                       b.node, b.nodes);
  }
  return "";
}

}  // namespace

Status Engine::JoinGroup(Job& job, const Roaring& ids, uint64_t batches_per_epoch) {
  const protocol::CreateJob& request = job.request;
  const std::string& key = request.job_key;
  auto it = groups_.find(key);
  if (it != groups_.end()) {
    Group& g = *it->second;
    if (g.failed) {
      return Status::FailedPrecondition(fmt::format(
          "data-parallel job \"{}\" has failed (a rank left or the ranks did not all join in "
          "time); start all its ranks again with a new job key (torchrun: a new rdzv id)",
          key));
    }
    if (g.sched != 0) {
      return Status::AlreadyExists(fmt::format(
          "data-parallel job \"{}\" already has all its {} ranks; give each job its own key",
          key, g.world_size()));
    }
    if (std::string diff = Mismatch(request, g.request); !diff.empty()) {
      return Status::InvalidArgument(fmt::format(
          "rank {} of data-parallel job \"{}\" has {}; every rank of a job must ask for the same "
          "dataset, batch size, epochs, transform, drop_last, seed and world size",
          request.rank, key, diff));
    }
    if (g.ranks[request.rank] != nullptr) {
      return Status::AlreadyExists(fmt::format(
          "rank {} of data-parallel job \"{}\" has joined already (job {}); each rank joins once",
          request.rank, key, g.ranks[request.rank]->id));
    }
  } else {
    auto g = std::make_unique<Group>();
    g->key = key;
    g->request = request;
    g->dataset_size = job.dataset_size;
    g->ranks.assign(request.world_size, nullptr);
    g->taken.assign(request.world_size, false);
    g->batches_per_epoch = batches_per_epoch;
    g->created = Now();
    it = groups_.emplace(key, std::move(g)).first;
  }
  Group& g = *it->second;
  g.ranks[request.rank] = &job;
  job.group = &g;
  job.rank = request.rank;
  if (++g.joined < g.world_size()) return Status::OK();

  // Every rank is here: the job enters the sampling tree as one participant.
  const JobId sched = next_job_id_++;
  const uint64_t prefetch_samples =
      uint64_t{g.request.prefetch + 1} * g.global_batch();  // the scheduler clamps it to L
  Status added = scheduler_->AddJob(sched, ids, g.request.epochs, prefetch_samples, Now());
  if (!added.ok()) {
    g.ranks[request.rank] = nullptr;
    --g.joined;
    job.group = nullptr;
    return added;
  }
  if (options_.cache_bytes > 0) scheduler_->SetBatch(sched, g.global_batch());
  g.sched = sched;
  for (Job* rank : g.ranks) rank->sched = sched;
  log::Info("data-parallel job \"{}\": all {} ranks joined in {:.2f} s; global batch {}", key,
            g.world_size(), Now() - g.created, g.global_batch());
  return Status::OK();
}

bool Engine::RankSlice(Job& job, std::vector<Decision>* slice) {
  Group& g = *job.group;
  if (g.failed || g.sched == 0) return false;
  if (!g.front_set && !TakeGlobalBatch(g)) return false;
  if (g.taken[job.rank]) return false;  // built already; the others' slices are pending
  const auto begin = g.front.begin() + static_cast<ptrdiff_t>(size_t{job.rank} * g.slice);
  slice->assign(begin, begin + g.slice);
  return true;
}

bool Engine::TakeGlobalBatch(Group& g) {
  const uint64_t b = g.global_batch();
  const uint32_t r = g.world_size();
  std::vector<Decision> global;
  const bool more = scheduler_->NextBatch(g.sched, b, &global) && !global.empty();
  // The epoch of the queue's front ended short of the agreed count (this node's part is smaller
  // than another's): pad it with whole batches of repeats before the next epoch, or the end.
  const bool epoch_over = !more ? scheduler_->Finished(g.sched) : global.front().epoch != g.epoch;
  if (epoch_over && g.epoch_batches > 0 && g.epoch_batches < g.batches_per_epoch &&
      !g.last.empty()) {
    g.front.clear();
    for (size_t i = 0; i < b; ++i) g.front.push_back(g.last[i % g.last.size()]);
    g.slice = static_cast<uint32_t>(b / r);
    g.front_consumes = 0;
    g.padded += b;
  } else {
    if (!more) return false;
    if (global.front().epoch != g.epoch) {
      g.epoch = global.front().epoch;
      g.epoch_batches = 0;
    }
    // Beyond the agreed count (this node's part is larger), or a partial last batch with
    // drop_last: dropped.
    if (g.epoch_batches >= g.batches_per_epoch || (global.size() < b && g.request.drop_last)) {
      Status consumed = scheduler_->Consume(g.sched, global.size(), Now());
      if (!consumed.ok()) log::Error("job \"{}\": {}", g.key, consumed.ToString());
      g.dropped += global.size();
      for (Job* rank : g.ranks) {
        if (rank != nullptr) rank->dropped += global.size() / r;
      }
      return false;
    }
    g.slice = static_cast<uint32_t>((global.size() + r - 1) / r);
    g.front_consumes = global.size();
    const size_t padded = size_t{g.slice} * r - global.size();
    for (size_t i = 0; i < padded; ++i) global.push_back(global[i % g.front_consumes]);
    g.padded += padded;
    g.last = global;
    g.front = std::move(global);
  }
  ++g.epoch_batches;
  g.taken.assign(r, false);
  g.assembled = 0;
  g.front_set = true;
  return true;
}

void Engine::SliceAssembled(Job& job) {
  Group& g = *job.group;
  if (g.failed || !g.front_set) return;
  if (++g.assembled < g.world_size()) return;
  if (g.front_consumes > 0) {  // a padding batch takes nothing from the queue
    Status consumed = scheduler_->Consume(g.sched, g.front_consumes, Now());
    if (!consumed.ok()) log::Error("job \"{}\": {}", g.key, consumed.ToString());
  }
  g.front_set = false;
  g.front.clear();
}

bool Engine::FinishRankIfDone(Job& job) {
  Group& g = *job.group;
  // Also not while the last epoch still owes padding batches (TakeGlobalBatch makes them).
  if (job.assembling || job.done || g.failed || g.sched == 0 || g.front_set ||
      g.epoch_batches < g.batches_per_epoch || !scheduler_->Contains(g.sched) ||
      !scheduler_->Finished(g.sched)) {
    return false;
  }
  job.done = true;
  if (++g.finished == g.world_size()) {
    Status removed = scheduler_->RemoveJob(g.sched);
    if (!removed.ok()) log::Error("job \"{}\": {}", g.key, removed.ToString());
  }
  job.sink->DeliverEndOfData(job.request.epochs);
  return true;
}

void Engine::LeaveGroup(Job& job) {
  Group& g = *job.group;
  g.ranks[job.rank] = nullptr;
  if (!job.done && !g.failed) {
    FailGroup(g, Status::Unavailable(fmt::format(
                     "rank {} of data-parallel job \"{}\" left before the end of its data (it "
                     "disconnected, or its lease expired); the job ends for every rank",
                     job.rank, g.key)));
  }
  job.group = nullptr;
  if (std::none_of(g.ranks.begin(), g.ranks.end(), [](const Job* r) { return r != nullptr; })) {
    if (g.sched != 0 && scheduler_->Contains(g.sched)) {
      Status removed = scheduler_->RemoveJob(g.sched);
      if (!removed.ok()) log::Error("job \"{}\": {}", g.key, removed.ToString());
    }
    groups_.erase(g.key);  // destroys g
  }
}

void Engine::FailGroup(Group& g, const Status& why) {
  g.failed = true;
  log::Warn("data-parallel job \"{}\": {}", g.key, why.message());
  // Its decisions and references go now; the ranks stay until their clients leave.
  if (g.sched != 0 && scheduler_->Contains(g.sched)) {
    Status removed = scheduler_->RemoveJob(g.sched);
    if (!removed.ok()) log::Error("job \"{}\": {}", g.key, removed.ToString());
  }
  for (Job* rank : g.ranks) {
    if (rank != nullptr && !rank->done) {
      rank->done = true;
      rank->sink->DeliverError(why);
    }
  }
}

void Engine::CheckGroups() {
  const double timeout = std::chrono::duration<double>(options_.rank_join_timeout).count();
  for (auto& [key, g] : groups_) {
    if (g->failed || g->sched != 0 || Now() - g->created <= timeout) continue;
    std::vector<uint32_t> missing;
    for (uint32_t r = 0; r < g->world_size(); ++r) {
      if (g->ranks[r] == nullptr) missing.push_back(r);
    }
    FailGroup(*g, Status::FailedPrecondition(fmt::format(
                      "only {} of the {} ranks of data-parallel job \"{}\" joined within {:.0f} s "
                      "(missing: {}); check that every rank uses the same job key and world size, "
                      "or raise the server's --rank-join-timeout",
                      g->joined, g->world_size(), key, timeout, fmt::join(missing, ", "))));
  }
}

}  // namespace carpool
