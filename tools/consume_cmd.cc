// `carpool consume`: a job on the command line, for smoke tests, warming and benchmarks. It reads
// its batches through the C++ client (include/carpool/client.h), optionally sleeping per batch to
// stand in for training, and writes what it received.
#include <fmt/core.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "carpool/client.h"
#include "tools/command.h"
#include "tools/options.h"
#include "tools/socket_path.h"

namespace carpool::tools {
namespace {

namespace po = boost::program_options;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

Result<std::string> ReadPositionFile(const std::string& path) {
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (f == nullptr) {
    return Status::NotFound(fmt::format("cannot read --resume \"{}\": {}; pass a file written by "
                                        "--checkpoint, or start without --resume",
                                        path, std::strerror(errno)));
  }
  std::string bytes;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f.get())) > 0) bytes.append(buf, n);
  if (std::ferror(f.get())) {
    return Status::IOError(fmt::format("reading --resume \"{}\" failed", path));
  }
  return bytes;
}

// Writes PATH.tmp, then renames it over PATH: a reader (or a restart after kill -9) sees the
// previous position or the new one, never a torn file.
Status WritePositionFile(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::unique_ptr<std::FILE, FileCloser> f(std::fopen(tmp.c_str(), "wb"));
    if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size() ||
        std::fflush(f.get()) != 0) {
      return Status::IOError(fmt::format("cannot write --checkpoint \"{}\": {}", tmp,
                                         std::strerror(errno)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status::IOError(fmt::format("cannot rename \"{}\" to --checkpoint \"{}\": {}", tmp,
                                       path, std::strerror(errno)));
  }
  return Status::OK();
}

constexpr std::string_view kUsage = R"(usage: carpool consume --dataset NAME [options]

Attaches one job to the running server and reads all its batches.

options:
)";

int Fail(const Status& s) {
  fmt::print(stderr, "carpool consume: {}\n", s.ToString());
  return 1;
}

