// The control plane and the client together, with real processes (fork), unix sockets and shared
// memory. The server runs TestJobService (deterministic batches) in a child process.
#include "server/control_plane.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "carpool/carpool.h"
#include "carpool/client.h"
#include "protocol/protocol.h"
#include "tests/test_job_service.h"

namespace carpool {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The integer "key" of a JSON object, or -1 if absent or not an integer.
int64_t JsonInt(const std::string& json, const std::string& key) {
  const nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return -1;
  const auto it = doc.find(key);
  return it != doc.end() && it->is_number_integer() ? it->get<int64_t>() : -1;
}

std::string TestSocketPath(const char* tag) {
  return fmt::format("/tmp/carpool-cp-test-{}-{}.sock", ::getpid(), tag);
}

// A carpool control plane over TestJobService in a child process; SIGTERM stops it cleanly.
class ServerProcess {
 public:
  ServerProcess(const char* tag, std::chrono::milliseconds lease) : path_(TestSocketPath(tag)) {
    instance_ = fmt::format("t{}{}", ::getpid(), tag);
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::sigprocmask(SIG_BLOCK, &term, nullptr);  // before any thread starts
      TestJobService service(instance_);
      ControlPlaneOptions o;
      o.socket_path = path_;
      o.instance = instance_;
      o.lease = lease;
      o.max_batch_size = 1024;
      o.max_prefetch = 8;
      auto plane = ControlPlane::Start(o, &service);
      if (!plane.ok()) ::_exit(3);
      int sig = 0;
      sigwait(&term, &sig);
      (*plane)->Stop();
      ::_exit(0);
    }
  }
  // Stops the server cleanly (SIGTERM: every job removed), or kills it after 2 s; then removes
  // what a killed server leaves behind.
  ~ServerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGCONT);
      ::kill(pid_, SIGTERM);
      int status = 0;
      auto deadline = Clock::now() + 2s;
      while (::waitpid(pid_, &status, WNOHANG) == 0) {
        if (Clock::now() > deadline) {
          ::kill(pid_, SIGKILL);
          ::waitpid(pid_, &status, 0);
          break;
        }
        std::this_thread::sleep_for(5ms);
      }
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "server did not stop cleanly";
      EXPECT_EQ(BatchPool::RemoveStaleSegments(instance_), 0) << "a clean stop removes all";
    }
    BatchPool::RemoveStaleSegments(instance_);
    ::unlink(path_.c_str());
  }
  // Waits until the server answers; returns a connected client.
  std::unique_ptr<Client> WaitForClient() {
    for (auto deadline = Clock::now() + 5s; Clock::now() < deadline;) {
      auto c = Client::Connect(path_);
      if (c.ok()) return std::move(*c);
      std::this_thread::sleep_for(10ms);
    }
    ADD_FAILURE() << "server did not come up at " << path_;
    return nullptr;
  }
  void Signal(int sig) { ::kill(pid_, sig); }
  pid_t pid() const { return pid_; }
  void KillAndReap() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  const std::string& path() const { return path_; }
  const std::string& instance() const { return instance_; }

 private:
  std::string path_;
  std::string instance_;
  pid_t pid_ = -1;
};

JobOptions Digits(uint32_t batch, uint32_t epochs, uint32_t prefetch) {
  JobOptions o;
  o.dataset = "digits";
  o.batch_size = batch;
  o.epochs = epochs;
  o.prefetch = prefetch;
  o.silence_timeout = 2s;
  return o;
}

