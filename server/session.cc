#include "server/session.h"

#include <errno.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cstring>

#include "common/log.h"
#include "protocol/segment_fd.h"
#include "server/batch_pool.h"
#include "server/control_plane.h"

namespace carpool {
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

Session::Session(asio::local::stream_protocol::socket socket, ControlPlane& plane)
    : socket_(std::move(socket)), lease_timer_(socket_.get_executor()), plane_(plane) {}

void Session::Start() {
  last_heard_ = Clock::now();
  ArmLeaseTimer();
  ReadHeader();
}

void Session::ArmLeaseTimer() {
  auto lease = plane_.options().lease;
  lease_timer_.expires_after(std::max(lease / 4, std::chrono::milliseconds(5)));
  lease_timer_.async_wait([self = shared_from_this(), lease](const boost::system::error_code& ec) {
    if (ec || self->closed_) return;
    if (self->creating_) self->last_heard_ = Clock::now();  // the client awaits our reply
    // Bytes waiting unread: the client spoke and this thread was late to read it (a loaded
    // machine), so the client is not silent.
    boost::system::error_code unread_ec;
    if (self->socket_.available(unread_ec) > 0 && !unread_ec) self->last_heard_ = Clock::now();
    auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() -
                                                                        self->last_heard_);
    if (silent > lease) {
      // Look again after the handlers already queued: a frame the reactor has read may be
      // waiting behind this timer in a late io thread.
      asio::post(self->socket_.get_executor(), [self, lease] {
        if (self->closed_) return;
        auto again = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() -
                                                                           self->last_heard_);
        if (again <= lease || self->creating_) return self->ArmLeaseTimer();
        self->Close(fmt::format("lease expired: no frame for {} ms (lease {} ms)", again.count(),
                                lease.count()));
      });
      return;
    }
    self->ArmLeaseTimer();
  });
}

void Session::ReadHeader() {
  asio::async_read(socket_, asio::buffer(header_),
                   [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                     if (self->closed_) return;
                     if (ec) {
                       self->Close(ec == asio::error::eof ? "client disconnected"
                                                          : "read failed: " + ec.message());
                       return;
                     }
                     self->last_heard_ = Clock::now();
                     auto header = protocol::DecodePeerFrameHeader(self->header_);
                     if (!header.ok()) return self->Reject(header.status());
                     self->ReadPayload(*header);
                   });
}

void Session::ReadPayload(const protocol::FrameHeader& header) {
  payload_.resize(header.payload_bytes);  // <= kMaxPayloadBytes, checked by the header's decoder
  asio::async_read(
      socket_, asio::buffer(payload_),
      [self = shared_from_this(), header](const boost::system::error_code& ec, size_t) {
        if (self->closed_) return;
        if (ec) {
          self->Close("connection lost inside a frame: " + ec.message());
          return;
        }
        if (header.version != protocol::kProtocolVersion) return self->RefuseForeign(header);
        auto message = protocol::DecodePayload(header.type, self->payload_);
        if (!message.ok()) return self->Reject(message.status());
        self->Dispatch(std::move(*message));
        // Time spent in the server's own handler (e.g. loading a large dataset) is not client
        // silence: restart the lease clock once the reply is queued.
        self->last_heard_ = Clock::now();
        if (!self->closed_ && !self->closing_) self->ReadHeader();
      });
}

