// Writes the libFuzzer seed corpus (protocol/fuzz_corpus): one valid frame per message variant,
// each encoded by EncodeFrame, so the seeds change only when the wire format does.
// Usage: carpool_fuzz_seed_gen OUT_DIR. scripts/fuzz.sh checks the checked-in corpus against it.
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "protocol/id_set.h"
#include "protocol/protocol.h"

namespace carpool::protocol {
namespace {

// One seed per shape a valid frame can take: CPU and GPU jobs and batches, a job of its own and
// a data-parallel rank, a GPU job that decodes in its process and its decode frames (a work, its
// answer, a failed answer). Values are small and distinct, so that a mutated field is easy to
// spot.
std::vector<std::pair<std::string, Message>> Seeds() {
  const JobInfo cpu_job{.job_id = 7,
                        .dataset_size = 1000,
                        .batches_per_epoch = 32,
                        .batch_size = 32,
                        .epochs = 2,
                        .sample_shape = {28, 28, 1},
                        .dtype = DType::kUint8,
                        .layout = Layout::kNHWC,
                        .segment_name = "carpool-seed-07",
                        .slot_count = 2,
                        .slot_bytes = 4096};
  JobInfo gpu_job = cpu_job;
  gpu_job.sample_shape = {3, 8, 8};
  gpu_job.dtype = DType::kFloat32;
  gpu_job.layout = Layout::kNCHW;
  gpu_job.device = 0;
  gpu_job.device_handle = std::string(kIpcHandleBytes, '\x11');
  gpu_job.device_pci_bus_id = "0000:01:00.0";
  gpu_job.device_slot_stride = 8192;
  gpu_job.device_slot_bytes = 8000;
  gpu_job.device_offset = 256;
  const BatchReady host_batch{.job_id = 7,
                              .slot = 1,
                              .generation = 3,
                              .epoch = 0,
                              .batch_index = 5,
                              .sample_count = 2,
                              .images_offset = 0,
                              .images_bytes = 1568,
                              .labels_offset = 1568,
                              .labels_bytes = 8,
                              .ids_offset = 1576,
                              .ids_bytes = 8,
                              .skipped = 1};
  BatchReady device_batch = host_batch;
  device_batch.on_device = true;
  device_batch.device_labels_offset = 1600;
  JobInfo decode_job = gpu_job;
  decode_job.decode_in_job = true;
  // Two JPEGs of 8 x 8 x 3, the second one's pixels 256 bytes after the first's.
  const DecodeWork decode_work{.job_id = 7,
                               .work_id = 1,
                               .prepare = "resize=8,crop=8,decode=gpu",
                               .output_bytes = 448,
                               .items = {DecodeItem{.offset = 0,
                                                    .length = 300,
                                                    .height = 8,
                                                    .width = 8,
                                                    .channels = 3,
                                                    .dst_offset = 0},
                                         DecodeItem{.offset = 300,
                                                    .length = 250,
                                                    .height = 8,
                                                    .width = 8,
                                                    .channels = 3,
                                                    .dst_offset = 256}}};
  const DecodeDone decode_done{.job_id = 7,
                               .work_id = 1,
                               .code = StatusCode::kOk,
                               .message = "",
                               .buffer_handle = std::string(kIpcHandleBytes, '\x22'),
                               .buffer_offset = 0,
                               .buffer_bytes = 4096,
                               .failed = {1}};
  const DecodeDone decode_failed{.job_id = 7,
                                 .work_id = 2,
                                 .code = StatusCode::kUnavailable,
                                 .message = "no nvjpeg",
                                 .buffer_handle = "",
                                 .buffer_offset = 0,
                                 .buffer_bytes = 0,
                                 .failed = {}};
  return {
      {"hello", Hello{.pid = 4321, .client_name = "seed"}},
      {"hello-reply", HelloReply{.server_instance = "srv-1",
                                 .lease_ms = 2000,
                                 .max_payload_bytes = kMaxPayloadBytes,
                                 .max_batch_size = 1024,
                                 .max_prefetch = 8}},
      {"create-job", CreateJob{.dataset = "fmnist",
                               .batch_size = 32,
                               .epochs = 2,
                               .transform = "flip",
                               .device = "cpu",
                               .prefetch = 2,
                               .drop_last = true,
                               .seed = 1}},
      {"create-job-ddp", CreateJob{.dataset = "fmnist",
                                   .batch_size = 16,
                                   .epochs = 1,
                                   .device = "cuda:0",
                                   .prefetch = 4,
                                   .seed = 2,
                                   .job_key = "run",
                                   .rank = 1,
                                   .world_size = 2,
                                   .node = 1,
                                   .nodes = 2}},
      {"create-job-decode", CreateJob{.dataset = "jpegs",
                                      .batch_size = 32,
                                      .epochs = 1,
                                      .device = "cuda:0",
                                      .prefetch = 2,
                                      .seed = 3,
                                      .decode_in_job = true}},
      {"create-job-resume", CreateJob{.dataset = "fmnist",
                                      .batch_size = 32,
                                      .epochs = 3,
                                      .device = "cpu",
                                      .prefetch = 4,
                                      .resume_epoch = 1,
                                      .resume_batches = 5,
                                      .resume_taken = EncodeIdSet({2, 3, 4, 9, 40, 41})}},
      {"job-info", cpu_job},
      {"job-info-gpu", gpu_job},
      {"job-info-decode", decode_job},
      {"batch-ready", host_batch},
      {"batch-ready-gpu", device_batch},
      {"release", Release{.job_id = 7, .slot = 1, .generation = 3}},
      {"heartbeat", Heartbeat{}},
      {"stats-request", StatsRequest{.job_id = 7}},
      {"stats-reply", StatsReply{.json = R"({"jobs":1})"}},
      {"error", Error{.code = StatusCode::kNotFound, .message = "no dataset"}},
      {"end-of-data", EndOfData{.job_id = 7, .epochs_completed = 2}},
      {"bye", Bye{}},
      {"decode-segment", DecodeSegment{.job_id = 7, .bytes = 1 << 20}},
      {"decode-work", decode_work},
      {"decode-done", decode_done},
      {"decode-done-failed", decode_failed},
  };
}

int Run(const std::string& out_dir) {
  for (const auto& [name, message] : Seeds()) {
    auto frame = EncodeFrame(message);
    if (!frame.ok()) {
      std::fprintf(stderr, "seed %s does not encode: %s\n", name.c_str(),
                   frame.status().ToString().c_str());
      return 1;
    }
    const std::string path = out_dir + "/" + name;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    bool written = f != nullptr && std::fwrite(frame->data(), 1, frame->size(), f) == frame->size();
    if (f != nullptr && std::fclose(f) != 0) written = false;
    if (!written) {
      std::fprintf(stderr, "cannot write %s; does the folder exist?\n", path.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace carpool::protocol

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR (writes one frame per message variant)\n", argv[0]);
    return 2;
  }
  return carpool::protocol::Run(argv[1]);
}
