// The server's side of GPU decode in a job's process (server/job_decode.h) over a real socket: the
// session puts a work's JPEG bytes in a memfd the client maps, sends the work, and waits for the
// answer; any failure, a missed deadline or a closed connection turns the job's decoding off
// for good, and the build goes on without it. The client here is a raw FrameSocket playing the
// job's process, so no GPU is needed.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <future>
#include <thread>

#include "client/frame_socket.h"
#include "protocol/protocol.h"
#include "protocol/segment_fd.h"
#include "server/control_plane.h"
#include "tests/test_job_service.h"

namespace carpool {
namespace {

using namespace std::chrono_literals;

class JobDecodeSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = fmt::format("/tmp/carpool-jd-test-{}-{}.sock", ::getpid(), counter_++);
    service_ = std::make_unique<TestJobService>(fmt::format("jd{}x{}", ::getpid(), counter_));
    ControlPlaneOptions o;
    o.socket_path = path_;
    o.instance = fmt::format("jd{}x{}", ::getpid(), counter_);
    o.lease = 5000ms;
    auto plane = ControlPlane::Start(o, service_.get());
    ASSERT_TRUE(plane.ok()) << plane.status().ToString();
    plane_ = std::move(*plane);
  }
  void TearDown() override {
    socket_.reset();
    if (plane_) plane_->Stop();
    // The session (sink_, and the service's reference) before the plane: its timer belongs to the
    // plane's io_context (ASan: heap-use-after-free in ~Session when the plane went first).
    sink_.reset();
    service_.reset();
  }

  // Connects as a job on "digits" that offers (or not) to decode; returns its job id.
  uint64_t Join(bool offer) {
    auto socket = FrameSocket::Connect(path_, 2000ms);
    EXPECT_TRUE(socket.ok()) << socket.status().ToString();
    socket_ = std::move(*socket);
    auto hello =
        socket_->Call(protocol::Hello{static_cast<uint32_t>(::getpid()), "jd-test"}, 2000ms);
    EXPECT_TRUE(hello.ok()) << hello.status().ToString();
    protocol::CreateJob create;
    create.dataset = "digits";
    create.batch_size = 10;
    create.epochs = 1;
    create.prefetch = 2;
    create.device = "cpu";
    create.decode_in_job = offer;
    auto reply = socket_->Call(create, 2000ms);
    EXPECT_TRUE(reply.ok()) << reply.status().ToString();
    auto* info = std::get_if<protocol::JobInfo>(&reply->message);
    EXPECT_NE(info, nullptr);
    EXPECT_EQ(info->decode_in_job, offer);
    return info->job_id;
  }

  // The next frame of one of the decode types (batches and heartbeats in between are skipped).
  ReceivedFrame NextDecodeFrame() {
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < until) {
      auto frame = socket_->Receive(100ms);
      EXPECT_TRUE(frame.ok()) << frame.status().ToString();
      if (!frame.ok() || !frame->has_value()) continue;
      const protocol::MessageType t = protocol::TypeOf((*frame)->message);
      if (t == protocol::MessageType::kDecodeSegment || t == protocol::MessageType::kDecodeWork) {
        return std::move(**frame);
      }
    }
    ADD_FAILURE() << "no decode frame within 5 s";
    return {};
  }

  static std::vector<std::vector<uint8_t>> Jpegs() {
    std::vector<std::vector<uint8_t>> jpegs;
    for (int i = 0; i < 3; ++i) {
      std::vector<uint8_t> b(1000 + 333 * i);
      for (size_t k = 0; k < b.size(); ++k) b[k] = static_cast<uint8_t>(k * 7 + i);
      jpegs.push_back(std::move(b));
    }
    return jpegs;
  }
  static std::vector<JobDecodeItem> Items(const std::vector<std::vector<uint8_t>>& jpegs) {
    std::vector<JobDecodeItem> items;
    uint64_t at = 0;
    for (const auto& j : jpegs) {
      items.push_back({j, 8, 8, 3, at});
      at += 256;
    }
    return items;
  }

  // Joins as a job that offers to decode; its decoder (the session, kept alive by sink_).
  JobDecoder* JoinDecoding() {
    job_ = Join(true);
    sink_ = service_->DecoderOf(job_);
    EXPECT_NE(sink_, nullptr);
    return sink_ ? sink_->job_decoder() : nullptr;
  }
  // Decode(items_) on another thread, as a build would.
  std::future<Result<JobDecodeResult>> StartDecode(JobDecoder* decoder,
                                                   std::chrono::milliseconds deadline) {
    return std::async(std::launch::async, [this, decoder, deadline] {
      return decoder->Decode("resize=8,crop=8,decode=gpu", items_, 768, deadline);
    });
  }
  // The first work, after its segment.
  protocol::DecodeWork FirstWork() {
    NextDecodeFrame();
    ReceivedFrame w = NextDecodeFrame();
    auto* work = std::get_if<protocol::DecodeWork>(&w.message);
    EXPECT_NE(work, nullptr);
    return work ? *work : protocol::DecodeWork{};
  }
  protocol::DecodeDone Answer(const protocol::DecodeWork& work) {
    protocol::DecodeDone done;
    done.job_id = job_;
    done.work_id = work.work_id;
    done.buffer_handle = std::string(protocol::kIpcHandleBytes, 'x');
    done.buffer_bytes = 2 << 20;
    return done;
  }

  static inline int counter_ = 0;
  const std::vector<std::vector<uint8_t>> jpegs_ = Jpegs();
  const std::vector<JobDecodeItem> items_ = Items(jpegs_);
  uint64_t job_ = 0;
  std::shared_ptr<JobSink> sink_;
  std::string path_;
  std::unique_ptr<TestJobService> service_;
  std::unique_ptr<ControlPlane> plane_;
  std::unique_ptr<FrameSocket> socket_;
  std::unique_ptr<protocol::SharedMapping> segment_;
};