void Session::Dispatch(protocol::Message message) {
  using namespace protocol;
  if (!said_hello_ && !std::holds_alternative<Hello>(message)) {
    return Reject(Status::InvalidArgument(fmt::format(
        "the first frame must be hello, got {}", MessageTypeName(TypeOf(message)))));
  }
  if (auto* hello = std::get_if<Hello>(&message)) {
    if (said_hello_) return Reject(Status::InvalidArgument("a second hello on one connection"));
    said_hello_ = true;
    log::Debug("session: hello from pid {} ({}, carpool {})", hello->pid, hello->client_name,
               hello->version);
    const ControlPlaneOptions& o = plane_.options();
    return Reply(HelloReply{o.instance, static_cast<uint32_t>(o.lease.count()), kMaxPayloadBytes,
                            o.max_batch_size, o.max_prefetch, std::string(PackageVersion())});
  }
  if (auto* create = std::get_if<CreateJob>(&message)) return OnCreateJob(*create);
  if (auto* release = std::get_if<Release>(&message)) return OnRelease(*release);
  if (std::holds_alternative<Heartbeat>(message)) return Reply(Heartbeat{});
  if (auto* stats = std::get_if<StatsRequest>(&message)) {
    if (stats->job_id != 0 && stats->job_id != job_id_.value_or(0)) {
      return Reply(Error{StatusCode::kNotFound,
                         fmt::format("job {} does not belong to this connection; ask for job 0 "
                                     "(server-wide) or this connection's job",
                                     stats->job_id)});
    }
    // Off the io thread, in the control lane: never queued behind a join.
    plane_.RunControl([self = shared_from_this(), id = stats->job_id] {
      std::string json = self->plane_.service().Stats(id);
      asio::post(self->socket_.get_executor(), [self, json = std::move(json)] {
        if (!self->closed_) self->Reply(StatsReply{json});
      });
    });
    return;
  }
  if (auto* done = std::get_if<DecodeDone>(&message)) return OnDecodeDone(std::move(*done));
  if (std::holds_alternative<Bye>(message)) return Leave();
  Reject(Status::InvalidArgument(
      fmt::format("a client may not send {} frames", MessageTypeName(TypeOf(message)))));
}

void Session::OnCreateJob(const protocol::CreateJob& r) {
  const ControlPlaneOptions& o = plane_.options();
  auto fail = [this](StatusCode code, std::string message) {
    Reply(protocol::Error{code, std::move(message)});
  };
  if (job_id_ || creating_) {
    return fail(StatusCode::kFailedPrecondition,
                job_id_ ? fmt::format("this connection already runs job {}; open one connection "
                                      "per job",
                                      *job_id_)
                        : std::string("this connection is creating a job already; open one "
                                      "connection per job"));
  }
  if (r.dataset.empty()) return fail(StatusCode::kInvalidArgument, "the dataset name is empty");
  if (r.batch_size == 0 || r.batch_size > o.max_batch_size) {
    return fail(StatusCode::kInvalidArgument,
                fmt::format("batch size {} is out of range; use 1..{}", r.batch_size,
                            o.max_batch_size));
  }
  if (r.prefetch == 0 || r.prefetch > o.max_prefetch) {
    return fail(StatusCode::kInvalidArgument,
                fmt::format("prefetch {} is out of range; use 1..{}", r.prefetch, o.max_prefetch));
  }
  if (r.epochs == 0) return fail(StatusCode::kInvalidArgument, "epochs is 0; use 1 or more");
  if (!plane_.TryAddJob()) {
    return fail(StatusCode::kResourceExhausted,
                fmt::format("the server already runs its limit of {} jobs; retry when one ends",
                            o.max_jobs));
  }
  // Loading a large dataset takes seconds: off the io thread, so other jobs' batches, releases
  // and heartbeats keep flowing meanwhile.
  creating_ = true;
  plane_.RunJoin([self = shared_from_this(), r] {
    Result<protocol::JobInfo> info = self->plane_.service().CreateJob(r, self);
    asio::post(self->socket_.get_executor(), [self, r, info = std::move(info)]() mutable {
      self->FinishCreateJob(r, std::move(info));
    });
  });
}

