// The C ABI (include/carpool/carpool.h) over the C++ client. No exception crosses it.
#include "carpool/carpool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "carpool/client.h"

struct carpool_client {
  std::unique_ptr<carpool::Client> impl;
};
struct carpool_job {
  std::unique_ptr<carpool::Job> impl;
};
struct carpool_batch {
  carpool::Batch impl;
};

namespace {

thread_local std::string last_error;

carpool_status Fail(const carpool::Status& s) {
  last_error = s.ToString();
  return static_cast<carpool_status>(s.code());
}

carpool_status Invalid(const char* what) {
  return Fail(carpool::Status::InvalidArgument(what));
}

carpool_status Ok() {
  last_error.clear();
  return CARPOOL_OK;
}

// Runs fn, turning an escaping exception (e.g. bad_alloc) into an internal error.
template <typename Fn>
carpool_status Guard(Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return Fail(carpool::Status::Internal(e.what()));
  }
}

char* CopyString(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

}  // namespace

extern "C" {

const char* carpool_last_error(void) { return last_error.c_str(); }

carpool_status carpool_connect(const char* socket_path, carpool_client** out) {
  if (socket_path == nullptr || out == nullptr) return Invalid("socket_path and out are required");
  *out = nullptr;
  return Guard([&] {
    auto client = carpool::Client::Connect(socket_path);
    if (!client.ok()) return Fail(client.status());
    *out = new carpool_client{std::move(*client)};
    return Ok();
  });
}

void carpool_client_free(carpool_client* client) { delete client; }

carpool_status carpool_client_stats(carpool_client* client, char** out_json) {
  if (client == nullptr || out_json == nullptr) return Invalid("client and out_json are required");
  *out_json = nullptr;
  return Guard([&] {
    auto stats = client->impl->Stats();
    if (!stats.ok()) return Fail(stats.status());
    *out_json = CopyString(*stats);
    return Ok();
  });
}

carpool_status carpool_job_create(carpool_client* client, const carpool_job_options* o,
                                  carpool_job** out) {
  if (client == nullptr || o == nullptr || out == nullptr || o->dataset == nullptr) {
    return Invalid("client, options (with a dataset) and out are required");
  }
  *out = nullptr;
  return Guard([&] {
    carpool::JobOptions options;
    options.dataset = o->dataset;
    options.batch_size = o->batch_size;
    options.epochs = o->epochs == 0 ? 1 : o->epochs;
    if (o->transform != nullptr) options.transform = o->transform;
    if (o->device != nullptr) options.device = o->device;
    if (o->prefetch != 0) options.prefetch = o->prefetch;
    options.drop_last = o->drop_last != 0;
    options.seed = o->seed;
    if (o->silence_timeout_ms != 0) {
      options.silence_timeout = std::chrono::milliseconds(o->silence_timeout_ms);
    }
    if (o->job_key != nullptr) options.job_key = o->job_key;
    options.rank = o->rank;
    options.world_size = o->world_size == 0 ? 1 : o->world_size;
    options.node = o->node;
    options.nodes = o->nodes == 0 ? 1 : o->nodes;
    if (o->resume != nullptr && o->resume_bytes > 0) {
      auto position = carpool::JobPosition::Parse(
          std::string_view(static_cast<const char*>(o->resume), o->resume_bytes));
      if (!position.ok()) return Fail(position.status());
      options.resume = std::move(*position);
    }
    auto job = client->impl->CreateJob(options);
    if (!job.ok()) return Fail(job.status());
    *out = new carpool_job{std::move(*job)};
    return Ok();
  });
}

void carpool_job_free(carpool_job* job) { delete job; }

carpool_status carpool_job_info_get(const carpool_job* job, carpool_job_info* out) {
  if (job == nullptr || out == nullptr) return Invalid("job and out are required");
  const carpool::Job& j = *job->impl;
  *out = carpool_job_info{};
  out->job_id = j.id();
  out->dataset_size = j.dataset_size();
  out->batches_per_epoch = j.batches_per_epoch();
  out->epochs = j.epochs();
  std::vector<int64_t> shape = j.sample_shape();
  out->sample_rank = static_cast<uint32_t>(std::min<size_t>(shape.size(), 4));
  for (uint32_t i = 0; i < out->sample_rank; ++i) out->sample_shape[i] = shape[i];
  out->dtype = static_cast<int32_t>(j.dtype());
  out->layout = static_cast<int32_t>(j.layout());
  out->device = j.device();
  out->start_epoch = j.start_epoch();
  out->start_batch = j.start_batch();
  return Ok();
}

carpool_status carpool_job_position(const carpool_job* job, int32_t exclude_latest, char** out,
                                    size_t* out_bytes) {
  if (job == nullptr || out == nullptr || out_bytes == nullptr) {
    return Invalid("job, out and out_bytes are required");
  }
  *out = nullptr;
  *out_bytes = 0;
  return Guard([&] {
    const std::string bytes = job->impl->Position(exclude_latest != 0).Serialize();
    *out = static_cast<char*>(std::malloc(bytes.size()));
    if (*out == nullptr) return Fail(carpool::Status::Internal("out of memory"));
    std::memcpy(*out, bytes.data(), bytes.size());
    *out_bytes = bytes.size();
    return Ok();
  });
}

carpool_status carpool_position_describe(const void* bytes, size_t n, char** out_json) {
  if (bytes == nullptr || out_json == nullptr) return Invalid("bytes and out_json are required");
  *out_json = nullptr;
  return Guard([&] {
    auto p = carpool::JobPosition::Parse(std::string_view(static_cast<const char*>(bytes), n));
    if (!p.ok()) return Fail(p.status());
    const nlohmann::ordered_json j = {{"dataset", p->dataset},     {"epochs", p->epochs},
                                      {"epoch", p->epoch},         {"batches", p->batches},
                                      {"samples", p->samples},     {"taken", p->taken.size()}};
    *out_json = CopyString(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    return Ok();
  });
}

carpool_status carpool_job_next(carpool_job* job, carpool_batch** out) {
  if (job == nullptr || out == nullptr) return Invalid("job and out are required");
  *out = nullptr;
  return Guard([&] {
    auto batch = job->impl->Next();
    if (!batch.ok()) return Fail(batch.status());
    if (batch->has_value()) *out = new carpool_batch{std::move(**batch)};
    return Ok();
  });
}

carpool_status carpool_job_stats(carpool_job* job, char** out_json) {
  if (job == nullptr || out_json == nullptr) return Invalid("job and out_json are required");
  *out_json = nullptr;
  return Guard([&] {
    auto stats = job->impl->Stats();
    if (!stats.ok()) return Fail(stats.status());
    *out_json = CopyString(*stats);
    return Ok();
  });
}

void carpool_batch_free(carpool_batch* batch) { delete batch; }
void carpool_batch_release(carpool_batch* batch) {
  if (batch != nullptr) batch->impl.Release();
}

const void* carpool_batch_images(const carpool_batch* b) { return b->impl.images().data; }
int32_t carpool_batch_device(const carpool_batch* b) { return b->impl.images().device; }
int64_t* carpool_batch_device_labels(const carpool_batch* b) { return b->impl.device_labels(); }
size_t carpool_batch_image_bytes(const carpool_batch* b) { return b->impl.images().bytes; }
uint32_t carpool_batch_image_shape(const carpool_batch* b, int64_t* dims, uint32_t max_rank) {
  const std::vector<int64_t>& shape = b->impl.images().shape;
  for (uint32_t i = 0; i < max_rank && i < shape.size(); ++i) dims[i] = shape[i];
  return static_cast<uint32_t>(shape.size());
}
uint32_t carpool_batch_size(const carpool_batch* b) { return b->impl.size(); }
const int32_t* carpool_batch_labels(const carpool_batch* b) { return b->impl.labels().data(); }
const uint32_t* carpool_batch_sample_ids(const carpool_batch* b) {
  return b->impl.sample_ids().data();
}
uint32_t carpool_batch_epoch(const carpool_batch* b) { return b->impl.epoch(); }
uint64_t carpool_batch_index(const carpool_batch* b) { return b->impl.index(); }
uint32_t carpool_batch_skipped(const carpool_batch* b) { return b->impl.skipped(); }

void carpool_string_free(char* s) { std::free(s); }

}  // extern "C"
