// The `/metrics` endpoint (`carpool server --metrics HOST:PORT`): a small HTTP/1.1 listener on
// Boost.Beast with its own io_context and thread, one request per connection. What it serves
// comes from a callback (the engine's RenderPrometheus text), so it knows nothing of the engine.
// Thread-compatible: one thread starts and stops it; the scrapes run on its own thread.
#ifndef CARPOOL_SERVER_METRICS_HTTP_H_
#define CARPOOL_SERVER_METRICS_HTTP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "carpool/status.h"

namespace carpool {

struct MetricsAddress {
  std::string host;  // an IPv4 or IPv6 literal, without brackets
  uint16_t port = 0;
};

// "127.0.0.1:9464", "0.0.0.0:9464", "[::1]:9464". The error names `text` and the expected form.
Result<MetricsAddress> ParseMetricsAddress(std::string_view text);

struct MetricsReply {
  int status = 200;  // 200, 404 or 405
  std::string content_type;
  std::string body;
};

// The answer to one request, socket-free: GET /metrics (a query string is ignored) gets 200 and
// `render()`; another path 404; another method 405. `render` runs only for the 200.
MetricsReply AnswerMetricsRequest(std::string_view method, std::string_view target,
                                  const std::function<std::string()>& render);

class MetricsListener {
 public:
  // Binds and starts serving. The error names the address and the cause (e.g. the port in use).
  // `render` runs on the listener's thread, once per scrape.
  static Result<std::unique_ptr<MetricsListener>> Start(const MetricsAddress& address,
                                                        std::function<std::string()> render);
  ~MetricsListener();  // Stop()
  MetricsListener(const MetricsListener&) = delete;
  MetricsListener& operator=(const MetricsListener&) = delete;

  // Closes the socket, drops connections in progress and joins the thread. Idempotent.
  void Stop();
  uint16_t port() const;  // the bound port (the one chosen, for port 0)

 private:
  struct Impl;
  explicit MetricsListener(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_METRICS_HTTP_H_
