// One client connection: reads and validates frames, dispatches them to the JobService, enforces
// the lease and the job's credits, and writes replies and the engine's batches in order.
// Thread contract: everything runs on the control plane's io thread, except the JobSink methods,
// which may be called from any thread and post to it.
#ifndef CARPOOL_SERVER_SESSION_H_
#define CARPOOL_SERVER_SESSION_H_

#include <atomic>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/unique_fd.h"
#include "protocol/protocol.h"
#include "protocol/segment_fd.h"
#include "server/job_service.h"

namespace carpool {

class ControlPlane;

class Session : public JobSink, public JobDecoder, public std::enable_shared_from_this<Session> {
 public:
  Session(boost::asio::local::stream_protocol::socket socket, ControlPlane& plane);
  void Start();
  // Closes the socket now and removes the job, if any (io thread only). Idempotent.
  void Close(const std::string& reason);

  void DeliverBatch(const protocol::BatchReady& batch) override;
  void DeliverEndOfData(uint32_t epochs_completed) override;
  void DeliverError(const Status& status) override;
  JobDecoder* job_decoder() override { return this; }

  // JobDecoder: from a build's worker thread.
  bool enabled() const override { return decode_enabled_.load(); }
  void Disable(const Status& why) override;
  Result<JobDecodeTicket> Send(std::string_view prepare_spec, std::span<const JobDecodeItem> items,
                               uint64_t lane_bytes) override;
  Result<JobDecodeResult> Await(const JobDecodeTicket& ticket,
                                std::chrono::milliseconds deadline) override;

 private:
  void ReadHeader();
  void ReadPayload(const protocol::FrameHeader& header);
  // A frame of another protocol version (a hello, or an error): answers with an error in that
  // version naming both sides' versions, then closes.
  void RefuseForeign(const protocol::FrameHeader& header);
  void Dispatch(protocol::Message message);
  void OnCreateJob(const protocol::CreateJob& request);
  // The client said bye: closes, after removing the job where its process decodes for us.
  void Leave();
  // Back on the io thread once the service created the job (off the io thread).
  void FinishCreateJob(const protocol::CreateJob& request, Result<protocol::JobInfo> info);
  // Runs `fn` on the io thread; while the job is being created, after its job-info reply.
  void OnIo(std::function<void()> fn);  // any thread
  void OnRelease(const protocol::Release& release);
  void OnDecodeDone(protocol::DecodeDone done);
  // Grows the decode segment to hold `bytes` (worker thread). The new one's fd, or an invalid fd
  // when the current one is large enough.
  Result<UniqueFd> EnsureDecodeSegment(uint64_t bytes);
  // Disable(why), then why: for the decoder's failures. Never under decode_mu_.
  Status DisabledBy(Status why);
  // Sends an error and closes once it is written: for protocol violations.
  void Reject(const Status& status);
  void Reply(const protocol::Message& message, UniqueFd fd = {});
  void QueueFrame(std::vector<uint8_t> frame, UniqueFd fd);
  void WriteNext();
  // Sends the front frame's first bytes with its fd attached (sendmsg), then the rest as usual.
  void WriteWithFd();
  void Written(const boost::system::error_code& ec);
  void PostFrame(const protocol::Message& message);  // any thread
  void SendBatch(const protocol::BatchReady& batch);  // io thread
  void ArmLeaseTimer();

  boost::asio::local::stream_protocol::socket socket_;
  boost::asio::steady_timer lease_timer_;
  ControlPlane& plane_;
  uint8_t header_[protocol::kFrameHeaderBytes];
  std::vector<uint8_t> payload_;
  struct Outgoing {
    std::vector<uint8_t> frame;
    UniqueFd fd;  // the job-info's batch segment, sent with the frame's first byte
  };
  std::deque<Outgoing> outbox_;
  size_t outbox_bytes_ = 0;
  static constexpr size_t kMaxOutboxBytes = 8u << 20;
  bool writing_ = false;
  bool closing_ = false;  // close once the outbox drains
  bool closed_ = false;
  bool said_hello_ = false;
  std::chrono::steady_clock::time_point last_heard_;
  std::optional<uint64_t> job_id_;
  // The service is creating this session's job (ControlPlane::RunJoin): deliveries wait in
  // held_ until the job-info reply has gone out, and the lease clock does not run.
  bool creating_ = false;
  std::vector<std::function<void()>> held_;
  uint32_t credits_ = 0;  // the job's prefetch depth
  bool job_decodes_ = false;  // its process decodes for the server (its job-info said so)
  bool leaving_ = false;      // removing the job after a bye; closes when done
  std::set<std::pair<uint32_t, uint64_t>> unreleased_;  // (slot, generation) delivered

  // GPU decode in the job's process: the builds waiting for their answers, on worker threads.
  std::atomic<bool> decode_enabled_{true};  // false after any failure, for good
  Mutex decode_mu_;
  std::condition_variable decode_cv_;
  uint64_t decode_work_id_ GUARDED_BY(decode_mu_) = 0;  // the latest work sent
  // The works sent and not yet awaited (at most JobDecoder::kLanes), with their answers once in.
  std::map<uint64_t, std::optional<protocol::DecodeDone>> decode_outstanding_
      GUARDED_BY(decode_mu_);
  bool decode_closed_ GUARDED_BY(decode_mu_) = false;        // the session closed
  std::unique_ptr<protocol::SharedMapping> decode_segment_;  // Send's (one at a time)
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_SESSION_H_
