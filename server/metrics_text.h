// The engine's statistics in the Prometheus text exposition format, version 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/). Pure functions, socket-free:
// metrics_http.h serves the text. docs/server.md lists the metrics. Thread-safe.
#ifndef CARPOOL_SERVER_METRICS_TEXT_H_
#define CARPOOL_SERVER_METRICS_TEXT_H_

#include <string>
#include <string_view>

#include "server/engine_snapshot.h"

namespace carpool {

// The Content-Type of RenderPrometheus's text.
inline constexpr std::string_view kPrometheusContentType =
    "text/plain; version=0.0.4; charset=utf-8";

// Every metric of `snapshot`: a `# HELP` and a `# TYPE` line per family, then its samples.
// GPU families appear only when the snapshot has GPUs.
std::string RenderPrometheus(const EngineSnapshot& snapshot);

// A label value as the format wants it: backslash, double quote and newline escaped.
std::string EscapeLabelValue(std::string_view value);

}  // namespace carpool

#endif  // CARPOOL_SERVER_METRICS_TEXT_H_
