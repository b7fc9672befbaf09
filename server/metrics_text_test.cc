#include "server/metrics_text.h"

#include <gtest/gtest.h>

#include <string>

namespace carpool {
namespace {

EngineSnapshot TwoJobs() {
  EngineSnapshot s;
  s.cached_preparations = 7;
  s.transient_preparations = 2;
  s.deliveries = 40;
  s.cache.index.hits = 31;
  s.cache.index.misses = 9;
  s.cache.index.evictions = 3;
  s.cache.index.insertions = 7;
  s.cache.index.bytes_used = 4096;
  s.cache.index.bytes_pinned = 1024;
  s.skipped = 1;
  s.bad_samples = 1;
  s.refcount_total = 12;
  JobSnapshot a;
  a.id = 1;
  a.dataset = "fmnist";
  a.rate = 1500.5;
  a.queue_depth = 64;
  JobSnapshot b;
  b.id = 2;
  b.dataset = "we\"ird\\na\nme";
  b.rate = 0;
  b.queue_depth = 3;
  s.jobs = {a, b};
  return s;
}

TEST(MetricsTextTest, EveryFamilyHasHelpTypeAndItsSamples) {
  const std::string text = RenderPrometheus(TwoJobs());
  for (const char* family :
       {"carpool_preparations_total counter", "carpool_deliveries_total counter",
        "carpool_cache_hits_total counter", "carpool_cache_misses_total counter",
        "carpool_cache_evictions_total counter", "carpool_cache_insertions_total counter",
        "carpool_skipped_total counter", "carpool_bad_samples counter", "carpool_jobs gauge",
        "carpool_job_rate gauge", "carpool_job_queue_depth gauge",
        "carpool_cache_bytes_used gauge", "carpool_cache_bytes_pinned gauge",
        "carpool_refcount_total gauge"}) {
    const std::string name = std::string(family).substr(0, std::string(family).find(' '));
    EXPECT_NE(text.find("# TYPE " + std::string(family) + "\n"), std::string::npos) << family;
    EXPECT_NE(text.find("# HELP " + name + " "), std::string::npos) << family;
  }
  for (const char* line :
       {"carpool_preparations_total{kind=\"cached\"} 7\n",
        "carpool_preparations_total{kind=\"transient\"} 2\n", "carpool_deliveries_total 40\n",
        "carpool_cache_hits_total 31\n", "carpool_cache_misses_total 9\n",
        "carpool_cache_evictions_total 3\n", "carpool_cache_insertions_total 7\n",
        "carpool_skipped_total 1\n", "carpool_bad_samples 1\n", "carpool_jobs 2\n",
        "carpool_job_rate{job=\"1\",dataset=\"fmnist\"} 1500.5\n",
        "carpool_job_queue_depth{job=\"1\",dataset=\"fmnist\"} 64\n",
        "carpool_cache_bytes_used 4096\n", "carpool_cache_bytes_pinned 1024\n",
        "carpool_refcount_total 12\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "in\n" << text;
  }
  EXPECT_EQ(text.find("carpool_gpu_"), std::string::npos) << "no GPU served, no GPU family";
  EXPECT_EQ(text.back(), '\n');
}

// The spare CPU share is a gauge once measured, and absent (not 0 or -1) before.
TEST(MetricsTextTest, SpareCpuIsShownOnlyOnceMeasured) {
  EngineSnapshot s = TwoJobs();
  EXPECT_EQ(RenderPrometheus(s).find("carpool_pacing_spare_cpu"), std::string::npos);
  s.pacing.spare_cpu = 0.25;
  const std::string text = RenderPrometheus(s);
  EXPECT_NE(text.find("# TYPE carpool_pacing_spare_cpu gauge\n"), std::string::npos) << text;
  EXPECT_NE(text.find("carpool_pacing_spare_cpu 0.25\n"), std::string::npos) << text;
}

TEST(MetricsTextTest, LabelValuesAreEscaped) {
  EXPECT_EQ(EscapeLabelValue("plain"), "plain");
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  const std::string text = RenderPrometheus(TwoJobs());
  EXPECT_NE(text.find("carpool_job_queue_depth{job=\"2\",dataset=\"we\\\"ird\\\\na\\nme\"} 3\n"),
            std::string::npos)
      << text;
  // Every line is a comment or one sample: no raw newline leaked out of a label.
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    ASSERT_NE(end, std::string::npos);
    const std::string line = text.substr(start, end - start);
    EXPECT_TRUE(line.rfind("# ", 0) == 0 || line.rfind("carpool_", 0) == 0) << line;
    start = end + 1;
  }
}

TEST(MetricsTextTest, GpuFamiliesHaveOneSamplePerDevice) {
  EngineSnapshot s;
  GpuCounters g0, g1;
  g0.device = 0;
  g0.uploads = 5;
  g0.upload_bytes = 500;
  g0.resident_hits = 20;
  g0.pool_bytes = 1 << 20;
  g1.device = 3;
  g1.uploads = 6;
  s.gpus = {g0, g1};
  const std::string text = RenderPrometheus(s);
  for (const char* line :
       {"# TYPE carpool_gpu_uploads_total counter\n", "carpool_gpu_uploads_total{device=\"0\"} 5\n",
        "carpool_gpu_uploads_total{device=\"3\"} 6\n",
        "carpool_gpu_upload_bytes_total{device=\"0\"} 500\n",
        "carpool_gpu_resident_hits_total{device=\"0\"} 20\n",
        "# TYPE carpool_gpu_pool_bytes gauge\n", "carpool_gpu_pool_bytes{device=\"0\"} 1048576\n",
        "carpool_gpu_pool_bytes{device=\"3\"} 0\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "in\n" << text;
  }
}

}  // namespace
}  // namespace carpool