void Session::FinishCreateJob(const protocol::CreateJob& r, Result<protocol::JobInfo> info) {
  creating_ = false;
  if (!info.ok()) {
    plane_.RemovedJob();
    held_.clear();
    if (!closed_) Reply(protocol::Error{info.status().code(), info.status().message()});
    return;
  }
  if (closed_) {  // the client left while its job was being created
    log::Info("job {} removed: its client left while it was created", info->job_id);
    plane_.RunControl([&service = plane_.service(), id = info->job_id] { service.RemoveJob(id); });
    plane_.RemovedJob();
    held_.clear();
    return;
  }
  job_id_ = info->job_id;
  job_decodes_ = info->decode_in_job;
  credits_ = r.prefetch;
  // The segment goes to this connection only, as the fd attached to its job-info (so do the
  // GPU job's CUDA IPC handle and device slots, inside that frame).
  Result<UniqueFd> segment = BatchPool::ShareSegment(info->segment_name);
  if (!segment.ok()) {
    log::Error("job {}: {}", info->job_id, segment.status().ToString());
    Reply(protocol::Error{StatusCode::kInternal, segment.status().message()});
    closing_ = true;  // closes once the error is out, and removes the job
    if (!writing_) Close("its batch segment could not be sent");
    return;
  }
  log::Info("job {} created: dataset {} batch {} epochs {} prefetch {}", info->job_id, r.dataset,
            r.batch_size, r.epochs, r.prefetch);
  Reply(*info, std::move(*segment));
  std::vector<std::function<void()>> held = std::move(held_);
  held_.clear();
  for (auto& fn : held) fn();
}

void Session::OnIo(std::function<void()> fn) {
  asio::post(socket_.get_executor(), [self = shared_from_this(), fn = std::move(fn)]() mutable {
    if (self->creating_) {
      self->held_.push_back(std::move(fn));
    } else {
      fn();
    }
  });
}

void Session::OnRelease(const protocol::Release& r) {
  if (!job_id_ || r.job_id != *job_id_) {
    return Reject(Status::InvalidArgument(
        fmt::format("release for job {}, but this connection's job is {}", r.job_id,
                    job_id_ ? std::to_string(*job_id_) : "none")));
  }
  if (unreleased_.erase({r.slot, r.generation}) == 0) {
    return Reject(Status::InvalidArgument(
        fmt::format("release of slot {} generation {}, which job {} does not hold", r.slot,
                    r.generation, *job_id_)));
  }
  Status s = plane_.service().Release(*job_id_, r.slot, r.generation);
  if (!s.ok()) {
    log::Error("job {}: release of slot {} failed: {}", *job_id_, r.slot, s.ToString());
    Reply(protocol::Error{s.code(), s.message()});
  }
}

void Session::Reject(const Status& status) {
  log::Warn("closing a session after a protocol violation: {}", status.message());
  Reply(protocol::Error{status.code(), status.message()});
  closing_ = true;
  if (!writing_) Close("protocol violation");
}

void Session::RefuseForeign(const protocol::FrameHeader& header) {
  using namespace protocol;
  std::string client = DescribePeer("", header.version);
  uint32_t pid = 0;
  if (header.type == MessageType::kHello) {
    auto hello = DecodeForeignHello(payload_);
    if (hello.ok()) {
      client = DescribePeer(hello->version, header.version);
      pid = hello->pid;
    }
  }
  std::string message = VersionMismatchMessage(client, DescribePeer(PackageVersion(),
                                                                    kProtocolVersion));
  log::Warn("refusing a client (pid {}) of another version: {}", pid, message);
  // In the client's protocol version, so that the client decodes it and shows the message.
  auto frame = EncodeErrorFor(header.version, Error{StatusCode::kFailedPrecondition, message});
  if (frame.ok()) QueueFrame(std::move(*frame), {});
  closing_ = true;
  if (!writing_) Close("client of another protocol version");
}

void Session::Reply(const protocol::Message& message, UniqueFd fd) {
  auto frame = protocol::EncodeFrame(message);
  if (!frame.ok()) {
    log::Error("cannot encode a {} reply: {}",
               protocol::MessageTypeName(protocol::TypeOf(message)), frame.status().message());
    frame = protocol::EncodeFrame(protocol::Error{StatusCode::kInternal,
                                                  "reply could not be encoded; see server log"});
    fd.Reset();  // an error frame carries none
  }
  QueueFrame(std::move(*frame), std::move(fd));
}

void Session::QueueFrame(std::vector<uint8_t> frame, UniqueFd fd) {
  if (closed_ || closing_) return;  // after a violation only the error frame goes out
  // A client that keeps asking but never reads must not grow the server's memory without bound.
  outbox_bytes_ += frame.size();
  if (outbox_bytes_ > kMaxOutboxBytes) {
    Close(fmt::format("client is not reading: {} bytes of replies queued (limit {})",
                      outbox_bytes_, kMaxOutboxBytes));
    return;
  }
  outbox_.push_back(Outgoing{std::move(frame), std::move(fd)});
  if (!writing_) WriteNext();
}

