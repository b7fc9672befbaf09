#include "server/data_parallel_group.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <utility>

#include "common/log.h"
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

DataParallelGroup::DataParallelGroup(Scheduler& scheduler, const EngineJob& first,
                                     uint64_t batches_per_epoch, double now)
    : scheduler_(scheduler),
      key_(first.request.job_key),
      request_(first.request),
      ranks_(first.request.world_size, nullptr),
      created_(now),
      taken_(first.request.world_size, false),
      batches_per_epoch_(batches_per_epoch) {}

Status DataParallelGroup::Join(EngineJob& job) {
  const protocol::CreateJob& request = job.request;
  if (failed_) {
    return Status::FailedPrecondition(fmt::format(
        "data-parallel job \"{}\" has failed (a rank left or the ranks did not all join in "
        "time); start all its ranks again with a new job key (torchrun: a new rdzv id)",
        key_));
  }
  if (sched_ != 0) {
    return Status::AlreadyExists(fmt::format(
        "data-parallel job \"{}\" already has all its {} ranks; give each job its own key", key_,
        world_size()));
  }
  if (std::string diff = Mismatch(request, request_); !diff.empty()) {
    return Status::InvalidArgument(fmt::format(
        "rank {} of data-parallel job \"{}\" has {}; every rank of a job must ask for the same "
        "dataset, batch size, epochs, transform, drop_last, seed and world size",
        request.rank, key_, diff));
  }
  if (ranks_[request.rank] != nullptr) {
    return Status::AlreadyExists(fmt::format(
        "rank {} of data-parallel job \"{}\" has joined already (job {}); each rank joins once",
        request.rank, key_, ranks_[request.rank]->id));
  }
  ranks_[request.rank] = &job;
  job.source = std::make_unique<RankSource>(*this, job, request.rank);
  ++joined_;
  return Status::OK();
}

Status DataParallelGroup::Start(EngineJob& last, JobId sched, const Roaring& ids, bool set_batch,
                                double now) {
  const uint64_t prefetch_samples =
      uint64_t{request_.prefetch + 1} * global_batch();  // the scheduler clamps it to L
  Status added = scheduler_.AddJob(sched, ids, request_.epochs, prefetch_samples, now);
  if (!added.ok()) {
    ranks_[last.request.rank] = nullptr;
    --joined_;
    last.source.reset();
    return added;
  }
  if (set_batch) scheduler_.SetBatch(sched, global_batch());
  sched_ = sched;
  log::Info("data-parallel job \"{}\": all {} ranks joined in {:.2f} s; global batch {}", key_,
            world_size(), now - created_, global_batch());
  return Status::OK();
}

bool DataParallelGroup::Slice(uint32_t rank, std::vector<Decision>* out, double now) {
  if (failed_ || sched_ == 0) return false;
  if (!front_set_ && !TakeGlobalBatch(now)) return false;
  if (taken_[rank]) return false;  // built already; the others' slices are pending
  const auto begin = front_.begin() + static_cast<ptrdiff_t>(size_t{rank} * slice_);
  out->assign(begin, begin + slice_);
  return true;
}

bool DataParallelGroup::TakeGlobalBatch(double now) {
  const uint64_t b = global_batch();
  const uint32_t r = world_size();
  std::vector<Decision> global;
  const bool more = scheduler_.NextBatch(sched_, b, &global) && !global.empty();
  // The epoch of the queue's front ended short of the agreed count (this node's part is smaller
  // than another's): pad it with whole batches of repeats before the next epoch, or the end.
  const bool epoch_over = !more ? scheduler_.Finished(sched_) : global.front().epoch != epoch_;
  if (epoch_over && epoch_batches_ > 0 && epoch_batches_ < batches_per_epoch_ && !last_.empty()) {
    front_.clear();
    for (size_t i = 0; i < b; ++i) front_.push_back(last_[i % last_.size()]);
    slice_ = static_cast<uint32_t>(b / r);
    front_consumes_ = 0;
    padded_ += b;
  } else {
    if (!more) return false;
    if (global.front().epoch != epoch_) {
      epoch_ = global.front().epoch;
      epoch_batches_ = 0;
    }
    // Beyond the agreed count (this node's part is larger), or a partial last batch with
    // drop_last: dropped.
    if (epoch_batches_ >= batches_per_epoch_ || (global.size() < b && request_.drop_last)) {
      Status consumed = scheduler_.Consume(sched_, global.size(), now);
      if (!consumed.ok()) log::Error("job \"{}\": {}", key_, consumed.ToString());
      for (EngineJob* rank : ranks_) {
        if (rank != nullptr) rank->dropped += global.size() / r;
      }
      return false;
    }
    slice_ = static_cast<uint32_t>((global.size() + r - 1) / r);
    front_consumes_ = global.size();
    const size_t padded = size_t{slice_} * r - global.size();
    for (size_t i = 0; i < padded; ++i) global.push_back(global[i % front_consumes_]);
    padded_ += padded;
    last_ = global;
    front_ = std::move(global);
  }
  ++epoch_batches_;
  taken_.assign(r, false);
  assembled_ = 0;
  front_set_ = true;
  return true;
}

