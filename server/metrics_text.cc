// RenderPrometheus: one Family per metric name, its samples written in the order given.
#include "server/metrics_text.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace carpool {
namespace {

// The format's escapes: backslash and newline always; the double quote only in label values.
std::string Escape(std::string_view text, bool quote) {
  std::string out;
  for (char c : text) {
    if (c == '\\' || (quote && c == '"')) {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// Go's ParseFloat spellings for the special values; integers print without an exponent.
std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

using Labels = std::vector<std::pair<std::string_view, std::string>>;

// Appends one metric family to `out`: HELP, TYPE, then a sample line per Add.
class Family {
 public:
  Family(std::string* out, std::string_view name, std::string_view type, std::string_view help)
      : out_(out), name_(name) {
    *out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, Escape(help, /*quote=*/false), name, type);
  }
  Family& Add(uint64_t value, const Labels& labels = {}) {
    return AddText(fmt::format("{}", value), labels);
  }
  Family& Add(int64_t value, const Labels& labels = {}) {
    return AddText(fmt::format("{}", value), labels);
  }
  Family& Add(double value, const Labels& labels = {}) {
    return AddText(FormatValue(value), labels);
  }

 private:
  Family& AddText(const std::string& value, const Labels& labels) {
    *out_ += name_;
    if (!labels.empty()) {
      *out_ += '{';
      for (size_t i = 0; i < labels.size(); ++i) {
        *out_ += fmt::format("{}{}=\"{}\"", i == 0 ? "" : ",", labels[i].first,
                             EscapeLabelValue(labels[i].second));
      }
      *out_ += '}';
    }
    *out_ += ' ' + value + '\n';
    return *this;
  }

  std::string* out_;
  std::string_view name_;
};

}  // namespace

std::string EscapeLabelValue(std::string_view value) { return Escape(value, /*quote=*/true); }

std::string RenderPrometheus(const EngineSnapshot& s) {
  std::string out;
  const cache::IndexStats& c = s.cache.index;
  Family(&out, "carpool_preparations_total", "counter",
         "Samples prepared (decoded and pre-transformed): into the cache, or transient (no room)")
      .Add(s.cached_preparations, {{"kind", "cached"}})
      .Add(s.transient_preparations, {{"kind", "transient"}});
  Family(&out, "carpool_deliveries_total", "counter", "Samples delivered to jobs in batches")
      .Add(s.deliveries);
  Family(&out, "carpool_cache_hits_total", "counter", "Cache lookups that found the sample")
      .Add(c.hits);
  Family(&out, "carpool_cache_misses_total", "counter", "Cache lookups that did not")
      .Add(c.misses);
  Family(&out, "carpool_cache_evictions_total", "counter", "Samples evicted from the cache")
      .Add(c.evictions);
  Family(&out, "carpool_cache_insertions_total", "counter", "Samples inserted into the cache")
      .Add(c.insertions);
  Family(&out, "carpool_skipped_total", "counter",
         "Samples left out of batches: unreadable, or a shape the job's transform cannot take")
      .Add(s.skipped);
  Family(&out, "carpool_bad_samples", "counter", "Samples found unreadable").Add(s.bad_samples);
  Family(&out, "carpool_jobs", "gauge", "Jobs connected now")
      .Add(static_cast<uint64_t>(s.jobs.size()));
  Family rate(&out, "carpool_job_rate", "gauge", "A job's consumption rate in samples per second");
  for (const JobSnapshot& j : s.jobs) rate.Add(j.rate, {{"job", fmt::format("{}", j.id)},
                                                        {"dataset", j.dataset}});
  Family depth(&out, "carpool_job_queue_depth", "gauge",
               "A job's samples decided and not yet delivered");
  for (const JobSnapshot& j : s.jobs) depth.Add(j.queue_depth, {{"job", fmt::format("{}", j.id)},
                                                                {"dataset", j.dataset}});
  Family held(&out, "carpool_job_held_seconds", "gauge",
              "Time a job was held back by the pacing (it led its sharers by the window)");
  for (const JobSnapshot& j : s.jobs) held.Add(j.held_s, {{"job", fmt::format("{}", j.id)},
                                                          {"dataset", j.dataset}});
  Family(&out, "carpool_lookahead", "gauge", "Look-ahead L in samples: derived, or --lookahead")
      .Add(s.lookahead);
  Family(&out, "carpool_pacing_window", "gauge",
         "Owed samples the pacing allows: cache capacity in samples less the pinned ones")
      .Add(s.pacing.window);
  Family(&out, "carpool_pacing_owed", "gauge",
         "Samples delivered to one job and still queued for another")
      .Add(s.pacing.owed);
  Family(&out, "carpool_pacing_holds_total", "counter", "Batches the pacing held back")
      .Add(s.pacing.holds);
  Family(&out, "carpool_pacing_lifts_total", "counter",
         "Batches let past the window because the jobs behind waited on their own clients")
      .Add(s.pacing.lifts);
  if (s.pacing.spare_cpu >= 0) {
    Family(&out, "carpool_pacing_spare_cpu", "gauge",
           "Share of the CPU (or of the cgroup's quota) that other processes leave to the "
           "server, idle or its own; the pacing's lift needs 0.1")
        .Add(s.pacing.spare_cpu);
  }
  Family(&out, "carpool_samples_known", "gauge", "Samples of the datasets of the jobs present")
      .Add(s.samples_known);
  Family(&out, "carpool_sample_states", "gauge",
         "Samples with per-sample state: those of the jobs present and cached ones no job uses")
      .Add(s.sample_states);
  Family(&out, "carpool_cache_bytes_used", "gauge", "Cache bytes held by samples")
      .Add(c.bytes_used);
  Family(&out, "carpool_cache_bytes_pinned", "gauge", "Cache bytes pinned by batches being built")
      .Add(c.bytes_pinned);
  Family(&out, "carpool_refcount_total", "gauge",
         "Sum of the scheduler's reference counts: decided uses not yet delivered")
      .Add(s.refcount_total);
  if (s.gpus.empty()) return out;
  Family(&out, "carpool_gpu_decode_cpu_fallbacks_total", "counter",
         "GPU jobs' samples the workers prepared on the CPU: streams GPU decode does not take")
      .Add(s.gpu_decode_cpu_fallbacks);
  // One family at a time, each with a sample per device.
  const auto per_gpu = [&](std::string_view name, std::string_view type, std::string_view help,
                           uint64_t GpuCounters::*field) {
    Family f(&out, name, type, help);
    for (const GpuCounters& g : s.gpus) f.Add(g.*field, {{"device", fmt::format("{}", g.device)}});
  };
  per_gpu("carpool_gpu_uploads_total", "counter", "Samples copied host to device",
          &GpuCounters::uploads);
  per_gpu("carpool_gpu_upload_bytes_total", "counter", "Bytes copied host to device",
          &GpuCounters::upload_bytes);
  per_gpu("carpool_gpu_resident_hits_total", "counter",
          "Batch images whose sample was already on the device", &GpuCounters::resident_hits);
  per_gpu("carpool_gpu_pool_bytes", "gauge", "Device bytes held by jobs' batch slots",
          &GpuCounters::pool_bytes);
  {
    // The backend is a label: "hardware" (the JPEG engines), "gpu-hybrid", or "cpu" (no nvJPEG).
    Family f(&out, "carpool_gpu_decodes_total", "counter",
             "Encoded samples decoded by nvJPEG on the device");
    for (const GpuCounters& g : s.gpus) {
      f.Add(g.gpu_decodes, {{"device", fmt::format("{}", g.device)},
                            {"backend", g.decoder.empty() ? "cpu" : g.decoder}});
    }
  }
  per_gpu("carpool_gpu_build_cpu_decodes_total", "counter",
          "Encoded samples a GPU's build decoded on the CPU (streams nvJPEG refused at decode)",
          &GpuCounters::cpu_fallbacks);
  per_gpu("carpool_gpu_decoded_bytes_total", "counter",
          "Encoded bytes read from the host cache's encoded tier for GPU decode",
          &GpuCounters::decoded_bytes);
  per_gpu("carpool_gpu_job_decodes_total", "counter",
          "Encoded samples the jobs' own processes decoded for this GPU (--job-decode)",
          &GpuCounters::job_decodes);
  per_gpu("carpool_gpu_overlapped_builds_total", "counter",
          "Builds planned while an earlier one waited for its job's own GPU decode",
          &GpuCounters::overlapped_builds);
  per_gpu(
      "carpool_gpu_job_decode_failures_total", "counter",
      "Jobs whose own decode failed or missed a deadline, once each (the server decodes theirs)",
      &GpuCounters::job_decode_failures);
  per_gpu("carpool_gpu_undecodable_total", "counter",
          "Encoded samples neither nvJPEG nor the CPU could decode", &GpuCounters::undecodable);
  return out;
}

}  // namespace carpool