void Session::WriteNext() {
  if (outbox_.empty()) {
    writing_ = false;
    if (closing_) Close("protocol violation");
    return;
  }
  writing_ = true;
  if (outbox_.front().fd.valid()) return WriteWithFd();
  asio::async_write(socket_, asio::buffer(outbox_.front().frame),
                    [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                      self->Written(ec);
                    });
}

void Session::WriteWithFd() {
  Outgoing& out = outbox_.front();
  const int fd = out.fd.get();
  const ssize_t n = protocol::SendWithFds(socket_.native_handle(), out.frame.data(),
                                          out.frame.size(), {&fd, 1});
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    socket_.async_wait(asio::socket_base::wait_write,
                       [self = shared_from_this()](const boost::system::error_code& ec) {
                         if (self->closed_) return;
                         if (ec) return self->Close("write failed: " + ec.message());
                         self->WriteWithFd();
                       });
    return;
  }
  if (n <= 0) return Close(fmt::format("write failed: {}", std::strerror(errno)));
  out.fd.Reset();  // it went with the first byte; our copy is no longer needed
  asio::async_write(socket_,
                    asio::buffer(out.frame.data() + n, out.frame.size() - static_cast<size_t>(n)),
                    [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                      self->Written(ec);
                    });
}

void Session::Written(const boost::system::error_code& ec) {
  if (closed_) return;
  if (ec) return Close("write failed: " + ec.message());
  outbox_bytes_ -= outbox_.front().frame.size();
  outbox_.pop_front();
  WriteNext();
}

void Session::Close(const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  lease_timer_.cancel();
  socket_.shutdown(asio::socket_base::shutdown_both, ignored);
  socket_.close(ignored);
  outbox_.clear();
  outbox_bytes_ = 0;
  if (job_id_) {
    log::Info("job {} removed: {}", *job_id_, reason);
    // Off the io thread: RemoveJob takes the engine's lock and waits for a batch in flight.
    // Leaving (a bye), it is already removed or being removed: once per job.
    if (!leaving_) {
      plane_.RunControl([&service = plane_.service(), id = *job_id_] { service.RemoveJob(id); });
    }
    plane_.RemovedJob();
    job_id_.reset();
  } else {
    log::Debug("session closed: {}", reason);
  }
  unreleased_.clear();
  {
    MutexLock lock(decode_mu_);
    decode_closed_ = true;  // a build waiting for this job's decode goes on without it
  }
  decode_cv_.notify_all();
  plane_.SessionClosed(shared_from_this());
}

void Session::Leave() {
  if (!job_decodes_ || !job_id_) return Close("bye");
  if (leaving_) return;
  // The job's process frees its decode buffer once this connection closes, and the server may
  // still have that buffer mapped (CUDA IPC): remove the job first, which unmaps it after its
  // last build, then close. The client waits for the close before it frees the buffer.
  leaving_ = true;
  plane_.RunControl([self = shared_from_this(), id = *job_id_] {
    self->plane_.service().RemoveJob(id);
    asio::post(self->socket_.get_executor(), [self] { self->Close("bye"); });
  });
}

void Session::OnDecodeDone(protocol::DecodeDone done) {
  if (!job_id_ || done.job_id != *job_id_) {
    return Reject(Status::InvalidArgument(
        fmt::format("decode-done for job {}, but this connection's job is {}", done.job_id,
                    job_id_ ? std::to_string(*job_id_) : "none")));
  }
  {
    MutexLock lock(decode_mu_);
    auto it = decode_outstanding_.find(done.work_id);
    // Late (its build went on without it) or answered twice: ignored.
    if (it == decode_outstanding_.end() || it->second.has_value()) return;
    it->second = std::move(done);
  }
  decode_cv_.notify_all();
}