TEST_F(JobDecodeSessionTest, AJobThatDoesNotOfferGetsNoDecoder) {
  const uint64_t job = Join(false);
  EXPECT_EQ(service_->DecoderOf(job), nullptr);
}

TEST_F(JobDecodeSessionTest, TheWorkCarriesTheBytesAndTheAnswerComesBack) {
  JobDecoder* decoder = JoinDecoding();
  ASSERT_NE(decoder, nullptr);
  EXPECT_TRUE(decoder->enabled());
  const uint64_t job = job_;
  const auto& jpegs = jpegs_;
  for (int round = 0; round < 2; ++round) {
    auto result = StartDecode(decoder, 2000ms);
    if (round == 0) {  // the segment comes once, before the first work
      ReceivedFrame seg = NextDecodeFrame();
      auto* s = std::get_if<protocol::DecodeSegment>(&seg.message);
      ASSERT_NE(s, nullptr);
      EXPECT_EQ(s->job_id, job);
      ASSERT_TRUE(seg.fd.valid());
      // Sealed: the job cannot shrink it under the server's copies (a SIGBUS in the server).
      EXPECT_NE(::ftruncate(seg.fd.get(), 0), 0);
      EXPECT_EQ(errno, EPERM);
      auto mapped = protocol::SharedMapping::Map(seg.fd.get(), s->bytes, "test");
      ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
      segment_ = std::move(*mapped);
    }
    ReceivedFrame w = NextDecodeFrame();
    auto* work = std::get_if<protocol::DecodeWork>(&w.message);
    ASSERT_NE(work, nullptr);
    EXPECT_EQ(work->job_id, job);
    EXPECT_EQ(work->prepare, "resize=8,crop=8,decode=gpu");
    // Two lanes of 768 bytes; consecutive works alternate between them.
    const uint64_t lane = round % 2;
    EXPECT_EQ(work->output_bytes, 2 * 768u);
    ASSERT_EQ(work->items.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      const protocol::DecodeItem& it = work->items[i];
      EXPECT_EQ(it.height, 8u);
      EXPECT_EQ(it.channels, 3u);
      EXPECT_EQ(it.dst_offset, lane * 768 + 256 * i);
      ASSERT_EQ(it.length, jpegs[i].size());
      ASSERT_LE(it.offset + it.length, segment_->size());
      EXPECT_EQ(0, std::memcmp(segment_->data() + it.offset, jpegs[i].data(), it.length))
          << "item " << i << " of round " << round;
    }
    protocol::DecodeDone done;
    done.job_id = job;
    done.work_id = work->work_id;
    done.buffer_handle = std::string(protocol::kIpcHandleBytes, static_cast<char>('a' + round));
    done.buffer_bytes = 2 << 20;
    done.failed = {1};
    ASSERT_TRUE(socket_->Send(done).ok());
    ASSERT_EQ(result.wait_for(3s), std::future_status::ready);
    Result<JobDecodeResult> r = result.get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->buffer_handle, done.buffer_handle);
    EXPECT_EQ(r->buffer_offset, lane * 768) << "the lane's first byte";
    EXPECT_EQ(r->buffer_bytes, done.buffer_bytes);
    EXPECT_EQ(r->failed, std::vector<uint32_t>{1});
    EXPECT_TRUE(decoder->enabled());
  }
}

