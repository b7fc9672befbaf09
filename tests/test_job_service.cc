#include "tests/test_job_service.h"

#include <fmt/format.h>

#include <cstring>
#include <nlohmann/json.hpp>

namespace carpool {
namespace {

uint64_t DatasetSize(const std::string& name) {
  if (name == "digits") return 50;
  if (name == "tiny") return 5;
  return 0;
}

}  // namespace

TestJobService::~TestJobService() {
  std::map<uint64_t, std::shared_ptr<Job>> jobs;
  {
    MutexLock lock(mu_);
    jobs.swap(jobs_);
  }
  for (auto& [id, job] : jobs) {
    job->stop = true;
    job->pool->Shutdown();
    job->producer.join();
  }
}

Result<protocol::JobInfo> TestJobService::CreateJob(const protocol::CreateJob& request,
                                                    std::shared_ptr<JobSink> sink) {
  uint64_t size = DatasetSize(request.dataset);
  if (size == 0) {
    return Status::NotFound(fmt::format(
        "dataset \"{}\" not found (known: digits, tiny); register it with 'carpool dataset add'",
        request.dataset));
  }
  auto job = std::make_shared<Job>();
  {
    MutexLock lock(mu_);
    job->info.job_id = next_id_++;
  }
  slots::BatchLayout layout = slots::PlanBatchLayout(request.batch_size, kTestSampleBytes);
  auto pool = BatchPool::Create(BatchPool::SegmentName(instance_, job->info.job_id),
                                job->info.job_id, request.prefetch, layout.total_bytes);
  if (!pool.ok()) return pool.status();
  job->request = request;
  job->sink = std::move(sink);
  job->pool = std::move(*pool);
  protocol::JobInfo& info = job->info;
  info.dataset_size = size;
  info.batch_size = request.batch_size;
  info.epochs = request.epochs;
  info.batches_per_epoch = request.drop_last ? size / request.batch_size
                                             : (size + request.batch_size - 1) / request.batch_size;
  info.sample_shape = {2, 2, 1};
  info.dtype = DType::kUint8;
  info.layout = Layout::kNHWC;
  info.segment_name = job->pool->name();
  info.slot_count = job->pool->slot_count();
  info.slot_bytes = job->pool->slot_bytes();
  // The test drives the job's decoder itself (DecoderOf): a job that offers gets decode work.
  info.decode_in_job = request.decode_in_job && job->sink->job_decoder() != nullptr;
  if (info.decode_in_job) {  // only a GPU job decodes: described as one (a raw client ignores it)
    info.device = 0;
    info.device_handle.assign(protocol::kIpcHandleBytes, '\0');
    info.device_pci_bus_id = "0000:00:00.0";
    info.device_slot_stride = info.device_slot_bytes = 256;
  }
  {
    MutexLock lock(mu_);
    jobs_[info.job_id] = job;
  }
  job->producer = std::thread([this, j = job.get()] { Produce(*j); });
  return info;
}

void TestJobService::Produce(Job& job) {
  const protocol::JobInfo& info = job.info;
  for (uint32_t epoch = 0; epoch < info.epochs; ++epoch) {
    for (uint64_t b = 0; b < info.batches_per_epoch; ++b) {
      std::optional<WritableSlot> slot;
      while (!slot) {
        if (job.stop) return;
        slot = job.pool->Acquire(std::chrono::milliseconds(50));
      }
      uint64_t first = b * info.batch_size;
      auto n = static_cast<uint32_t>(std::min<uint64_t>(info.batch_size, info.dataset_size - first));
      slots::BatchLayout l = slots::PlanBatchLayout(n, kTestSampleBytes);
      uint8_t* data = slot->data.data();
      for (uint32_t i = 0; i < n; ++i) {
        auto id = static_cast<uint32_t>(first + i);
        auto label = static_cast<int32_t>(id % 10);
        for (uint32_t k = 0; k < kTestSampleBytes; ++k) {
          data[l.images_offset + i * kTestSampleBytes + k] = TestImageByte(id, epoch, k);
        }
        std::memcpy(data + l.labels_offset + 4 * i, &label, 4);
        std::memcpy(data + l.ids_offset + 4 * i, &id, 4);
      }
      auto gen = job.pool->Publish(slot->index);
      if (!gen.ok()) return job.sink->DeliverError(gen.status());
      uint32_t unreleased = job.pool->PublishedCount();
      uint32_t seen = job.max_unreleased.load();
      while (unreleased > seen && !job.max_unreleased.compare_exchange_weak(seen, unreleased)) {
      }
      job.delivered += 1;
      job.sink->DeliverBatch(MakeBatchReady(info.job_id, slot->index, *gen, epoch, b, n, l));
    }
  }
  job.sink->DeliverEndOfData(info.epochs);
}

Status TestJobService::Release(uint64_t job_id, uint32_t slot, uint64_t generation) {
  std::shared_ptr<Job> job;
  {
    MutexLock lock(mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return Status::NotFound(fmt::format("job {} is gone", job_id));
    job = it->second;
  }
  return job->pool->Release(slot, generation);
}

void TestJobService::RemoveJob(uint64_t job_id) {
  std::this_thread::sleep_for(remove_delay_.load());
  std::shared_ptr<Job> job;
  {
    MutexLock lock(mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return;
    job = std::move(it->second);
    jobs_.erase(it);
    ++removed_;
  }
  job->stop = true;
  job->pool->Shutdown();
  job->producer.join();
  job->pool->ReleaseAll();
  job->sink.reset();
}  // the pool's destructor unlinks the segment

std::string TestJobService::Stats(uint64_t job_id) {
  MutexLock lock(mu_);
  if (job_id == 0) {
    return nlohmann::json{{"active_jobs", jobs_.size()}, {"removed_jobs", removed_}}.dump();
  }
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return nlohmann::json::object().dump();
  const Job& j = *it->second;
  return nlohmann::ordered_json{{"job", job_id},
                                {"delivered", j.delivered.load()},
                                {"unreleased", j.pool->PublishedCount()},
                                {"max_unreleased", j.max_unreleased.load()}}
      .dump();
}

}  // namespace carpool

namespace carpool {

std::shared_ptr<JobSink> TestJobService::DecoderOf(uint64_t job_id) {
  MutexLock lock(mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() || !it->second->info.decode_in_job ? nullptr : it->second->sink;
}

}  // namespace carpool