Result<UniqueFd> Session::EnsureDecodeSegment(uint64_t bytes) {
  if (decode_segment_ != nullptr && decode_segment_->size() >= bytes) return UniqueFd();
  // Twice what this work needs, at least 64 MiB: room for batches of larger JPEGs to come.
  const uint64_t size =
      std::max<uint64_t>(uint64_t{64} << 20, (2 * bytes + 0xFFFFF) & ~uint64_t{0xFFFFF});
  // Sealed: the job maps it read-write, and must not shrink it under the server's copies.
  Result<UniqueFd> fd =
      CreateSealedSegment("carpool-decode", size, "a job's decode segment",
                          "free memory, or start the server with --job-decode off");
  if (!fd.ok()) return fd.status();
  Result<std::unique_ptr<protocol::SharedMapping>> mapped =
      protocol::SharedMapping::Map(fd->get(), size, "the decode segment");
  if (!mapped.ok()) return mapped.status();
  decode_segment_ = std::move(*mapped);
  return std::move(*fd);
}

Status Session::DisabledBy(Status why) {
  Disable(why);
  return why;
}

void Session::Disable(const Status& why) {
  if (decode_enabled_.exchange(false)) {
    { MutexLock lock(decode_mu_); }  // a waiter between its check and its sleep sees the flag
    decode_cv_.notify_all();         // the other outstanding work's build goes on at once
    log::Warn(
        "GPU decode in a job's process is off for that job from now on (the server "
        "decodes its JPEGs): {}",
        why.ToString());
  }
}

Result<JobDecodeTicket> Session::Send(std::string_view prepare_spec,
                                      std::span<const JobDecodeItem> items, uint64_t lane_bytes) {
  if (!decode_enabled_.load()) return Status::FailedPrecondition("the job decodes no more");
  JobDecodeTicket ticket;
  bool closed = false;
  {
    MutexLock lock(decode_mu_);
    if (decode_outstanding_.size() >= kLanes && !decode_closed_) {
      return Status::FailedPrecondition(
          fmt::format("the job has {} decode works outstanding, as many as it has lanes", kLanes));
    }
    closed = decode_closed_;
    ticket.work_id = decode_work_id_ + 1;
  }
  // Disable takes decode_mu_: never called under it.
  if (closed) return DisabledBy(Status::Unavailable("the job's connection closed"));
  // Consecutive works alternate lanes, and at most kLanes are outstanding: the lane is free.
  ticket.lane = static_cast<uint32_t>((ticket.work_id - 1) % kLanes);
  ticket.lane_bytes = lane_bytes;
  ticket.items = items.size();
  uint64_t total = 0;
  for (const JobDecodeItem& it : items) total += it.encoded.size();
  // A new segment replaces the server's view only: the job keeps its mapping of the old one
  // until it reaches the new segment's frame, after the works sent before.
  Result<UniqueFd> fresh = EnsureDecodeSegment(kLanes * total);
  if (!fresh.ok()) return DisabledBy(fresh.status());
  const uint64_t segment_bytes = decode_segment_->size();
  const uint64_t lane_start = ticket.lane * (segment_bytes / kLanes);
  protocol::DecodeWork work;
  work.prepare = std::string(prepare_spec);
  work.output_bytes = kLanes * lane_bytes;
  work.items.reserve(items.size());
  const auto copy_start = std::chrono::steady_clock::now();
  uint64_t at = lane_start;
  for (const JobDecodeItem& it : items) {
    std::memcpy(decode_segment_->data() + at, it.encoded.data(), it.encoded.size());
    work.items.push_back({at, it.encoded.size(), it.height, it.width, it.channels,
                          ticket.lane * lane_bytes + it.dst_offset});
    at += it.encoded.size();
  }
  ticket.copy_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - copy_start).count();
  {
    MutexLock lock(decode_mu_);
    closed = decode_closed_;
    if (!closed) {
      decode_work_id_ = work.work_id = ticket.work_id;
      decode_outstanding_.emplace(ticket.work_id, std::nullopt);
    }
  }
  if (closed) return DisabledBy(Status::Unavailable("the job's connection closed"));
  OnIo([this, work = std::move(work), fd = std::make_shared<UniqueFd>(std::move(*fresh)),
        segment_bytes]() mutable {
    if (closed_ || !job_id_) return;
    work.job_id = *job_id_;
    if (fd->valid()) Reply(protocol::DecodeSegment{*job_id_, segment_bytes}, std::move(*fd));
    Reply(work);
  });
  return ticket;
}