TEST(ControlPlaneTest, DeliversEveryEpochInBatchesZeroCopy) {
  ServerProcess server("epochs", 2000ms);
  auto client = server.WaitForClient();
  ASSERT_TRUE(client);
  EXPECT_EQ(client->server_instance(), server.instance());
  auto job = client->CreateJob(Digits(8, 2, 3));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ((*job)->dataset_size(), 50u);
  EXPECT_EQ((*job)->batches_per_epoch(), 7u);
  EXPECT_EQ((*job)->sample_shape(), (std::vector<int64_t>{2, 2, 1}));
  std::vector<std::vector<int>> seen(2, std::vector<int>(50, 0));
  uint64_t batches = 0;
  for (;;) {
    auto batch = (*job)->Next();
    ASSERT_TRUE(batch.ok()) << batch.status().ToString();
    if (!batch->has_value()) break;
    const Batch& b = **batch;
    ASSERT_LT(b.epoch(), 2u);
    EXPECT_EQ(b.index(), batches % 7);
    EXPECT_EQ(b.size(), b.index() == 6 ? 2u : 8u) << "last batch is partial without drop_last";
    EXPECT_EQ(b.images().shape, (std::vector<int64_t>{b.size(), 2, 2, 1}));
    EXPECT_EQ(b.images().dtype, DType::kUint8);
    const auto* px = static_cast<const uint8_t*>(b.images().data);
    for (uint32_t i = 0; i < b.size(); ++i) {
      uint32_t id = b.sample_ids()[i];
      ASSERT_LT(id, 50u);
      seen[b.epoch()][id] += 1;
      EXPECT_EQ(b.labels()[i], static_cast<int32_t>(id % 10));
      for (uint32_t k = 0; k < 4; ++k) ASSERT_EQ(px[i * 4 + k], TestImageByte(id, b.epoch(), k));
    }
    ++batches;
  }
  EXPECT_EQ(batches, 14u);
  for (const auto& epoch : seen) EXPECT_EQ(epoch, std::vector<int>(50, 1));
  auto again = (*job)->Next();
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value()) << "stays at end of data";

  auto dropped = client->CreateJob([] {
    JobOptions o = Digits(8, 1, 2);
    o.drop_last = true;
    return o;
  }());
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ((*dropped)->batches_per_epoch(), 6u);
}

TEST(ControlPlaneTest, ServerNeverExceedsTheJobsCredits) {
  ServerProcess server("credits", 2000ms);
  auto client = server.WaitForClient();
  ASSERT_TRUE(client);
  auto job = client->CreateJob(Digits(5, 1, 3));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  std::vector<Batch> held;
  for (int i = 0; i < 3; ++i) {
    auto b = (*job)->Next();
    ASSERT_TRUE(b.ok() && b->has_value());
    held.push_back(std::move(**b));
  }
  std::this_thread::sleep_for(300ms);  // ample time for the producer to overrun, were it able to
  auto stats = (*job)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(JsonInt(*stats, "delivered"), 3) << *stats;
  EXPECT_EQ(JsonInt(*stats, "unreleased"), 3) << *stats;
  held.erase(held.begin());  // one release = one credit
  auto next = (*job)->Next();
  ASSERT_TRUE(next.ok() && next->has_value());
  EXPECT_EQ((**next).index(), 3u);
  held.clear();
  next->reset();
  uint32_t count = 4;
  for (;;) {
    auto b = (*job)->Next();
    ASSERT_TRUE(b.ok());
    if (!b->has_value()) break;
    ++count;
  }
  EXPECT_EQ(count, 10u);
  stats = (*job)->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_LE(JsonInt(*stats, "max_unreleased"), 3) << *stats;
}

TEST(ControlPlaneTest, BadRequestsGetClearErrorsAndTheConnectionSurvives) {
  ServerProcess server("badreq", 2000ms);
  auto client = server.WaitForClient();
  ASSERT_TRUE(client);
  JobOptions o = Digits(8, 1, 2);
  o.dataset = "nope";
  auto r = client->CreateJob(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("known: digits"), std::string::npos);
  o = Digits(5000, 1, 2);
  r = client->CreateJob(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("batch size 5000"), std::string::npos);
  o = Digits(8, 1, 9);
  r = client->CreateJob(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("prefetch 9"), std::string::npos);
  o = Digits(0, 1, 2);
  EXPECT_EQ(client->CreateJob(o).status().code(), StatusCode::kInvalidArgument);
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(JsonInt(*stats, "active_jobs"), 0) << "failed creations leave nothing behind";
}