void DataParallelGroup::SliceAssembled(double now) {
  if (failed_ || !front_set_) return;
  if (++assembled_ < world_size()) return;
  if (front_consumes_ > 0) {  // a padding batch takes nothing from the queue
    Status consumed = scheduler_.Consume(sched_, front_consumes_, now);
    if (!consumed.ok()) log::Error("job \"{}\": {}", key_, consumed.ToString());
  }
  front_set_ = false;
  front_.clear();
}

void DataParallelGroup::FinishRank(EngineJob& job) {
  // Also not while the last epoch still owes padding batches (TakeGlobalBatch makes them).
  if (job.builds > 0 || job.done || failed_ || sched_ == 0 || front_set_ ||
      epoch_batches_ < batches_per_epoch_ || !scheduler_.Contains(sched_) ||
      !scheduler_.Finished(sched_)) {
    return;
  }
  job.done = true;
  if (++finished_ == world_size()) LeaveScheduler();
  job.sink->DeliverEndOfData(job.request.epochs);
}

bool DataParallelGroup::LeaveRank(EngineJob& job) {
  ranks_[job.request.rank] = nullptr;
  if (!job.done && !failed_) {
    Fail(Status::Unavailable(fmt::format(
        "rank {} of data-parallel job \"{}\" left before the end of its data (it disconnected, or "
        "its lease expired); the job ends for every rank",
        job.request.rank, key_)));
  }
  if (std::any_of(ranks_.begin(), ranks_.end(), [](const EngineJob* r) { return r != nullptr; })) {
    return false;
  }
  LeaveScheduler();
  return true;
}

void DataParallelGroup::Fail(const Status& why) {
  failed_ = true;
  log::Warn("data-parallel job \"{}\": {}", key_, why.message());
  LeaveScheduler();  // its decisions and references go now; the ranks stay until they leave
  for (EngineJob* rank : ranks_) {
    if (rank != nullptr && !rank->done) {
      rank->done = true;
      rank->sink->DeliverError(why);
    }
  }
}

void DataParallelGroup::CheckJoined(double now, double timeout) {
  if (failed_ || sched_ != 0 || now - created_ <= timeout) return;
  std::vector<uint32_t> missing;
  for (uint32_t r = 0; r < world_size(); ++r) {
    if (ranks_[r] == nullptr) missing.push_back(r);
  }
  Fail(Status::FailedPrecondition(fmt::format(
      "only {} of the {} ranks of data-parallel job \"{}\" joined within {:.0f} s (missing: {}); "
      "check that every rank uses the same job key and world size, or raise the server's "
      "--rank-join-timeout",
      joined_, world_size(), key_, timeout, fmt::join(missing, ", "))));
}

void DataParallelGroup::NoteClient(double now) {
  if (sched_ == 0 || failed_) return;
  // Bound when every rank is (a rank not yet joined is not); starved when every joined rank is.
  bool bound = true, starved = true;
  for (const EngineJob* rank : ranks_) {
    const ClientState s = rank == nullptr ? ClientState::kStarved
                                          : ClientStateOfSlots(rank->pool->FreeCount(),
                                                               rank->pool->slot_count());
    bound = bound && s == ClientState::kBound;
    starved = starved && s == ClientState::kStarved;
  }
  scheduler_.NoteClient(sched_,
                        bound     ? ClientState::kBound
                        : starved ? ClientState::kStarved
                                  : ClientState::kWaitingOnServer,
                        now);
}

void DataParallelGroup::LeaveScheduler() {
  if (sched_ == 0 || !scheduler_.Contains(sched_)) return;
  Status removed = scheduler_.RemoveJob(sched_);
  if (!removed.ok()) log::Error("job \"{}\": {}", key_, removed.ToString());
}

void RankSource::Describe(JobSnapshot& out) const {
  out.job_key = group_.key_;
  out.rank = rank_;
  out.world_size = group_.world_size();
  out.padded = group_.padded_;
}

}  // namespace carpool
