// MetricsListener: an accept loop and one Connection per client (read a request, write the
// answer, shut down), all on one io_context run by the listener's thread.
#include "server/metrics_http.h"

#include <utility>  // before Asio (Boost 1.74)

#include <fmt/format.h>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "server/metrics_text.h"
#include "server/thread_name.h"


namespace carpool {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

constexpr std::chrono::seconds kConnectionTimeout{10};

// Boost 1.74's beast::string_view is boost::string_view, not std::string_view.
std::string_view StdView(beast::string_view s) { return {s.data(), s.size()}; }

// Reads one request, writes its answer and closes; owns itself through the pending operation.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, const std::function<std::string()>* render)
      : stream_(std::move(socket)), render_(render) {}

  void Run() {
    stream_.expires_after(kConnectionTimeout);
    http::async_read(stream_, buffer_, request_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (!ec) self->Answer();
                     });
  }

 private:
  void Answer() {
    const MetricsReply reply =
        AnswerMetricsRequest(StdView(request_.method_string()), StdView(request_.target()),
                             *render_);
    response_.version(request_.version());
    response_.result(static_cast<http::status>(reply.status));
    response_.set(http::field::content_type, reply.content_type);
    if (reply.status == 405) response_.set(http::field::allow, "GET");
    response_.keep_alive(false);
    response_.body() = reply.body;
    response_.prepare_payload();
    http::async_write(stream_, response_,
                      [self = shared_from_this()](beast::error_code, size_t) {
                        beast::error_code ignored;
                        self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
                      });
  }

  beast::tcp_stream stream_;
  const std::function<std::string()>* render_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> request_;
  http::response<http::string_body> response_;
};

}  // namespace

struct MetricsListener::Impl {
  explicit Impl(std::function<std::string()> r) : render(std::move(r)) {}

  void Accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
      if (!ec) std::make_shared<Connection>(std::move(socket), &render)->Run();
      Accept();
    });
  }

  std::function<std::string()> render;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  uint16_t port = 0;
  std::thread thread;
};

Result<MetricsAddress> ParseMetricsAddress(std::string_view text) {
  const Status bad = Status::InvalidArgument(fmt::format(
      "--metrics \"{}\" is not HOST:PORT; expected e.g. 127.0.0.1:9464 or [::1]:9464", text));
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size()) return bad;
  std::string_view host = text.substr(0, colon);
  const std::string_view port = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    return bad;  // an IPv6 literal needs its brackets
  }
  if (port.size() > 5) return bad;
  uint32_t number = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return bad;
    number = number * 10 + static_cast<uint32_t>(c - '0');
  }
  if (number > 65535) return bad;
  boost::system::error_code ec;
  asio::ip::make_address(std::string(host), ec);
  if (ec) {
    return Status::InvalidArgument(fmt::format(
        "--metrics \"{}\": \"{}\" is not an IP address; expected e.g. 127.0.0.1:9464", text,
        host));
  }
  return MetricsAddress{std::string(host), static_cast<uint16_t>(number)};
}

MetricsReply AnswerMetricsRequest(std::string_view method, std::string_view target,
                                  const std::function<std::string()>& render) {
  const std::string_view path = target.substr(0, target.find('?'));
  if (path != "/metrics") {
    return {404, "text/plain", fmt::format("not found: {}; the metrics are at /metrics\n", path)};
  }
  if (method != "GET") {
    return {405, "text/plain", fmt::format("method {} not allowed; use GET\n", method)};
  }
  return {200, std::string(kPrometheusContentType), render()};
}

MetricsListener::MetricsListener(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsListener::~MetricsListener() { Stop(); }

Result<std::unique_ptr<MetricsListener>> MetricsListener::Start(
    const MetricsAddress& address, std::function<std::string()> render) {
  auto impl = std::make_unique<Impl>(std::move(render));
  boost::system::error_code ec;
  const tcp::endpoint endpoint(asio::ip::make_address(address.host, ec), address.port);
  const auto fail = [&](const char* what) {
    return Status::IOError(fmt::format(
        "--metrics {}:{}: cannot {} ({}); pick a free port, or stop the process that holds it",
        address.host, address.port, what, ec.message()));
  };
  if (ec) return fail("parse the address");
  if (impl->acceptor.open(endpoint.protocol(), ec); ec) return fail("open a socket");
  if (impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec); ec) {
    return fail("set SO_REUSEADDR");
  }
  if (impl->acceptor.bind(endpoint, ec); ec) return fail("bind");
  if (impl->acceptor.listen(asio::socket_base::max_listen_connections, ec); ec) {
    return fail("listen");
  }
  impl->port = impl->acceptor.local_endpoint(ec).port();
  impl->Accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] {
    NameThisThread("carpool-metrics");
    raw->io.run();
  });
  return std::unique_ptr<MetricsListener>(new MetricsListener(std::move(impl)));
}

void MetricsListener::Stop() {
  if (!impl_->thread.joinable()) return;
  asio::post(impl_->io, [impl = impl_.get()] {
    boost::system::error_code ignored;
    impl->acceptor.close(ignored);
    impl->io.stop();
  });
  impl_->thread.join();
}

uint16_t MetricsListener::port() const { return impl_->port; }

}  // namespace carpool
