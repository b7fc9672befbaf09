// The C++ client (include/carpool/client.h) over FrameSocket and SlotMapping.
#include "carpool/client.h"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>

#include "common/mutex.h"
#include "client/frame_socket.h"
#include "protocol/id_set.h"
#include "protocol/protocol.h"
#include "client/cuda_ipc.h"
#include "client/job_decode.h"
#include "client/slot_mapping.h"

namespace carpool {

namespace {
constexpr std::chrono::milliseconds kHandshakeTimeout{5000};
using Clock = std::chrono::steady_clock;
}  // namespace

// Shared by the Job, its reader thread and its outstanding Batches.
struct Job::State {
  std::unique_ptr<FrameSocket> socket;
  std::shared_ptr<SlotMapping> mapping;
  std::shared_ptr<DeviceSlotMapping> device_mapping;  // GPU jobs only
  std::unique_ptr<JobDecodeWorker> decoder;  // GPU jobs the server sends decode work
  protocol::JobInfo info;
  std::chrono::milliseconds heartbeat_every{500};
  std::chrono::milliseconds silence_timeout{10000};

  Mutex mu;
  std::condition_variable cv;
  std::deque<protocol::BatchReady> ready GUARDED_BY(mu);
  std::optional<std::string> stats_reply GUARDED_BY(mu);
  Status failure GUARDED_BY(mu);  // first error, terminal
  bool end_of_data GUARDED_BY(mu) = false;
  bool closed GUARDED_BY(mu) = false;  // the Job was destroyed
  bool reader_done GUARDED_BY(mu) = false;  // ReaderLoop returned: the connection is over
  Mutex stats_mu;                      // one Stats() round trip at a time
  std::thread reader;
  // What Next() has returned, and how to take the latest batch back out (Position()).
  JobPosition position GUARDED_BY(mu);
  struct Undo {
    bool valid = false;
    bool new_epoch = false;  // the latest batch started an epoch: `taken` holds the old one's
    uint32_t epoch = 0;
    uint64_t batches = 0, samples = 0;
    size_t taken_size = 0;
    std::vector<uint32_t> taken;
  } undo GUARDED_BY(mu);

  void Take(const protocol::BatchReady& b, const uint32_t* ids) REQUIRES(mu) {
    undo.valid = true;
    undo.new_epoch = b.epoch != position.epoch;
    undo.epoch = position.epoch;
    undo.batches = position.batches;
    undo.samples = position.samples;
    undo.taken_size = position.taken.size();
    undo.taken.clear();
    if (undo.new_epoch) {
      undo.taken = std::move(position.taken);
      position.taken.clear();
      position.epoch = b.epoch;
      position.batches = 0;
    }
    position.taken.insert(position.taken.end(), ids, ids + b.sample_count);
    ++position.batches;
    position.samples += b.sample_count;
  }

  void Fail(Status s) {
    MutexLock lock(mu);
    if (failure.ok() && !closed) failure = std::move(s);
    cv.notify_all();
  }

  // Reads frames and sends heartbeats until the connection fails or the Job closes it.
  void ReaderLoop() {
    Clock::time_point last_heard = Clock::now();
    Clock::time_point next_heartbeat = Clock::now();
    for (;;) {
      Clock::time_point now = Clock::now();
      if (now >= next_heartbeat) {
        Status s = socket->Send(protocol::Heartbeat{});
        if (!s.ok()) return Fail(std::move(s));
        next_heartbeat = now + heartbeat_every;
      }
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_heartbeat - now);
      auto frame = socket->Receive(std::max(wait, std::chrono::milliseconds(1)));
      if (!frame.ok()) return Fail(frame.status());
      if (!frame->has_value()) {
        if (Clock::now() - last_heard > silence_timeout) {
          return Fail(Status::Unavailable(fmt::format(
              "carpool server at {} sent nothing for {} ms (not even heartbeats); it is hung or "
              "gone — restart it and reconnect",
              socket->path(), silence_timeout.count())));
        }
        continue;
      }
      last_heard = Clock::now();
      protocol::Message& m = (*frame)->message;
      if (std::holds_alternative<protocol::DecodeSegment>(m) ||
          std::holds_alternative<protocol::DecodeWork>(m)) {
        if (decoder == nullptr) {
          return Fail(Status::Corruption(fmt::format(
              "server sent decode work to job {}, which did not offer to decode", info.job_id)));
        }
        decoder->Post(std::move(m), std::move((*frame)->fd));
        continue;
      }
      MutexLock lock(mu);
      if (auto* b = std::get_if<protocol::BatchReady>(&m); b && b->job_id == info.job_id) {
        ready.push_back(*b);
      } else if (auto* e = std::get_if<protocol::EndOfData>(&m); e && e->job_id == info.job_id) {
        end_of_data = true;
      } else if (auto* st = std::get_if<protocol::StatsReply>(&m)) {
        stats_reply = std::move(st->json);
      } else if (auto* err = std::get_if<protocol::Error>(&m)) {
        lock.Unlock();
        return Fail(StatusFromError(*err));
      } else if (!std::holds_alternative<protocol::Heartbeat>(m)) {
        lock.Unlock();
        return Fail(Status::Corruption(
            fmt::format("server sent an unexpected {} frame to job {}",
                        protocol::MessageTypeName(protocol::TypeOf(m)), info.job_id)));
      }
      cv.notify_all();
    }
  }

