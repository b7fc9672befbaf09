// The server's control plane: an Asio unix-socket listener (mode 0600, or 0660 and a group with
// --group) on one io thread, with one Session per connection (server/session.h), in the shape of
// Asio's HTTP server example.
// Thread-safe: Start/Stop may be called from any thread; the sessions run on the io thread, and the
// JobService calls that may take a while in two small pools of their own (RunJoin, RunControl).
#ifndef CARPOOL_SERVER_CONTROL_PLANE_H_
#define CARPOOL_SERVER_CONTROL_PLANE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/local/stream_protocol.hpp>

#include "cache/client_access.h"
#include "carpool/status.h"
#include "server/job_service.h"

namespace carpool {

class Session;

struct ControlPlaneOptions {
  std::string socket_path;
  std::string instance;                    // names the server in hello replies and segments
  std::chrono::milliseconds lease{2000};   // a session silent this long is closed
  cache::ClientAccess access;              // of the socket file: the server's user, or a group
  uint32_t max_jobs = 64;
  uint32_t max_sessions = 256;
  uint32_t max_batch_size = 65536;
  uint32_t max_prefetch = 64;
  // Runs once the socket is bound (so no live server owns it) but before anyone can connect:
  // the place to clear what a crashed server of this instance left behind.
  std::function<void()> before_accepting;
};

class ControlPlane {
 public:
  // Binds the socket and starts the io thread. A stale socket file (nobody listening) is
  // replaced; a live server on the path is FailedPrecondition, as is a path that is not a socket.
  // `service` must outlive the ControlPlane.
  static Result<std::unique_ptr<ControlPlane>> Start(ControlPlaneOptions options,
                                                     JobService* service);
  ~ControlPlane();  // Stop()
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  // Closes the listener and every session (each job gets RemoveJob), joins the io thread and
  // removes the socket file. Idempotent.
  void Stop();

  const ControlPlaneOptions& options() const { return options_; }
  JobService& service() { return *service_; }
  uint32_t job_count() const { return jobs_.load(); }

  // For sessions (io thread only).
  bool TryAddJob();
  void RemovedJob() { jobs_.fetch_sub(1); }
  void SessionClosed(const std::shared_ptr<Session>& session);
  // Off the io thread, in two lanes so that a join never queues ahead of a removal or a status:
  // RunJoin for job creation (it loads datasets: seconds for ImageNet's size), RunControl for
  // removals and stats (milliseconds, each waiting at most one join chunk for the engine's lock).
  // Any thread.
  void RunJoin(std::function<void()> task);
  void RunControl(std::function<void()> task);

 private:
  ControlPlane(ControlPlaneOptions options, JobService* service);
  Status Listen();
  void Accept();

  ControlPlaneOptions options_;
  JobService* service_;
  boost::asio::io_context io_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  std::set<std::shared_ptr<Session>> sessions_;  // io thread only
  std::atomic<uint32_t> jobs_{0};
  std::thread thread_;
  // Both joined by Stop after the io thread.
  boost::asio::thread_pool joins_{2};    // RunJoin
  // Four: a large job's removal gives its samples back in parts for a second or more, and two of
  // them at once must not hold up a small job's removal or a status.
  boost::asio::thread_pool control_{4};  // RunControl
  bool bound_ = false;    // we created the socket file
  bool stopped_ = false;  // touched only by Start and Stop's caller
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_CONTROL_PLANE_H_