// Reads frames from a raw socket until EOF; returns the decoded messages.
std::vector<protocol::Message> ReadUntilEof(int fd) {
  std::vector<uint8_t> bytes;
  uint8_t buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    bytes.insert(bytes.end(), buf, buf + n);
  }
  std::vector<protocol::Message> out;
  size_t pos = 0;
  while (bytes.size() - pos >= protocol::kFrameHeaderBytes) {
    auto h = protocol::DecodeFrameHeader(std::span(bytes).subspan(pos));
    if (!h.ok()) break;
    size_t end = pos + protocol::kFrameHeaderBytes + h->payload_bytes;
    if (end > bytes.size()) break;
    auto m = protocol::DecodeFrame(std::span(bytes).subspan(pos, end - pos));
    if (m.ok()) out.push_back(*m);
    pos = end;
  }
  return out;
}

int RawConnect(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

TEST(ControlPlaneTest, MalformedFramesGetAnErrorAndCloseOnlyThatConnection) {
  ServerProcess server("malformed", 2000ms);
  auto client = server.WaitForClient();
  ASSERT_TRUE(client);
  auto job = client->CreateJob(Digits(5, 3, 2));
  ASSERT_TRUE(job.ok());
  auto first = (*job)->Next();
  ASSERT_TRUE(first.ok() && first->has_value());

  std::vector<uint8_t> hello = *protocol::EncodeFrame(protocol::Hello{1, "raw"});
  std::vector<uint8_t> garbage = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<uint8_t> oversized = *protocol::EncodeFrame(protocol::Heartbeat{});
  oversized[10] = 0x7f;  // length ~ 8 MiB
  std::vector<uint8_t> unknown = *protocol::EncodeFrame(protocol::Heartbeat{});
  unknown[6] = 99;
  std::vector<uint8_t> server_only = *protocol::EncodeFrame(protocol::EndOfData{1, 1});
  std::vector<uint8_t> truncated = *protocol::EncodeFrame(protocol::Release{1, 2, 3});
  truncated[8] = 4;  // declares 4 payload bytes, which cannot hold a release
  truncated.resize(protocol::kFrameHeaderBytes + 4);
  for (const auto* bad : {&garbage, &oversized, &unknown, &server_only, &truncated}) {
    int fd = RawConnect(server.path());
    std::vector<uint8_t> send = hello;
    send.insert(send.end(), bad->begin(), bad->end());
    ASSERT_EQ(::send(fd, send.data(), send.size(), MSG_NOSIGNAL), static_cast<ssize_t>(send.size()));
    std::vector<protocol::Message> got = ReadUntilEof(fd);  // EOF: the server closed it
    ::close(fd);
    ASSERT_EQ(got.size(), 2u);
    EXPECT_TRUE(std::holds_alternative<protocol::HelloReply>(got[0]));
    auto* err = std::get_if<protocol::Error>(&got[1]);
    ASSERT_NE(err, nullptr);
    EXPECT_EQ(err->code, StatusCode::kInvalidArgument);
    EXPECT_FALSE(err->message.empty());
  }
  {  // No hello first.
    int fd = RawConnect(server.path());
    std::vector<uint8_t> hb = *protocol::EncodeFrame(protocol::Heartbeat{});
    ASSERT_GT(::send(fd, hb.data(), hb.size(), MSG_NOSIGNAL), 0);
    auto got = ReadUntilEof(fd);
    ::close(fd);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_NE(std::get<protocol::Error>(got[0]).message.find("first frame must be hello"),
              std::string::npos);
  }
  first->reset();
  uint32_t batches = 1;
  for (;;) {  // the well-behaved job is unaffected
    auto b = (*job)->Next();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    if (!b->has_value()) break;
    ++batches;
  }
  EXPECT_EQ(batches, 30u);
}

// Forks a client that creates a job, takes one batch, reports its segment name and waits.
pid_t ForkJobHolder(const std::string& path, int report_fd) {
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  auto client = Client::Connect(path);
  if (!client.ok()) ::_exit(2);
  auto job = (*client)->CreateJob(Digits(5, 1, 2));
  if (!job.ok()) ::_exit(3);
  auto batch = (*job)->Next();
  if (!batch.ok() || !batch->has_value()) ::_exit(4);
  std::string line = fmt::format("{}\n", (*job)->id());
  if (::write(report_fd, line.data(), line.size()) < 0) ::_exit(5);
  for (;;) ::pause();
}

void ExpectJobRemovedWithinLease(ServerProcess& server, Client& client, int signal) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t holder = ForkJobHolder(server.path(), fds[1]);
  char buf[32] = {};
  ASSERT_GT(::read(fds[0], buf, sizeof(buf) - 1), 0);
  ::close(fds[0]);
  ::close(fds[1]);
  ASSERT_GT(std::stoull(buf), 0u);
  const std::string server_fds = fmt::format("/proc/{}/fd", server.pid());
  ASSERT_EQ(BatchPool::SegmentLinks(server_fds, server.instance()).size(), 1u)
      << "the server holds the job's batch segment";
  ASSERT_EQ(JsonInt(*client.Stats(), "active_jobs"), 1);

  auto t0 = Clock::now();
  ::kill(holder, signal);
  int64_t active = 1;
  while (active != 0 && Clock::now() - t0 < 5s) {
    std::this_thread::sleep_for(20ms);
    active = JsonInt(*client.Stats(), "active_jobs");
  }
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  EXPECT_EQ(active, 0);
  EXPECT_LT(took, 300ms + 700ms) << "lease is 300 ms";
  EXPECT_EQ(BatchPool::SegmentLinks(server_fds, server.instance()).size(), 0u)
      << "the job's slots (segment) must be returned";
  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
}