  void ReleaseSlot(uint32_t slot, uint64_t generation) {
    {
      MutexLock lock(mu);
      if (closed || !failure.ok()) return;  // the server frees the job's slots by itself
    }
    Status s = socket->Send(protocol::Release{info.job_id, slot, generation});
    if (!s.ok()) Fail(std::move(s));
  }
};

struct Batch::Impl {
  std::shared_ptr<Job::State> state;
  std::shared_ptr<SlotMapping> mapping;
  std::shared_ptr<DeviceSlotMapping> device_mapping;  // keeps device views mapped
  protocol::BatchReady ready;
  BatchRegion region;
  TensorView images;
  bool released = false;
};

Batch::Batch(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Batch::Batch(Batch&&) noexcept = default;
Batch& Batch::operator=(Batch&& other) noexcept {
  if (this != &other) {
    Release();
    impl_ = std::move(other.impl_);
  }
  return *this;
}
Batch::~Batch() { Release(); }

void Batch::Release() {
  if (!impl_ || impl_->released) return;
  impl_->released = true;
  impl_->state->ReleaseSlot(impl_->ready.slot, impl_->ready.generation);
}

const TensorView& Batch::images() const { return impl_->images; }
std::span<const int32_t> Batch::labels() const {
  return {impl_->region.labels, impl_->ready.sample_count};
}
std::span<const uint32_t> Batch::sample_ids() const {
  return {impl_->region.ids, impl_->ready.sample_count};
}
uint32_t Batch::epoch() const { return impl_->ready.epoch; }
uint64_t Batch::index() const { return impl_->ready.batch_index; }
uint32_t Batch::size() const { return impl_->ready.sample_count; }
uint32_t Batch::skipped() const { return impl_->ready.skipped; }
int64_t* Batch::device_labels() const { return impl_->region.device_labels; }

namespace {
constexpr char kPositionMagic[4] = {'C', 'P', 'J', 'P'};
constexpr uint16_t kPositionVersion = 1;
constexpr uint64_t kMaxPositionIds = uint64_t{1} << 32;  // any uint32 set (16 GiB: bytes bound it)

template <typename T>
void PutLe(std::string* out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

template <typename T>
bool GetLe(std::string_view bytes, size_t* pos, T* v) {
  if (bytes.size() - *pos < sizeof(T)) return false;
  *v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    *v |= static_cast<T>(static_cast<T>(static_cast<uint8_t>(bytes[*pos + i])) << (8 * i));
  }
  *pos += sizeof(T);
  return true;
}
}  // namespace

std::string JobPosition::Serialize() const {
  std::vector<uint32_t> ids = taken;
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  const std::string set = protocol::EncodeIdSet(ids);
  std::string out(kPositionMagic, sizeof(kPositionMagic));
  PutLe<uint16_t>(&out, kPositionVersion);
  PutLe<uint32_t>(&out, static_cast<uint32_t>(dataset.size()));
  out += dataset;
  PutLe<uint32_t>(&out, epochs);
  PutLe<uint32_t>(&out, epoch);
  PutLe<uint64_t>(&out, batches);
  PutLe<uint64_t>(&out, samples);
  PutLe<uint32_t>(&out, static_cast<uint32_t>(set.size()));
  out += set;
  return out;
}

Result<JobPosition> JobPosition::Parse(std::string_view bytes) {
  auto bad = [&](std::string_view what) {
    return Status::Corruption(fmt::format(
        "{} bytes are not a carpool job position (Job::Position().Serialize()): {}", bytes.size(),
        what));
  };
  if (bytes.size() < sizeof(kPositionMagic) ||
      std::memcmp(bytes.data(), kPositionMagic, sizeof(kPositionMagic)) != 0) {
    return bad("they do not start with \"CPJP\"");
  }
  size_t pos = sizeof(kPositionMagic);
  uint16_t version = 0;
  uint32_t name_bytes = 0, set_bytes = 0;
  JobPosition p;
  if (!GetLe(bytes, &pos, &version)) return bad("truncated version");
  if (version != kPositionVersion) {
    return bad(fmt::format("version {}, this library reads version {}", version,
                           kPositionVersion));
  }
  if (!GetLe(bytes, &pos, &name_bytes) || bytes.size() - pos < name_bytes) {
    return bad("truncated dataset name");
  }
  p.dataset.assign(bytes.substr(pos, name_bytes));
  pos += name_bytes;
  if (!GetLe(bytes, &pos, &p.epochs) || !GetLe(bytes, &pos, &p.epoch) ||
      !GetLe(bytes, &pos, &p.batches) || !GetLe(bytes, &pos, &p.samples) ||
      !GetLe(bytes, &pos, &set_bytes) || bytes.size() - pos != set_bytes) {
    return bad("truncated or trailing bytes after the dataset name");
  }
  if (p.epoch > p.epochs) return bad(fmt::format("epoch {} of {}", p.epoch, p.epochs));
  Result<std::vector<uint32_t>> ids = protocol::DecodeIdSet(bytes.substr(pos), kMaxPositionIds);
  if (!ids.ok()) return bad(ids.status().message());
  p.taken = std::move(*ids);
  return p;
}

Job::Job(std::shared_ptr<State> state) : state_(std::move(state)) {}

Job::~Job() {
  bool say_bye;
  {
    MutexLock lock(state_->mu);
    say_bye = state_->failure.ok();
  }
  if (say_bye) (void)state_->socket->Send(protocol::Bye{});  // best effort: the lease backs it up
  if (say_bye && state_->decoder != nullptr) {
    // The server unmaps this process's decode buffer, then closes the connection: the buffer is
    // freed (with the decoder, below) only after that, or after a bound if the server is gone.
    MutexLock lock(state_->mu);
    (void)state_->mu.WaitFor(state_->cv, std::chrono::seconds(10),
                             [this]() REQUIRES(state_->mu) { return state_->reader_done; });
  }
  {
    MutexLock lock(state_->mu);
    state_->closed = true;
  }
  state_->socket->Shutdown();
  state_->reader.join();
  state_->decoder.reset();  // its thread's last answer, if any, fails on the closed socket
}

Result<std::optional<Batch>> Job::Next() {
  protocol::BatchReady ready;
  {
    MutexLock lock(state_->mu);
    state_->mu.Wait(state_->cv, [this]() REQUIRES(state_->mu) {
      return !state_->ready.empty() || !state_->failure.ok() || state_->end_of_data;
    });
    // All epochs delivered wins over a later failure (e.g. the server stopping afterwards).
    if (state_->end_of_data && state_->ready.empty()) {
      JobPosition& p = state_->position;
      p.epoch = p.epochs;
      p.batches = 0;
      p.taken.clear();
      state_->undo.valid = false;
      return std::optional<Batch>();
    }
    if (!state_->failure.ok()) return state_->failure;
    ready = state_->ready.front();
    state_->ready.pop_front();
  }
  const DeviceSlotMapping* dev = state_->device_mapping.get();
  auto region = dev ? state_->mapping->View(ready, dev->base(), dev->slot_stride(),
                                            dev->slot_bytes())
                    : state_->mapping->View(ready);
  if (!region.ok()) {
    state_->Fail(region.status());
    return region.status();
  }
  {
    MutexLock lock(state_->mu);
    state_->Take(ready, region->ids);
  }
  auto impl = std::make_unique<Batch::Impl>();
  impl->state = state_;
  impl->mapping = state_->mapping;
  impl->device_mapping = state_->device_mapping;
  impl->ready = ready;
  impl->region = *region;
  TensorView& t = impl->images;
  t.data = region->images;
  t.shape.push_back(ready.sample_count);
  for (uint32_t d : state_->info.sample_shape) t.shape.push_back(d);
  t.dtype = state_->info.dtype;
  t.layout = state_->info.layout;
  t.bytes = ready.images_bytes;
  t.device = dev ? dev->device() : -1;
  return std::optional<Batch>(Batch(std::move(impl)));
}

Result<std::string> Job::Stats() {
  MutexLock stats_lock(state_->stats_mu);
  {
    MutexLock lock(state_->mu);
    if (!state_->failure.ok()) return state_->failure;
    state_->stats_reply.reset();
  }
  Status s = state_->socket->Send(protocol::StatsRequest{state_->info.job_id});
  if (!s.ok()) {
    state_->Fail(s);
    return s;
  }
  MutexLock lock(state_->mu);
  // The reader thread fails the job after silence_timeout, so this wait is bounded.
  state_->mu.Wait(state_->cv, [this]() REQUIRES(state_->mu) {
    return state_->stats_reply.has_value() || !state_->failure.ok();
  });
  if (!state_->failure.ok()) return state_->failure;
  return std::move(*state_->stats_reply);
}

JobPosition Job::Position(bool exclude_latest) const {
  JobPosition p;
  {
    MutexLock lock(state_->mu);
    p = state_->position;
    // Read through state_ (not a reference to undo): the analysis tracks no alias of a field.
    if (exclude_latest && state_->undo.valid) {
      if (state_->undo.new_epoch) {
        p.taken = state_->undo.taken;
      } else {
        p.taken.resize(state_->undo.taken_size);
      }
      p.epoch = state_->undo.epoch;
      p.batches = state_->undo.batches;
      p.samples = state_->undo.samples;
    }
  }
  std::sort(p.taken.begin(), p.taken.end());
  return p;
}

uint64_t Job::id() const { return state_->info.job_id; }
uint64_t Job::dataset_size() const { return state_->info.dataset_size; }
uint64_t Job::batches_per_epoch() const { return state_->info.batches_per_epoch; }
uint32_t Job::epochs() const { return state_->info.epochs; }
uint32_t Job::start_epoch() const { return state_->info.start_epoch; }
uint64_t Job::start_batch() const { return state_->info.start_batch; }
std::vector<int64_t> Job::sample_shape() const {
  return {state_->info.sample_shape.begin(), state_->info.sample_shape.end()};
}
DType Job::dtype() const { return state_->info.dtype; }
int Job::device() const { return state_->info.device; }
Layout Job::layout() const { return state_->info.layout; }

Result<std::unique_ptr<Client>> Client::Connect(const std::string& socket_path) {
  auto hs = ConnectAndHello(socket_path, kHandshakeTimeout);
  if (!hs.ok()) return hs.status();
  (void)hs->socket->Send(protocol::Bye{});
  return std::unique_ptr<Client>(new Client(socket_path, hs->hello.server_instance,
                                            std::chrono::milliseconds(hs->hello.lease_ms)));
}

Result<std::string> Client::Stats() {
  auto hs = ConnectAndHello(path_, kHandshakeTimeout);
  if (!hs.ok()) return hs.status();
  auto reply = hs->socket->Call(protocol::StatsRequest{0}, kHandshakeTimeout);
  if (!reply.ok()) return reply.status();
  auto* stats = std::get_if<protocol::StatsReply>(&reply->message);
  if (stats == nullptr) return Status::Corruption("server answered a stats request with no stats");
  (void)hs->socket->Send(protocol::Bye{});
  return std::move(stats->json);
}

Result<std::unique_ptr<Job>> Client::CreateJob(const JobOptions& o) {
  if (o.dataset.empty() || o.batch_size == 0 || o.epochs == 0 || o.prefetch == 0) {
    return Status::InvalidArgument(fmt::format(
        "job options need a dataset name and positive batch_size, epochs and prefetch (got "
        "dataset \"{}\", batch_size {}, epochs {}, prefetch {})",
        o.dataset, o.batch_size, o.epochs, o.prefetch));
  }
  if (o.silence_timeout.count() <= 0) {
    return Status::InvalidArgument(fmt::format(
        "silence_timeout of {} ms must be positive", o.silence_timeout.count()));
  }
  auto hs = ConnectAndHello(path_, std::min(o.silence_timeout, kHandshakeTimeout));
  if (!hs.ok()) return hs.status();
  if (o.world_size == 0 || o.rank >= o.world_size || o.nodes == 0 || o.node >= o.nodes ||
      ((o.world_size > 1 || o.nodes > 1) && o.job_key.empty())) {
    return Status::InvalidArgument(fmt::format(
        "rank {} of world_size {}, node {} of {}, job_key \"{}\": need rank < world_size, node < "
        "nodes and, for several ranks or nodes, a job_key shared by the job's ranks",
        o.rank, o.world_size, o.node, o.nodes, o.job_key));
  }
  protocol::CreateJob request{o.dataset, o.batch_size, o.epochs,     o.transform,
                              o.device,  o.prefetch,   o.drop_last, o.seed,
                              o.job_key, o.rank,       o.world_size, o.node, o.nodes};
  request.decode_in_job = o.device != "cpu" && JobDecodeOffered();
  std::vector<uint32_t> resumed_taken;
  if (o.resume) {
    if (o.resume->dataset != o.dataset) {
      return Status::InvalidArgument(fmt::format(
          "the checkpoint's position is in dataset \"{}\", but this job reads \"{}\"; resume "
          "with the dataset it was taken on, or start without it",
          o.resume->dataset, o.dataset));
    }
    resumed_taken = o.resume->taken;
    std::sort(resumed_taken.begin(), resumed_taken.end());
    resumed_taken.erase(std::unique(resumed_taken.begin(), resumed_taken.end()),
                        resumed_taken.end());
    request.resume_epoch = o.resume->epoch;
    request.resume_batches = o.resume->batches;
    if (!resumed_taken.empty()) request.resume_taken = protocol::EncodeIdSet(resumed_taken);
    if (request.resume_taken.size() > protocol::kMaxPayloadBytes / 2) {
      return Status::InvalidArgument(fmt::format(
          "the checkpoint's position ({} samples taken in epoch {}) needs {} bytes, more than a "
          "create-job frame holds; checkpoint at an epoch's end for a dataset this large",
          resumed_taken.size(), o.resume->epoch, request.resume_taken.size()));
    }
  }
  auto reply = hs->socket->Call(request, o.silence_timeout);
  if (!reply.ok()) return reply.status();
  auto* info = std::get_if<protocol::JobInfo>(&reply->message);
  if (info == nullptr) {
    return Status::Corruption(
        fmt::format("server answered create-job with {}",
                    protocol::MessageTypeName(protocol::TypeOf(reply->message))));
  }
  auto mapping = SlotMapping::Open(*info, std::move(reply->fd));
  if (!mapping.ok()) return mapping.status();
  std::shared_ptr<DeviceSlotMapping> device_mapping;
  if (info->device >= 0) {
    auto opened = DeviceSlotMapping::Open(*info);
    if (!opened.ok()) return opened.status();  // the server drops the job with the connection
    device_mapping = std::move(*opened);
  }

  auto state = std::make_shared<Job::State>();
  state->socket = std::move(hs->socket);
  state->mapping = std::move(*mapping);
  state->device_mapping = std::move(device_mapping);
  state->info = *info;
  if (info->decode_in_job) {
    if (state->device_mapping == nullptr) {
      return Status::Corruption("server asked a CPU job to decode on a GPU");
    }
    state->decoder = std::make_unique<JobDecodeWorker>(info->device, info->job_id,
                                                       state->socket.get());
  }
  state->heartbeat_every = std::max(std::chrono::milliseconds(10),
                                     std::chrono::milliseconds(hs->hello.lease_ms / 4));
  state->silence_timeout = o.silence_timeout;
  {
    MutexLock lock(state->mu);
    JobPosition& p = state->position;
    p.dataset = o.dataset;
    p.epochs = info->epochs;
    p.epoch = info->start_epoch;
    p.batches = info->start_batch;
    if (o.resume) {
      p.samples = o.resume->samples;
      // The server moves on to the next epoch when the checkpoint took all of one.
      if (o.resume->epoch == info->start_epoch) p.taken = std::move(resumed_taken);
    }
  }
  state->reader = std::thread([s = state.get()] {
    s->ReaderLoop();
    {
      MutexLock lock(s->mu);
      s->reader_done = true;
    }
    s->cv.notify_all();
  });
  return std::unique_ptr<Job>(new Job(std::move(state)));
}

}  // namespace carpool
