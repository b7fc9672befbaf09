// The C++ client against a fake server on a real unix socket: a job-info must come with its batch
// segment's fd (protocol v5), and a client told of a job without one fails at once with an error
// that names the frame, rather than mapping anything by name.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "carpool/client.h"
#include "common/unique_fd.h"
#include "datasets/temp_dir_for_test.h"
#include "protocol/protocol.h"
#include "protocol/segment_fd.h"

namespace carpool {
namespace {

bool ReadAll(int fd, uint8_t* data, size_t n) {
  for (size_t done = 0; done < n;) {
    const ssize_t r = ::recv(fd, data + done, n - done, 0);
    if (r <= 0) return false;
    done += static_cast<size_t>(r);
  }
  return true;
}

// One frame from the client; nullopt when it closed the connection.
std::optional<protocol::Message> ReadFrame(int fd) {
  uint8_t header[protocol::kFrameHeaderBytes];
  if (!ReadAll(fd, header, sizeof(header))) return std::nullopt;
  auto h = protocol::DecodeFrameHeader(header);
  if (!h.ok()) return std::nullopt;
  std::vector<uint8_t> payload(h->payload_bytes);
  if (!ReadAll(fd, payload.data(), payload.size())) return std::nullopt;
  auto m = protocol::DecodePayload(h->type, payload);
  return m.ok() ? std::optional<protocol::Message>(*m) : std::nullopt;
}

void Send(int fd, const protocol::Message& m, const std::vector<int>& fds) {
  std::vector<uint8_t> frame = *protocol::EncodeFrame(m);
  if (fds.empty()) {
    ASSERT_EQ(::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(frame.size()));
  } else {
    ASSERT_EQ(protocol::SendWithFds(fd, frame.data(), frame.size(), fds),
              static_cast<ssize_t>(frame.size()));
  }
}

protocol::JobInfo OneSlotJob() {
  return protocol::JobInfo{.job_id = 1,
                           .dataset_size = 4,
                           .batches_per_epoch = 1,
                           .batch_size = 4,
                           .epochs = 1,
                           .sample_shape = {2, 2, 1},
                           .segment_name = "carpool-fake-job-1",
                           .slot_count = 1,
                           .slot_bytes = 4096};
}

// Serves `connections` connections one after another: hello-reply to hello, then the job-info
// with `fds` attached to create-job, until the client leaves.
class FakeServer {
 public:
  FakeServer(const std::string& path, int connections, std::vector<int> fds)
      : listener_(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size());
    EXPECT_EQ(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listener_.get(), 4), 0);
    thread_ = std::thread([this, connections, fds] {
      for (int i = 0; i < connections; ++i) {
        UniqueFd c(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (!c.valid()) return;
        while (std::optional<protocol::Message> m = ReadFrame(c.get())) {
          if (std::holds_alternative<protocol::Hello>(*m)) {
            Send(c.get(), protocol::HelloReply{"fake", 2000, protocol::kMaxPayloadBytes, 64, 8},
                 {});
          } else if (std::holds_alternative<protocol::CreateJob>(*m)) {
            Send(c.get(), OneSlotJob(), fds);
          }
        }
      }
    });
  }
  ~FakeServer() {
    ::shutdown(listener_.get(), SHUT_RDWR);  // wakes an accept for a connection that never came
    thread_.join();
  }

 private:
  UniqueFd listener_;
  std::thread thread_;
};

// What Client::CreateJob says when the server answers with a job-info carrying `fds`.
Status CreateJobAgainstFakeServer(const std::vector<int>& fds) {
  TempDirForTest dir;
  const std::string path = (dir.path() / "fake.sock").string();
  FakeServer server(path, 2, fds);  // Connect's handshake, then CreateJob's connection
  auto client = Client::Connect(path);
  if (!client.ok()) return client.status();
  JobOptions o;
  o.dataset = "fake";
  o.batch_size = 4;
  return (*client)->CreateJob(o).status();
}

TEST(ClientSegmentFdTest, JobInfoWithoutItsSegmentIsAClearError) {
  Status s = CreateJobAgainstFakeServer({});
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("the job-info frame came without its batch segment"),
            std::string::npos)
      << s.message();
}

// A real segment attached: the client maps it and checks its header, so a segment that is not a
// batch segment is refused by its contents, not trusted.
TEST(ClientSegmentFdTest, TheAttachedSegmentIsMappedAndChecked) {
  UniqueFd segment(::memfd_create("carpool-fake-job-1", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(segment.get(), 1 << 20), 0);
  Status s = CreateJobAgainstFakeServer({segment.get()});
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("batch segment carpool-fake-job-1 header (magic 0x0000"),
            std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace carpool