TEST(ControlPlaneTest, KilledClientsJobIsRemovedWithinTheLease) {
  ServerProcess server("kill", 300ms);
  auto client = server.WaitForClient();
  ASSERT_TRUE(client);
  ExpectJobRemovedWithinLease(server, *client, SIGKILL);  // connection closes
  ExpectJobRemovedWithinLease(server, *client, SIGSTOP);  // connection open, heartbeats stop
  EXPECT_EQ(JsonInt(*client->Stats(), "removed_jobs"), 2);
}

TEST(ControlPlaneTest, ServerGoneOrHungGivesUnavailableQuickly) {
  {
    ServerProcess server("gone", 2000ms);
    auto client = server.WaitForClient();
    ASSERT_TRUE(client);
    auto job = client->CreateJob(Digits(5, 1, 1));
    ASSERT_TRUE(job.ok());
    auto b = (*job)->Next();
    ASSERT_TRUE(b.ok() && b->has_value());
    server.KillAndReap();
    auto t0 = Clock::now();
    auto next = (*job)->Next();
    ASSERT_FALSE(next.ok());
    EXPECT_EQ(next.status().code(), StatusCode::kUnavailable) << next.status().ToString();
    EXPECT_LT(Clock::now() - t0, 1s);
    EXPECT_EQ((*job)->Stats().status().code(), StatusCode::kUnavailable);
    EXPECT_EQ(client->CreateJob(Digits(5, 1, 1)).status().code(), StatusCode::kUnavailable);
    EXPECT_EQ(Client::Connect(server.path()).status().code(), StatusCode::kUnavailable);
  }
  {
    ServerProcess server("hung", 2000ms);
    auto client = server.WaitForClient();
    ASSERT_TRUE(client);
    JobOptions o = Digits(5, 1, 1);
    o.silence_timeout = 600ms;
    auto job = client->CreateJob(o);
    ASSERT_TRUE(job.ok());
    auto b = (*job)->Next();
    ASSERT_TRUE(b.ok() && b->has_value());
    server.Signal(SIGSTOP);
    auto t0 = Clock::now();
    auto next = (*job)->Next();  // blocked: one credit, held by b; then the server stops talking
    EXPECT_EQ(next.status().code(), StatusCode::kUnavailable) << next.status().ToString();
    EXPECT_LT(Clock::now() - t0, 2s);
    server.Signal(SIGCONT);
  }
}

