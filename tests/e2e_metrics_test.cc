// `carpool server --metrics`: a real server and job, scraped with curl, the text parsed by the
// Prometheus client's parser (tests/parse_metrics.py), the numbers checked against
// `carpool status --json`; and the flag's errors (a bad address, a port in use).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "tests/e2e_util.h"

namespace carpool::e2e {
namespace {

constexpr char kCurl[] = "/usr/bin/curl";
constexpr char kPython[] = "/usr/bin/python3";

// A listening TCP socket on 127.0.0.1 and a kernel-chosen port; closed by the destructor.
struct PortHolder {
  PortHolder() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd, 1) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ADD_FAILURE() << "cannot bind a loopback port";
    }
    port = ntohs(a.sin_port);
  }
  ~PortHolder() { Close(); }
  void Close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  int fd = -1;
  uint16_t port = 0;
};

// Runs argv (argv[0] a path) to completion, its output in the env's directory under `name`.
CliResult RunTool(E2eEnv& env, const std::vector<std::string>& argv, const std::string& name) {
  return env.Wait(SpawnProcess(argv, env.dir() / (name + ".out"), env.dir() / (name + ".err")),
                  name);
}

// The value of the sample line `sample ` (name and labels exactly) in parse_metrics.py's output.
double Sample(const std::string& parsed, const std::string& sample) {
  const std::string key = "\n" + sample + " ";
  const size_t at = ("\n" + parsed).find(key);
  if (at == std::string::npos) return NAN;
  return std::stod(parsed.substr(at + key.size() - 1));
}

TEST(E2eMetricsTest, ScrapeAgreesWithStatusAndParses) {
  if (access(kCurl, X_OK) != 0) GTEST_SKIP() << kCurl << " missing; run scripts/setup.sh";
  E2eEnv env;
  const fs::path images = env.dir() / "images";
  env.GenImages(images, 48, "32x32");
  env.Dataset({"add", "tiny", "--dir", images.string()});
  PortHolder free_port;
  free_port.Close();
  const std::string port = std::to_string(free_port.port);
  env.StartServer({"--metrics", "127.0.0.1:" + port});
  const std::string url = "http://127.0.0.1:" + port;
  // Two epochs: the second reads the cache, so hits are non-zero.
  CliResult job = env.Wait(
      env.Consume({"--dataset", "tiny", "--batch-size", "8", "--epochs", "2"}, "job"), "job");
  ASSERT_EQ(job.code, 0) << job.err;

  const std::string status = env.Status();
  ASSERT_FALSE(status.empty());
  const fs::path scrape = env.dir() / "scrape.txt";
  CliResult curl = RunTool(env,
                           {kCurl, "-s", "-o", scrape.string(), "-w",
                            "%{http_code} %{content_type}", url + "/metrics"},
                           "curl");
  ASSERT_EQ(curl.code, 0) << curl.err;
  EXPECT_EQ(curl.out, "200 text/plain; version=0.0.4; charset=utf-8");
  const std::string text = Slurp(scrape);
  EXPECT_NE(text.find("# TYPE carpool_deliveries_total counter\n"), std::string::npos) << text;

  CliResult parse = RunTool(env, {kPython, CARPOOL_PARSE_METRICS, scrape.string()}, "parse");
  if (parse.code == 77) GTEST_SKIP() << parse.err;
  ASSERT_EQ(parse.code, 0) << parse.err << "\n" << text;
  const std::string& p = parse.out;
  EXPECT_NE(p.find("TYPE carpool_deliveries counter\n"), std::string::npos) << p;
  EXPECT_NE(p.find("TYPE carpool_cache_bytes_used gauge\n"), std::string::npos) << p;
  EXPECT_EQ(Sample(p, "carpool_deliveries_total{}"), 96) << p;
  EXPECT_EQ(Sample(p, "carpool_deliveries_total{}"), JsonNumber(status, "deliveries"));
  EXPECT_EQ(Sample(p, "carpool_preparations_total{kind=cached}"),
            JsonNumber(status, "cached_preparations"))
      << p << status;
  EXPECT_EQ(Sample(p, "carpool_preparations_total{kind=transient}"),
            JsonNumber(status, "transient_preparations"));
  EXPECT_EQ(Sample(p, "carpool_preparations_total{kind=cached}") +
                Sample(p, "carpool_preparations_total{kind=transient}"),
            JsonNumber(status, "preparations"));
  EXPECT_GT(JsonNumber(status, "hits"), 0) << status;
  EXPECT_EQ(Sample(p, "carpool_cache_hits_total{}"), JsonNumber(status, "hits")) << p << status;
  EXPECT_EQ(Sample(p, "carpool_cache_misses_total{}"), JsonNumber(status, "misses"));

  // Other paths and methods.
  CliResult missing =
      RunTool(env, {kCurl, "-s", "-o", "/dev/null", "-w", "%{http_code}", url + "/"}, "c404");
  EXPECT_EQ(missing.out, "404");
  CliResult post = RunTool(
      env, {kCurl, "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", url + "/metrics"},
      "c405");
  EXPECT_EQ(post.out, "405");
  env.StopServer(SIGTERM);  // exits 0 with the listener running
  CliResult gone = RunTool(env, {kCurl, "-s", url + "/metrics"}, "gone");
  EXPECT_NE(gone.code, 0) << "the listener outlived the server";
}

TEST(E2eMetricsTest, BadAddressAndBusyPortAreOneLineErrorsNamingTheValue) {
  E2eEnv env;
  fs::create_directories(env.state());
  CliResult bad = env.Run({"server", "--state-dir", env.state().string(), "--metrics",
                           "localhost-9464"},
                          "bad");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("\"localhost-9464\" is not HOST:PORT"), std::string::npos) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;

  PortHolder busy;
  const std::string address = "127.0.0.1:" + std::to_string(busy.port);
  CliResult taken =
      env.Run({"server", "--state-dir", env.state().string(), "--metrics", address}, "taken");
  EXPECT_EQ(taken.code, 1);
  EXPECT_NE(taken.err.find("--metrics " + address + ": cannot bind"), std::string::npos)
      << taken.err;
}

}  // namespace
}  // namespace carpool::e2e
