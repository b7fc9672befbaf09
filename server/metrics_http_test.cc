#include "server/metrics_http.h"

#include <gtest/gtest.h>

#include <string>

#include "server/metrics_text.h"

namespace carpool {
namespace {

TEST(MetricsHttpTest, ParsesHostPort) {
  Result<MetricsAddress> v4 = ParseMetricsAddress("127.0.0.1:9464");
  ASSERT_TRUE(v4.ok()) << v4.status().message();
  EXPECT_EQ(v4->host, "127.0.0.1");
  EXPECT_EQ(v4->port, 9464);
  Result<MetricsAddress> v6 = ParseMetricsAddress("[::1]:80");
  ASSERT_TRUE(v6.ok()) << v6.status().message();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 80);
}

TEST(MetricsHttpTest, BadAddressErrorNamesTheValue) {
  for (const char* bad : {"9464", "127.0.0.1", "127.0.0.1:", ":9464", "127.0.0.1:http",
                          "127.0.0.1:65536", "::1:9464", "nohost:9464", "1.2.3.4:-1"}) {
    Result<MetricsAddress> r = ParseMetricsAddress(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(std::string("\"") + bad + "\""), std::string::npos)
        << r.status().message();
  }
}

TEST(MetricsHttpTest, AnswersGetMetricsOnly) {
  int renders = 0;
  const auto render = [&] {
    ++renders;
    return std::string("carpool_jobs 0\n");
  };
  MetricsReply ok = AnswerMetricsRequest("GET", "/metrics", render);
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.content_type, kPrometheusContentType);
  EXPECT_EQ(ok.body, "carpool_jobs 0\n");
  EXPECT_EQ(AnswerMetricsRequest("GET", "/metrics?name[]=x", render).status, 200);
  EXPECT_EQ(AnswerMetricsRequest("GET", "/", render).status, 404);
  EXPECT_EQ(AnswerMetricsRequest("GET", "/metricsx", render).status, 404);
  EXPECT_EQ(AnswerMetricsRequest("POST", "/metrics", render).status, 405);
  EXPECT_EQ(AnswerMetricsRequest("DELETE", "/metrics", render).status, 405);
  EXPECT_EQ(renders, 2);
}

TEST(MetricsHttpTest, SecondListenerOnABusyPortFailsNamingTheAddress) {
  Result<std::unique_ptr<MetricsListener>> first =
      MetricsListener::Start({"127.0.0.1", 0}, [] { return std::string(); });
  ASSERT_TRUE(first.ok()) << first.status().message();
  const uint16_t port = (*first)->port();
  ASSERT_NE(port, 0);
  Result<std::unique_ptr<MetricsListener>> second =
      MetricsListener::Start({"127.0.0.1", port}, [] { return std::string(); });
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << second.status().message();
  (*first)->Stop();
  (*first)->Stop();  // idempotent
}

}  // namespace
}  // namespace carpool
