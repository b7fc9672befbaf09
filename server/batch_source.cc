#include "server/batch_source.h"

#include <algorithm>

#include "common/log.h"
#include "server/engine_job.h"

namespace carpool {

BatchSource::Front SingleJobSource::Next(std::vector<Decision>* out, double now) {
  const uint32_t b = job_.request.batch_size;
  if (!scheduler_.NextBatch(id_, b, out, taken_) || out->empty()) return Front::kNone;
  if (out->size() < b && job_.request.drop_last) {
    if (taken_ > 0) {  // dropped from the queue's front: once the batches before it are consumed
      out->clear();
      return Front::kNone;
    }
    Status consumed = scheduler_.Consume(id_, out->size(), now);
    if (!consumed.ok()) log::Error("job {}: {}", job_.id, consumed.ToString());
    job_.dropped += out->size();
    job_.consumed += out->size();
    return Front::kDropped;
  }
  return Front::kBatch;
}

bool SingleJobSource::MayTake(size_t decisions, uint64_t pins, double now) {
  return scheduler_.MayTake(id_, decisions, pins, now, taken_);
}

void SingleJobSource::Consumed(size_t decisions, double now) {
  taken_ -= std::min(taken_, decisions);
  Status consumed = scheduler_.Consume(id_, decisions, now);
  if (!consumed.ok()) log::Error("job {}: {}", job_.id, consumed.ToString());
}

void SingleJobSource::FinishIfDone() {
  if (job_.builds > 0 || job_.done || !scheduler_.Contains(id_) || !scheduler_.Finished(id_)) {
    return;
  }
  job_.done = true;
  LeaveScheduler();
  job_.sink->DeliverEndOfData(job_.request.epochs);
}

void SingleJobSource::Fail(const Status& why) {
  if (job_.done) return;
  log::Warn("job {} fails: {}", job_.id, why.ToString());
  job_.done = true;
  LeaveScheduler();
  job_.sink->DeliverError(why);
}

bool SingleJobSource::Leave() {
  LeaveScheduler();
  return false;
}

void SingleJobSource::NoteClient(double now) {
  if (job_.removed || job_.done) return;
  scheduler_.NoteClient(id_, ClientStateOfSlots(job_.pool->FreeCount(), job_.pool->slot_count()),
                        now);
}

void SingleJobSource::LeaveScheduler() {
  if (!scheduler_.Contains(id_)) return;
  Status removed = scheduler_.RemoveJob(id_);
  if (!removed.ok()) log::Error("job {}: {}", job_.id, removed.ToString());
}

}  // namespace carpool