TEST(ControlPlaneTest, CApiRunsAJob) {
  ServerProcess server("capi", 2000ms);
  ASSERT_TRUE(server.WaitForClient());
  carpool_client* client = nullptr;
  ASSERT_EQ(carpool_connect(server.path().c_str(), &client), CARPOOL_OK) << carpool_last_error();
  carpool_job_options o{};
  o.dataset = "tiny";
  o.batch_size = 2;
  o.epochs = 2;
  carpool_job* job = nullptr;
  ASSERT_EQ(carpool_job_create(client, &o, &job), CARPOOL_OK) << carpool_last_error();
  carpool_job_info info;
  ASSERT_EQ(carpool_job_info_get(job, &info), CARPOOL_OK);
  EXPECT_EQ(info.batches_per_epoch, 3u);
  EXPECT_EQ(info.sample_rank, 3u);
  uint32_t samples = 0;
  for (;;) {
    carpool_batch* b = nullptr;
    ASSERT_EQ(carpool_job_next(job, &b), CARPOOL_OK) << carpool_last_error();
    if (b == nullptr) break;
    int64_t dims[4];
    ASSERT_EQ(carpool_batch_image_shape(b, dims, 4), 4u);
    EXPECT_EQ(dims[0], carpool_batch_size(b));
    for (uint32_t i = 0; i < carpool_batch_size(b); ++i) {
      EXPECT_EQ(carpool_batch_labels(b)[i], static_cast<int32_t>(carpool_batch_sample_ids(b)[i]));
    }
    samples += carpool_batch_size(b);
    carpool_batch_free(b);
  }
  EXPECT_EQ(samples, 10u);
  char* json = nullptr;
  ASSERT_EQ(carpool_job_stats(job, &json), CARPOOL_OK);
  EXPECT_NE(std::string(json).find("\"delivered\":6"), std::string::npos) << json;
  carpool_string_free(json);
  carpool_job_free(job);
  carpool_client_free(client);
  carpool_client* none = nullptr;
  EXPECT_EQ(carpool_connect("/tmp/carpool-no-such.sock", &none), CARPOOL_UNAVAILABLE);
  EXPECT_NE(std::string(carpool_last_error()).find("/tmp/carpool-no-such.sock"), std::string::npos);
}

TEST(ControlPlaneTest, SocketFileIsPrivateStaleOnesAreReplacedLiveOnesKept) {
  std::string path = TestSocketPath("sock");
  TestJobService service("sock");
  ControlPlaneOptions o;
  o.socket_path = path;
  o.instance = "sock";
  {  // a stale socket file: bound, never listened
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ::close(fd);
  }
  auto plane = ControlPlane::Start(o, &service);
  ASSERT_TRUE(plane.ok()) << plane.status().ToString();
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto second = ControlPlane::Start(o, &service);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("already listening"), std::string::npos);
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << "a refused start must not remove the live socket";
  EXPECT_TRUE(Client::Connect(path).ok());
  (*plane)->Stop();
  EXPECT_NE(::stat(path.c_str(), &st), 0);
  std::string file = path + ".txt";
  FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  o.socket_path = file;
  auto on_file = ControlPlane::Start(o, &service);
  ASSERT_FALSE(on_file.ok());
  EXPECT_NE(on_file.status().message().find("not a socket"), std::string::npos);
  ::unlink(file.c_str());
}

}  // namespace
}  // namespace carpool