// A job's next build sends its work while the previous one waits: two works outstanding, each in
// its own lane of the segment and of the job's buffer, answered in any order.
TEST_F(JobDecodeSessionTest, TwoWorksAreOutstandingAtOnceInTheirOwnLanes) {
  JobDecoder* decoder = JoinDecoding();
  ASSERT_NE(decoder, nullptr);
  Result<JobDecodeTicket> first = decoder->Send("resize=8,crop=8,decode=gpu", items_, 768);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  Result<JobDecodeTicket> second = decoder->Send("resize=8,crop=8,decode=gpu", items_, 768);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_NE(first->lane, second->lane);
  // A third while both lanes are taken: refused, and the job's decoding stays on.
  Result<JobDecodeTicket> third = decoder->Send("resize=8,crop=8,decode=gpu", items_, 768);
  EXPECT_EQ(third.status().code(), StatusCode::kFailedPrecondition) << third.status().ToString();
  EXPECT_TRUE(decoder->enabled());

  protocol::DecodeWork w1 = FirstWork();
  ReceivedFrame f2 = NextDecodeFrame();
  auto* w2 = std::get_if<protocol::DecodeWork>(&f2.message);
  ASSERT_NE(w2, nullptr);
  ASSERT_EQ(w1.items.size(), 3u);
  ASSERT_EQ(w2->items.size(), 3u);
  // The segment's lanes do not overlap, nor do the buffer's.
  const uint64_t end1 = w1.items.back().offset + w1.items.back().length;
  EXPECT_LE(end1, w2->items.front().offset);
  EXPECT_EQ(w1.items.front().dst_offset, 0u);
  EXPECT_EQ(w2->items.front().dst_offset, 768u);

  // Answered second first: each build gets its own work's answer.
  protocol::DecodeDone d2 = Answer(*w2);
  d2.buffer_handle = std::string(protocol::kIpcHandleBytes, 'b');
  protocol::DecodeDone d1 = Answer(w1);
  d1.buffer_handle = std::string(protocol::kIpcHandleBytes, 'a');
  ASSERT_TRUE(socket_->Send(d2).ok());
  ASSERT_TRUE(socket_->Send(d1).ok());
  Result<JobDecodeResult> r1 = decoder->Await(*first, 2000ms);
  Result<JobDecodeResult> r2 = decoder->Await(*second, 2000ms);
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(r1->buffer_handle, d1.buffer_handle);
  EXPECT_EQ(r2->buffer_handle, d2.buffer_handle);
  EXPECT_EQ(r1->buffer_offset, 0u);
  EXPECT_EQ(r2->buffer_offset, 768u);
  // Both lanes free again.
  Result<JobDecodeTicket> next = decoder->Send("resize=8,crop=8,decode=gpu", items_, 768);
  EXPECT_TRUE(next.ok()) << next.status().ToString();
}

// One work's failure turns the job's decoding off, and the build awaiting the other goes on at
// once instead of waiting out its deadline.
TEST_F(JobDecodeSessionTest, AFailureReleasesTheOtherOutstandingWorkAtOnce) {
  JobDecoder* decoder = JoinDecoding();
  ASSERT_NE(decoder, nullptr);
  Result<JobDecodeTicket> first = decoder->Send("resize=8,crop=8,decode=gpu", items_, 768);
  Result<JobDecodeTicket> second = decoder->Send("resize=8,crop=8,decode=gpu", items_, 768);
  ASSERT_TRUE(first.ok() && second.ok());
  auto later = std::async(std::launch::async, [&] {
    return decoder->Await(*second, std::chrono::milliseconds(20000));
  });
  const auto start = std::chrono::steady_clock::now();
  Result<JobDecodeResult> r1 = decoder->Await(*first, 300ms);  // never answered
  EXPECT_EQ(r1.status().code(), StatusCode::kUnavailable) << r1.status().ToString();
  EXPECT_FALSE(decoder->enabled());
  ASSERT_EQ(later.wait_for(3s), std::future_status::ready);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  Result<JobDecodeResult> r2 = later.get();
  EXPECT_EQ(r2.status().code(), StatusCode::kFailedPrecondition) << r2.status().ToString();
}

