// StandaloneLoader: the baseline of `carpool bench e2e`, what a training job runs today without
// carpool. One loader per job, its own worker threads and its own per-epoch uniform shuffle, built
// from the same code the server uses (SampleReader, PrepareSample, AssembleBatch), with no
// sharing and no cache: every delivered sample is read, decoded and transformed for this job
// alone. Like PyTorch's DataLoader, each worker builds whole batches and batches are delivered in
// order, up to `prefetch` batches ahead of the consumer.
//
// Thread contract: Next() and preparations() from one thread at a time; the workers are internal.
#ifndef CARPOOL_TOOLS_BENCH_STANDALONE_LOADER_H_
#define CARPOOL_TOOLS_BENCH_STANDALONE_LOADER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "carpool/status.h"
#include "datasets/catalog.h"
#include "datasets/prepare_spec.h"
#include "datasets/sample_reader.h"
#include "server/transform.h"

namespace carpool::tools {

struct StandaloneOptions {
  std::vector<SampleRecord> samples;  // the job's dataset
  PrepareSpec prepare;                // the dataset's prepare spec
  TransformSpec transform;            // the job's transform
  uint32_t batch_size = 32;
  uint32_t epochs = 1;
  uint32_t workers = 1;   // threads that read, prepare and assemble
  uint32_t prefetch = 4;  // batches built ahead of the consumer; raised to `workers` if lower
  uint64_t seed = 0;      // shuffle and transform randomness
  bool drop_last = false;
};

struct StandaloneBatch {
  uint32_t epoch = 0;
  uint64_t index = 0;  // within the epoch
  ImageShape image_shape;
  std::vector<uint32_t> sample_ids;
  std::vector<int32_t> labels;
  std::vector<uint64_t> storage;  // the images, contiguous, 8-byte aligned

  const void* images() const { return storage.data(); }
};

class StandaloneLoader {
 public:
  // Starts the workers. InvalidArgument for an empty dataset or a zero batch size, epochs or
  // workers.
  static Result<std::unique_ptr<StandaloneLoader>> Start(StandaloneOptions options);
  ~StandaloneLoader();  // stops and joins the workers
  StandaloneLoader(const StandaloneLoader&) = delete;
  StandaloneLoader& operator=(const StandaloneLoader&) = delete;

  // The next batch in order, std::nullopt after the last epoch, or the first read/prepare error
  // (the loader is finished after an error).
  Result<std::optional<StandaloneBatch>> Next();

  uint64_t batches_per_epoch() const { return batches_per_epoch_; }
  // Samples read and prepared so far (including batches built ahead and not yet taken).
  uint64_t preparations() const { return preparations_.load(std::memory_order_relaxed); }

 private:
  explicit StandaloneLoader(StandaloneOptions options);
  void WorkerLoop();
  // The sample indices of global batch g, shuffling its epoch on first use.
  std::vector<uint32_t> BatchMembers(uint64_t g) REQUIRES(mu_);
  Result<StandaloneBatch> Build(uint64_t g, const std::vector<uint32_t>& members);

  const StandaloneOptions options_;
  const uint64_t batches_per_epoch_;
  const uint64_t total_batches_;
  SampleReader reader_;
  std::atomic<uint64_t> preparations_{0};

  Mutex mu_;
  std::condition_variable cv_;
  uint64_t next_build_ GUARDED_BY(mu_) = 0;    // the next batch a worker starts
  uint64_t next_deliver_ GUARDED_BY(mu_) = 0;  // the next batch Next() returns
  bool stop_ GUARDED_BY(mu_) = false;
  std::map<uint64_t, Result<StandaloneBatch>> ready_ GUARDED_BY(mu_);
  std::map<uint32_t, std::vector<uint32_t>> orders_ GUARDED_BY(mu_);  // epoch -> permutation
  std::vector<std::thread> workers_;
};

}  // namespace carpool::tools

#endif  // CARPOOL_TOOLS_BENCH_STANDALONE_LOADER_H_