Result<JobDecodeResult> Session::Await(const JobDecodeTicket& ticket,
                                       std::chrono::milliseconds deadline) {
  const auto wait_start = std::chrono::steady_clock::now();
  std::optional<protocol::DecodeDone> answer;
  bool closed = false;
  {
    MutexLock lock(decode_mu_);
    auto it = decode_outstanding_.find(ticket.work_id);
    if (it == decode_outstanding_.end()) {
      return Status::InvalidArgument(
          fmt::format("decode work {} is not outstanding (awaited twice?)", ticket.work_id));
    }
    (void)decode_mu_.WaitFor(decode_cv_, deadline, [&]() REQUIRES(decode_mu_) {
      return it->second.has_value() || decode_closed_ || !decode_enabled_.load();
    });
    answer = std::move(it->second);
    decode_outstanding_.erase(it);
    closed = !answer && decode_closed_;
  }
  if (closed) return DisabledBy(Status::Unavailable("the job's connection closed"));
  // Turned off meanwhile (another work failed): nothing of it is trusted, and it is no new failure.
  if (!decode_enabled_.load()) {
    return Status::FailedPrecondition(fmt::format(
        "the job's decoding was turned off while work {} was outstanding", ticket.work_id));
  }
  if (!answer) {
    return DisabledBy(Status::Unavailable(
        fmt::format("the job did not answer decode work {} ({} JPEGs) within {} ms", ticket.work_id,
                    ticket.items, deadline.count())));
  }
  protocol::DecodeDone done = std::move(*answer);
  if (done.code != StatusCode::kOk) return DisabledBy(Status(done.code, done.message));
  const uint64_t output_bytes = kLanes * ticket.lane_bytes;
  if (done.buffer_handle.size() != protocol::kIpcHandleBytes ||
      done.buffer_offset > done.buffer_bytes ||
      done.buffer_bytes - done.buffer_offset < output_bytes) {
    return DisabledBy(Status::Corruption(fmt::format(
        "the job's decode buffer ({} bytes from offset {}) cannot hold the work's {} bytes",
        done.buffer_bytes, done.buffer_offset, output_bytes)));
  }
  for (uint32_t i : done.failed) {
    if (i >= ticket.items) {
      return DisabledBy(Status::Corruption(
          fmt::format("the job says item {} of a {}-item decode work failed", i, ticket.items)));
    }
  }
  return JobDecodeResult{
      std::move(done.buffer_handle),
      done.buffer_offset + ticket.lane * ticket.lane_bytes,
      done.buffer_bytes,
      std::move(done.failed),
      ticket.copy_seconds,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count()};
}

void Session::SendBatch(const protocol::BatchReady& batch) {
  if (closed_ || !job_id_ || batch.job_id != *job_id_) return;
  if (unreleased_.size() >= credits_) {
    log::Error("job {}: engine delivered a batch beyond the {} credits; returning slot {}",
               *job_id_, credits_, batch.slot);
    Status s = plane_.service().Release(*job_id_, batch.slot, batch.generation);
    if (!s.ok()) log::Error("job {}: {}", *job_id_, s.ToString());
    return;
  }
  unreleased_.insert({batch.slot, batch.generation});
  Reply(batch);
}

void Session::DeliverBatch(const protocol::BatchReady& batch) {
  OnIo([this, batch] { SendBatch(batch); });
}

void Session::PostFrame(const protocol::Message& message) {
  OnIo([this, message] {
    if (!closed_ && job_id_) Reply(message);
  });
}

void Session::DeliverEndOfData(uint32_t epochs_completed) {
  // job_id_ is read on the io thread; fill it in there.
  OnIo([this, epochs_completed] {
    if (!closed_ && job_id_) Reply(protocol::EndOfData{*job_id_, epochs_completed});
  });
}

void Session::DeliverError(const Status& status) {
  StatusCode code = status.ok() ? StatusCode::kInternal : status.code();
  PostFrame(protocol::Error{code, status.message()});
}

}  // namespace carpool
