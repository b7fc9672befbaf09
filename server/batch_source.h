// BatchSource: where a job's batches come from. The engine builds, paces, consumes and ends every
// job's batches through this one interface, whether the job is its own participant of the
// sampling tree (SingleJobSource, here) or one rank of a data-parallel job whose group splits
// each global batch into slices (RankSource, server/data_parallel_group.h).
//
// Thread-compatible: the engine holds its lock around every call. Each call is O(batch) at most.
#ifndef CARPOOL_SERVER_BATCH_SOURCE_H_
#define CARPOOL_SERVER_BATCH_SOURCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "carpool/status.h"
#include "server/engine_snapshot.h"
#include "server/scheduler.h"

namespace carpool {

struct EngineJob;

class BatchSource {
 public:
  enum class Front {
    kNone,     // nothing to build now
    kBatch,    // `out` holds the next batch's decisions
    kDropped,  // a partial last batch was dropped (drop_last); nothing to build
  };
  virtual ~BatchSource() = default;

  // The decisions of the job's next batch. O(batch).
  virtual Front Next(std::vector<Decision>* out, double now) = 0;
  // Coupled pacing (docs/scheduler.md "Pacing"): whether the job may take `decisions` samples now.
  virtual bool MayTake(size_t decisions, uint64_t pins, double now) = 0;
  // A batch slot holds the front batch now (its assembly is queued).
  virtual void Taken(size_t decisions) = 0;
  // The front batch is assembled: its `decisions` queue entries are done with.
  virtual void Consumed(size_t decisions, double now) = 0;
  // Sends end-of-data and leaves the sampling tree once all the job's data is delivered.
  virtual void FinishIfDone() = 0;
  // Ends the job (a data-parallel job: every rank) with `why`: its decisions and references go
  // now, the client hears the error.
  virtual void Fail(const Status& why) = 0;
  // The job is being removed. Returns true when it leaves a data-parallel group empty (the engine
  // then drops the group).
  virtual bool Leave() = 0;
  // Tells the scheduler what the job's client is doing (ClientStateOfSlots).
  virtual void NoteClient(double now) = 0;
  // The sampling tree's participant (0 while a group waits for its ranks).
  virtual JobId participant() const = 0;
  // Adds what the source knows to the job's stats (a rank: its key, rank and padding).
  virtual void Describe(JobSnapshot& /*out*/) const {}
};

// A job that is its own participant of the sampling tree.
class SingleJobSource : public BatchSource {
 public:
  // REQUIRES: `scheduler` and `job` outlive the source; `id` was added to the scheduler.
  SingleJobSource(Scheduler& scheduler, EngineJob& job, JobId id)
      : scheduler_(scheduler), job_(job), id_(id) {}

  Front Next(std::vector<Decision>* out, double now) override;
  bool MayTake(size_t decisions, uint64_t pins, double now) override;
  // Batches taken and not yet consumed: a job whose build overlaps its previous one (GPU decode
  // in its process) takes the batch after them.
  void Taken(size_t decisions) override { taken_ += decisions; }
  void Consumed(size_t decisions, double now) override;
  void FinishIfDone() override;
  void Fail(const Status& why) override;
  bool Leave() override;
  void NoteClient(double now) override;
  JobId participant() const override { return id_; }

 private:
  void LeaveScheduler();  // if still in it; a failure is logged (a bookkeeping bug)

  Scheduler& scheduler_;
  EngineJob& job_;
  const JobId id_;
  size_t taken_ = 0;  // decisions of the batches taken and not yet consumed
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_BATCH_SOURCE_H_
