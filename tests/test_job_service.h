// Test-only JobService: produces deterministic batches into real BatchPools, one producer thread
// per job, so the control plane and the client can be tested with real sockets, shared memory
// and processes before the engine exists. Thread-safe.
//
// Datasets: "digits" (50 samples) and "tiny" (5). Sample id i of epoch e has label i % 10 and a
// 2x2x1 uint8 image whose byte k is (i * 3 + e + k) & 0xff. Ids come in order 0..n-1 each epoch.
#ifndef CARPOOL_TESTS_TEST_JOB_SERVICE_H_
#define CARPOOL_TESTS_TEST_JOB_SERVICE_H_

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "server/batch_pool.h"
#include "server/job_service.h"

namespace carpool {

inline uint8_t TestImageByte(uint32_t id, uint32_t epoch, uint32_t k) {
  return static_cast<uint8_t>(id * 3 + epoch + k);
}
inline constexpr uint32_t kTestSampleBytes = 4;

class TestJobService : public JobService {
 public:
  explicit TestJobService(std::string instance) : instance_(std::move(instance)) {}
  ~TestJobService() override;

  Result<protocol::JobInfo> CreateJob(const protocol::CreateJob& request,
                                      std::shared_ptr<JobSink> sink) override;
  Status Release(uint64_t job_id, uint32_t slot, uint64_t generation) override;
  void RemoveJob(uint64_t job_id) override;
  // {"active_jobs":N,"removed_jobs":M} or, for a job,
  // {"job":ID,"delivered":D,"unreleased":U,"max_unreleased":X}.
  std::string Stats(uint64_t job_id) override;
  // The job's sink (its session; job_decoder() is the job's process as a decoder) when its
  // job-info said decode_in_job; else null.
  std::shared_ptr<JobSink> DecoderOf(uint64_t job_id);
  // RemoveJob takes this long before it removes anything, as an engine waiting for a build does.
  void SetRemoveDelay(std::chrono::milliseconds delay) { remove_delay_ = delay; }

 private:
  struct Job {
    protocol::CreateJob request;
    protocol::JobInfo info;
    std::shared_ptr<JobSink> sink;
    std::unique_ptr<BatchPool> pool;
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> delivered{0};
    std::atomic<uint32_t> max_unreleased{0};
    std::thread producer;
  };
  void Produce(Job& job);

  std::string instance_;
  Mutex mu_;
  std::map<uint64_t, std::shared_ptr<Job>> jobs_ GUARDED_BY(mu_);
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  uint64_t removed_ GUARDED_BY(mu_) = 0;
  std::atomic<std::chrono::milliseconds> remove_delay_{std::chrono::milliseconds(0)};
};

}  // namespace carpool

#endif  // CARPOOL_TESTS_TEST_JOB_SERVICE_H_
