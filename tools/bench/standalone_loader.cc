#include "tools/bench/standalone_loader.h"

#include <fmt/core.h>

#include <algorithm>
#include <numeric>
#include <opencv2/core.hpp>
#include <random>
#include <span>
#include <utility>

#include "server/assemble.h"
#include "server/prepare.h"

namespace carpool::tools {

namespace {

uint64_t BatchesPerEpoch(const StandaloneOptions& o) {
  const uint64_t n = o.samples.size();
  if (o.batch_size == 0) return 0;
  return o.drop_last ? n / o.batch_size : (n + o.batch_size - 1) / o.batch_size;
}

}  // namespace

Result<std::unique_ptr<StandaloneLoader>> StandaloneLoader::Start(StandaloneOptions options) {
  if (options.batch_size == 0 || options.epochs == 0 || options.workers == 0) {
    return Status::InvalidArgument(fmt::format(
        "standalone loader: batch size {}, epochs {} and workers {} must all be at least 1",
        options.batch_size, options.epochs, options.workers));
  }
  if (BatchesPerEpoch(options) == 0) {
    return Status::InvalidArgument(fmt::format(
        "standalone loader: {} samples make no batch of {}{}; use a larger dataset",
        options.samples.size(), options.batch_size, options.drop_last ? " with drop_last" : ""));
  }
  options.prefetch = std::max(options.prefetch, options.workers);
  std::unique_ptr<StandaloneLoader> loader(new StandaloneLoader(std::move(options)));
  for (uint32_t i = 0; i < loader->options_.workers; ++i) {
    loader->workers_.emplace_back([l = loader.get()] { l->WorkerLoop(); });
  }
  return loader;
}

StandaloneLoader::StandaloneLoader(StandaloneOptions options)
    : options_(std::move(options)),
      batches_per_epoch_(BatchesPerEpoch(options_)),
      total_batches_(batches_per_epoch_ * options_.epochs) {}

StandaloneLoader::~StandaloneLoader() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

std::vector<uint32_t> StandaloneLoader::BatchMembers(uint64_t g) {
  const uint32_t epoch = static_cast<uint32_t>(g / batches_per_epoch_);
  auto it = orders_.find(epoch);
  if (it == orders_.end()) {
    // A fresh uniform permutation per epoch, as a shuffling DataLoader draws.
    std::vector<uint32_t> order(options_.samples.size());
    std::iota(order.begin(), order.end(), 0u);
    std::mt19937_64 rng(SampleSeed(options_.seed, epoch, 0xffffffffu));
    std::shuffle(order.begin(), order.end(), rng);
    it = orders_.emplace(epoch, std::move(order)).first;
    // Older epochs have all their batches started once a later one is being built.
    orders_.erase(orders_.begin(), it);
  }
  const uint64_t first = (g % batches_per_epoch_) * options_.batch_size;
  const uint64_t last = std::min<uint64_t>(first + options_.batch_size, it->second.size());
  return {it->second.begin() + static_cast<ptrdiff_t>(first),
          it->second.begin() + static_cast<ptrdiff_t>(last)};
}

void StandaloneLoader::WorkerLoop() {
  cv::setNumThreads(1);  // one decode per worker thread, as the server's workers do
  for (;;) {
    uint64_t g = 0;
    std::vector<uint32_t> members;
    {
      MutexLock lock(mu_);
      mu_.Wait(cv_, [&]() REQUIRES(mu_) {
        return stop_ || next_build_ >= total_batches_ ||
               next_build_ < next_deliver_ + options_.prefetch;
      });
      if (stop_ || next_build_ >= total_batches_) return;
      g = next_build_++;
      members = BatchMembers(g);
    }
    Result<StandaloneBatch> batch = Build(g, members);
    {
      MutexLock lock(mu_);
      ready_.emplace(g, std::move(batch));
    }
    cv_.notify_all();
  }
}

Result<StandaloneBatch> StandaloneLoader::Build(uint64_t g, const std::vector<uint32_t>& members) {
  StandaloneBatch batch;
  batch.epoch = static_cast<uint32_t>(g / batches_per_epoch_);
  batch.index = g % batches_per_epoch_;
  std::vector<PreparedImage> prepared;
  std::vector<PreparedView> views;
  std::vector<uint64_t> seeds;
  prepared.reserve(members.size());
  for (uint32_t m : members) {
    const SampleRecord& record = options_.samples[m];
    Result<std::vector<uint8_t>> bytes = reader_.Read(record);
    if (!bytes.ok()) return bytes.status();
    Result<PreparedImage> image = PrepareSample(options_.prepare, *bytes);
    if (!image.ok()) {
      return Status(image.status().code(), fmt::format("sample {} (\"{}\"): {}", record.id,
                                                       record.path, image.status().message()));
    }
    preparations_.fetch_add(1, std::memory_order_relaxed);
    prepared.push_back(std::move(*image));
    batch.sample_ids.push_back(record.id);
    batch.labels.push_back(record.label);
    seeds.push_back(SampleSeed(options_.seed, batch.epoch, record.id));
  }
  for (const PreparedImage& p : prepared) views.push_back(p.view());
  Result<ImageShape> shape = BatchImageShape(options_.transform, views);
  if (!shape.ok()) return shape.status();
  const size_t bytes = shape->bytes() * views.size();
  batch.storage.resize((bytes + sizeof(uint64_t) - 1) / sizeof(uint64_t));
  Result<ImageShape> written =
      AssembleBatch(options_.transform, views, seeds, batch.storage.data(), bytes);
  if (!written.ok()) return written.status();
  batch.image_shape = *written;
  return batch;
}

Result<std::optional<StandaloneBatch>> StandaloneLoader::Next() {
  MutexLock lock(mu_);
  if (next_deliver_ >= total_batches_) return std::optional<StandaloneBatch>();
  mu_.Wait(cv_, [&]() REQUIRES(mu_) { return ready_.count(next_deliver_) > 0; });
  auto node = ready_.extract(next_deliver_);
  if (!node.mapped().ok()) {
    next_deliver_ = total_batches_;  // finished: later calls end the iteration
    stop_ = true;
    lock.Unlock();
    cv_.notify_all();
    return node.mapped().status();
  }
  ++next_deliver_;
  lock.Unlock();
  cv_.notify_all();  // a worker may start the batch this one made room for
  return std::optional<StandaloneBatch>(std::move(node.mapped()).value());
}

}  // namespace carpool::tools
