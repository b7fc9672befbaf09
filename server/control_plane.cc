#include "server/control_plane.h"

#include <errno.h>
#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cstring>

#include "common/log.h"
#include "server/session.h"
#include "server/thread_name.h"

namespace carpool {
namespace asio = boost::asio;
using stream = asio::local::stream_protocol;

namespace {

// True if a process accepts connections on the unix socket at `path`.
bool SomeoneListens(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  bool live = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return live;
}

}  // namespace

ControlPlane::ControlPlane(ControlPlaneOptions options, JobService* service)
    : options_(std::move(options)), service_(service), acceptor_(io_) {}

Result<std::unique_ptr<ControlPlane>> ControlPlane::Start(ControlPlaneOptions options,
                                                          JobService* service) {
  if (options.lease.count() <= 0 || options.lease.count() > UINT32_MAX) {
    return Status::InvalidArgument(
        fmt::format("lease of {} ms is out of range; use e.g. 2s", options.lease.count()));
  }
  if (options.max_jobs == 0 || options.max_sessions == 0 || options.max_batch_size == 0 ||
      options.max_prefetch == 0) {
    return Status::InvalidArgument(fmt::format(
        "control plane limits must be at least 1: max_jobs={}, max_sessions={}, "
        "max_batch_size={}, max_prefetch={}",
        options.max_jobs, options.max_sessions, options.max_batch_size, options.max_prefetch));
  }
  std::unique_ptr<ControlPlane> plane(new ControlPlane(std::move(options), service));
  Status s = plane->Listen();
  if (!s.ok()) return s;
  plane->Accept();
  plane->thread_ = std::thread([p = plane.get()] {
    NameThisThread("carpool-io");
    p->io_.run();
  });
  log::Info("control plane listening on {} (lease {} ms)", plane->options_.socket_path,
            plane->options_.lease.count());
  return plane;
}

Status ControlPlane::Listen() {
  const std::string& path = options_.socket_path;
  if (path.empty() || path.size() >= sizeof(sockaddr_un::sun_path)) {
    return Status::InvalidArgument(
        fmt::format("socket path \"{}\" is empty or longer than {} bytes; pick a shorter --socket",
                    path, sizeof(sockaddr_un::sun_path) - 1));
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status::FailedPrecondition(fmt::format(
          "{} exists and is not a socket; remove it or choose another --socket", path));
    }
    if (SomeoneListens(path)) {
      return Status::FailedPrecondition(fmt::format(
          "a server is already listening on {}; stop it or choose another --socket", path));
    }
    log::Info("removing stale socket {} (nobody listens on it)", path);
    ::unlink(path.c_str());
  }
  boost::system::error_code ec;
  acceptor_.open(stream(), ec);
  if (!ec) acceptor_.bind(stream::endpoint(path), ec);
  if (ec) return Status::IOError(fmt::format("cannot bind {}: {}", path, ec.message()));
  bound_ = true;
  // Before listen() nobody can connect, so setting the group and mode here leaves no window.
  if (Status s = cache::ApplyClientAccess(path, options_.access); !s.ok()) return s;
  if (options_.before_accepting) options_.before_accepting();
  acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status::IOError(fmt::format("cannot listen on {}: {}", path, ec.message()));
  return Status::OK();
}

void ControlPlane::Accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec, stream::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) {
      log::Warn("accept failed: {}", ec.message());
    } else if (sessions_.size() >= options_.max_sessions) {
      log::Warn("refusing a connection: {} sessions are open (the limit, max_sessions)",
                sessions_.size());
    } else {
      auto session = std::make_shared<Session>(std::move(socket), *this);
      sessions_.insert(session);
      session->Start();
    }
    Accept();
  });
}

bool ControlPlane::TryAddJob() {
  uint32_t n = jobs_.load();
  while (n < options_.max_jobs) {
    if (jobs_.compare_exchange_weak(n, n + 1)) return true;
  }
  return false;
}

void ControlPlane::SessionClosed(const std::shared_ptr<Session>& session) {
  sessions_.erase(session);
}

void ControlPlane::Stop() {
  if (stopped_) return;
  stopped_ = true;
  asio::post(io_, [this] {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    auto sessions = sessions_;  // Close() erases from sessions_
    for (const auto& s : sessions) s->Close("server stopping");
    io_.stop();
  });
  bool was_running = thread_.joinable();
  if (was_running) thread_.join();
  joins_.join();  // creations in flight finish; their replies have no io thread to go to
  control_.join();  // after the joins: a creation whose client left queues its removal here
  sessions_.clear();
  if (bound_) ::unlink(options_.socket_path.c_str());  // never a live server's socket
  if (was_running) log::Info("control plane on {} stopped", options_.socket_path);
}

ControlPlane::~ControlPlane() { Stop(); }

void ControlPlane::RunJoin(std::function<void()> task) { asio::post(joins_, std::move(task)); }

void ControlPlane::RunControl(std::function<void()> task) { asio::post(control_, std::move(task)); }

}  // namespace carpool
