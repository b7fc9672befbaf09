// DataParallelGroup: the ranks that join with one job key (CreateJob with world_size > 1), one
// participant of the sampling tree. Its front global batch, once taken from the scheduler, is
// padded (last batch of an epoch, no drop_last) to world_size equal slices; each rank builds its
// slice when it has a free slot, and the group consumes the batch once every slice is built.
// Every rank takes the same number of steps (node_partition.h: AgreedBatchesPerEpoch).
// docs/ddp.md describes the semantics. RankSource is one rank's BatchSource over its group.
//
// Thread-compatible: the engine holds its lock around every call.
#ifndef CARPOOL_SERVER_DATA_PARALLEL_GROUP_H_
#define CARPOOL_SERVER_DATA_PARALLEL_GROUP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "carpool/status.h"
#include "protocol/protocol.h"
#include "server/batch_source.h"
#include "server/scheduler.h"

namespace carpool {

struct EngineJob;

class DataParallelGroup {
 public:
  // The group of `first`'s job key, with `first`'s request as the fields every rank must share.
  // REQUIRES: `scheduler` outlives the group.
  DataParallelGroup(Scheduler& scheduler, const EngineJob& first, uint64_t batches_per_epoch,
                    double now);

  // Adds `job` as its request's rank and gives it its RankSource. Errors name the key and the
  // fix: a failed group, a full one, a request unlike the first rank's, a rank joined twice.
  Status Join(EngineJob& job);
  bool complete() const { return joined_ == world_size() && sched_ == 0; }
  // Once every rank has joined (`last` the latest): the group enters the sampling tree as `sched`
  // over `ids`. On an error `last` is taken out again, as if it had never joined.
  Status Start(EngineJob& last, JobId sched, const Roaring& ids, bool set_batch, double now);
  // Fails the group when its ranks have not all joined within `timeout` seconds of the first.
  void CheckJoined(double now, double timeout);
  // Tells the scheduler what the group's clients are doing: bound when every rank is, starved
  // when every rank is, else waiting on the server.
  void NoteClient(double now);
  // Every rank hears `why`; the decisions and references go now, the ranks stay until they leave.
  void Fail(const Status& why);

  const std::string& key() const { return key_; }
  uint32_t world_size() const { return request_.world_size; }
  uint64_t global_batch() const { return uint64_t{request_.world_size} * request_.batch_size; }

 private:
  friend class RankSource;
  bool Slice(uint32_t rank, std::vector<Decision>* out, double now);  // false: none to build now
  bool TakeGlobalBatch(double now);  // the next global batch (or padding); false: none
  void SliceAssembled(double now);   // the last slice consumes the batch
  void FinishRank(EngineJob& job);   // end-of-data once the group's data is all delivered
  bool LeaveRank(EngineJob& job);    // true: no rank left
  void LeaveScheduler();

  Scheduler& scheduler_;
  const std::string key_;
  const protocol::CreateJob request_;  // of the first rank to join
  std::vector<EngineJob*> ranks_;      // by rank; null until it joins, and after it leaves
  uint32_t joined_ = 0;
  const double created_;               // of the first join
  JobId sched_ = 0;                    // the scheduler's participant once every rank joined
  bool failed_ = false;                // a rank left early or the ranks did not all join in time
  uint32_t finished_ = 0;              // ranks that received end-of-data

  // The front global batch.
  bool front_set_ = false;
  std::vector<Decision> front_;  // world_size x slice entries, padding included
  size_t front_consumes_ = 0;    // queue entries it takes (its size before padding)
  uint32_t slice_ = 0;           // samples per rank
  std::vector<bool> taken_;      // the rank has a slot for its slice
  uint32_t assembled_ = 0;       // slices whose assembly finished
  uint64_t padded_ = 0;          // entries repeated to give every rank an equal last batch
  const uint64_t batches_per_epoch_;
  uint32_t epoch_ = 0;           // of the latest global batch
  uint64_t epoch_batches_ = 0;   // global batches of `epoch_` so far
  std::vector<Decision> last_;   // the latest full-data global batch: the source of padding
};

// One rank's batches: its slice of each of its group's global batches.
class RankSource : public BatchSource {
 public:
  RankSource(DataParallelGroup& group, EngineJob& job, uint32_t rank)
      : group_(group), job_(job), rank_(rank) {}

  Front Next(std::vector<Decision>* out, double now) override {
    return group_.Slice(rank_, out, now) ? Front::kBatch : Front::kNone;
  }
  bool MayTake(size_t, uint64_t, double) override { return true; }  // paced as one participant
  void Taken(size_t /*decisions*/) override { group_.taken_[rank_] = true; }
  void Consumed(size_t, double now) override { group_.SliceAssembled(now); }
  void FinishIfDone() override { group_.FinishRank(job_); }
  void Fail(const Status& why) override {
    if (!group_.failed_) group_.Fail(why);
  }
  bool Leave() override { return group_.LeaveRank(job_); }
  void NoteClient(double) override {}  // the group's, for all its ranks
  JobId participant() const override { return group_.sched_; }
  void Describe(JobSnapshot& out) const override;

 private:
  DataParallelGroup& group_;
  EngineJob& job_;
  const uint32_t rank_;
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_DATA_PARALLEL_GROUP_H_