int Consume(int argc, char** argv) {
  JobOptions job_options;
  std::string state_dir, socket, ids_out, checkpoint, resume;
  uint32_t step_ms = 0;
  po::options_description opts;
  opts.add_options()("help,h", "show this help")(
      "dataset", po::value(&job_options.dataset)->required(), "a registered dataset")(
      "batch-size", po::value(&job_options.batch_size), "samples per batch (default 32)")(
      "epochs", po::value(&job_options.epochs), "epochs (default 1)")(
      "transform", po::value(&job_options.transform),
      "per-job transform, e.g. \"random_crop(24)|flip|float32\" (default: none, uint8)")(
      "prefetch", po::value(&job_options.prefetch), "batches prepared ahead (default 4)")(
      "device", po::value(&job_options.device),
      "cpu, or cuda:N for batches built in device memory on GPU N (default cpu)")(
      "drop-last", po::bool_switch(&job_options.drop_last), "drop each epoch's partial batch")(
      "seed", po::value(&job_options.seed), "the job's transform seed (default 0)")(
      "rank", po::value(&job_options.rank), "this rank of a data-parallel job (default 0)")(
      "world-size", po::value(&job_options.world_size),
      "ranks of the data-parallel job; they join with one --job-key (default 1)")(
      "job-key", po::value(&job_options.job_key), "the data-parallel job's key, shared by its ranks")(
      "node", po::value(&job_options.node), "this node of a job spanning several (default 0)")(
      "nodes", po::value(&job_options.nodes), "nodes the job spans, one server each (default 1)")(
      "step-ms", po::value(&step_ms), "sleep this long per batch, standing in for training")(
      "ids-out", po::value(&ids_out), "write epoch,sample_id,label per delivered sample")(
      "checkpoint", po::value(&checkpoint),
      "after every batch, write the job's position to this file (atomically, after --ids-out)")(
      "resume", po::value(&resume),
      "start where the position in this file (from --checkpoint) left off")(
      "json", "print a JSON summary")(
      "socket", po::value(&socket), "server socket (default <state-dir>/carpool.sock)")(
      "state-dir", po::value(&state_dir), "state directory holding the socket");
  po::variables_map vm;
  if (auto rc = ParseCommandLine(argc, argv, "carpool consume", kUsage, opts, &vm)) return *rc;
  Result<std::string> path = ResolveSocketPath(socket, state_dir);
  if (!path.ok()) return Fail(path.status());
  std::unique_ptr<std::FILE, FileCloser> ids;
  if (!ids_out.empty()) {
    ids.reset(std::fopen(ids_out.c_str(), "w"));
    if (ids == nullptr) {
      return Fail(Status::IOError(fmt::format("cannot write --ids-out \"{}\": {}", ids_out,
                                              std::strerror(errno))));
    }
  }
  if (!resume.empty()) {
    Result<std::string> bytes = ReadPositionFile(resume);
    if (!bytes.ok()) return Fail(bytes.status());
    Result<JobPosition> position = JobPosition::Parse(*bytes);
    if (!position.ok()) {
      return Fail(Status::InvalidArgument(
          fmt::format("--resume \"{}\": {}", resume, position.status().message())));
    }
    job_options.resume = std::move(*position);
  }
  Result<std::unique_ptr<Client>> client = Client::Connect(*path);
  if (!client.ok()) return Fail(client.status());
  Result<std::unique_ptr<Job>> job = (*client)->CreateJob(job_options);
  if (!job.ok()) return Fail(job.status());

  const auto start = std::chrono::steady_clock::now();
  uint64_t batches = 0, samples = 0, skipped = 0;
  std::vector<double> waits_ms;  // each Next()'s wait for its batch
  for (;;) {
    const auto asked = std::chrono::steady_clock::now();
    Result<std::optional<Batch>> batch = (*job)->Next();
    waits_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - asked).count());
    if (!batch.ok()) return Fail(batch.status());
    if (!batch->has_value()) break;
    const Batch& b = **batch;
    ++batches;
    samples += b.size();
    skipped += b.skipped();
    if (ids != nullptr) {
      std::span<const uint32_t> sample_ids = b.sample_ids();
      std::span<const int32_t> labels = b.labels();
      for (size_t i = 0; i < sample_ids.size(); ++i) {
        fmt::print(ids.get(), "{},{},{}\n", b.epoch(), sample_ids[i], labels[i]);
      }
    }
    batch->reset();  // release the slot before "training", as a real job would after copying
    if (!checkpoint.empty()) {
      // The ids first: a kill between the two leaves ids past the checkpoint, never fewer.
      if (ids != nullptr && std::fflush(ids.get()) != 0) {
        return Fail(Status::IOError(
            fmt::format("writing --ids-out \"{}\" failed: {}", ids_out, std::strerror(errno))));
      }
      if (Status saved = WritePositionFile(checkpoint, (*job)->Position().Serialize());
          !saved.ok()) {
        return Fail(saved);
      }
    }
    if (step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (ids != nullptr && (std::fflush(ids.get()) != 0 || std::ferror(ids.get()))) {
    return Fail(Status::IOError(
        fmt::format("writing --ids-out \"{}\" failed: {}", ids_out, std::strerror(errno))));
  }
  const double rate = seconds > 0 ? static_cast<double>(samples) / seconds : 0.0;
  std::sort(waits_ms.begin(), waits_ms.end());
  auto quantile = [&](double q) {
    return waits_ms.empty() ? 0.0 : waits_ms[std::min(waits_ms.size() - 1,
                                                      static_cast<size_t>(q * waits_ms.size()))];
  };
  if (vm.count("json")) {
    const nlohmann::ordered_json summary = {
        {"job", (*job)->id()},      {"batches", batches},          {"samples", samples},
        {"seconds", seconds},       {"samples_per_s", rate},       {"skipped", skipped},
        {"epochs", (*job)->epochs()}, {"start_epoch", (*job)->start_epoch()},
        {"start_batch", (*job)->start_batch()}, {"wait_ms_p50", quantile(0.5)},
        {"wait_ms_p99", quantile(0.99)}, {"wait_ms_max", waits_ms.empty() ? 0.0 : waits_ms.back()}};
    fmt::print("{}\n", summary.dump());
  } else {
    fmt::print("job {}: {} batches, {} samples in {:.2f} s ({:.0f} samples/s), {} skipped\n",
               (*job)->id(), batches, samples, seconds, rate, skipped);
  }
  return 0;
}

const CommandRegistrar kRegistrar("consume", "attach a job to the server and read its batches",
                                  Consume);

}  // namespace
}  // namespace carpool::tools