// A decoding job's process frees its decode buffer once the connection closes, and the server
// may still have the buffer mapped: after a bye the server removes the job (which unmaps it)
// first, and only then closes the connection.
TEST_F(JobDecodeSessionTest, AfterAByeTheJobIsRemovedBeforeTheConnectionCloses) {
  JoinDecoding();
  sink_.reset();  // the service's, not ours, keeps the session alive until RemoveJob
  service_->SetRemoveDelay(300ms);  // closing first would be seen: the removal comes late
  ASSERT_TRUE(socket_->Send(protocol::Bye{}).ok());
  const auto until = std::chrono::steady_clock::now() + 5s;
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() < until) {
    auto frame = socket_->Receive(100ms);
    closed = !frame.ok();
  }
  ASSERT_TRUE(closed) << "the server closes the connection after a bye";
  EXPECT_EQ(service_->Stats(0), R"({"active_jobs":0,"removed_jobs":1})");
}

TEST_F(JobDecodeSessionTest, AFailedAnswerTurnsTheJobsDecodingOffForGood) {
  JobDecoder* decoder = JoinDecoding();
  ASSERT_NE(decoder, nullptr);
  auto result = StartDecode(decoder, 2000ms);
  protocol::DecodeDone done = Answer(FirstWork());
  done.code = StatusCode::kUnavailable;
  done.message = "no nvJPEG in this process";
  done.buffer_handle.clear();
  ASSERT_TRUE(socket_->Send(done).ok());
  Result<JobDecodeResult> r = result.get();
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("no nvJPEG"), std::string::npos) << r.status().ToString();
  EXPECT_FALSE(decoder->enabled());
  // Nothing more is sent: the next call fails at once.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(decoder->Decode("resize=8,crop=8,decode=gpu", items_, 768, 2000ms).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 500ms);
}

TEST_F(JobDecodeSessionTest, AMissedDeadlineTurnsItOffAndALateAnswerIsIgnored) {
  JobDecoder* decoder = JoinDecoding();
  ASSERT_NE(decoder, nullptr);
  Result<JobDecodeResult> r = decoder->Decode("resize=8,crop=8,decode=gpu", items_, 768, 300ms);
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("within 300 ms"), std::string::npos) << r.status().ToString();
  EXPECT_FALSE(decoder->enabled());
  ASSERT_TRUE(socket_->Send(Answer(FirstWork())).ok());  // late: ignored, the connection stays
  ASSERT_TRUE(socket_->Send(protocol::Heartbeat{}).ok());
  auto echo = socket_->Receive(2000ms);
  EXPECT_TRUE(echo.ok()) << echo.status().ToString();
}

TEST_F(JobDecodeSessionTest, AClosedConnectionEndsTheWaitAtOnce) {
  JobDecoder* decoder = JoinDecoding();
  ASSERT_NE(decoder, nullptr);
  auto result = StartDecode(decoder, 20000ms);
  FirstWork();  // never answered
  const auto start = std::chrono::steady_clock::now();
  socket_.reset();  // the job's process goes away
  ASSERT_EQ(result.wait_for(5s), std::future_status::ready);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_FALSE(result.get().ok());
  EXPECT_FALSE(decoder->enabled());
}

TEST_F(JobDecodeSessionTest, AnAnswerForAnotherJobIsAProtocolViolation) {
  const uint64_t job = Join(true);
  protocol::DecodeDone done;
  done.job_id = job + 1;
  done.work_id = 1;
  done.buffer_handle = std::string(protocol::kIpcHandleBytes, 'x');
  ASSERT_TRUE(socket_->Send(done).ok());
  std::string error;  // the error frame the server closes with (batches may come first)
  const auto until = std::chrono::steady_clock::now() + 3s;
  while (error.empty() && std::chrono::steady_clock::now() < until) {
    auto frame = socket_->Receive(100ms);
    if (!frame.ok()) break;  // closed after the error
    if (!frame->has_value()) continue;
    if (auto* e = std::get_if<protocol::Error>(&(*frame)->message)) error = e->message;
  }
  EXPECT_NE(error.find("decode-done for job"), std::string::npos) << error;
}

}  // namespace
}  // namespace carpool
