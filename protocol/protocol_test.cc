#include "protocol/protocol.h"
#include "protocol/id_set.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

namespace carpool::protocol {
namespace {

JobInfo SampleJobInfo() {
  JobInfo m;
  m.job_id = 42;
  m.dataset_size = 60000;
  m.batches_per_epoch = 235;
  m.batch_size = 256;
  m.epochs = 3;
  m.sample_shape = {3, 224, 224};
  m.dtype = DType::kFloat16;
  m.layout = Layout::kNCHW;
  m.segment_name = "carpool-abc-job-42";
  m.slot_count = 4;
  m.slot_bytes = 77 << 20;
  return m;
}

BatchReady SampleBatchReady() {
  BatchReady m;
  m.job_id = 42;
  m.slot = 3;
  m.generation = 17;
  m.epoch = 1;
  m.batch_index = 99;
  m.sample_count = 10;
  m.images_offset = 0;
  m.images_bytes = 7840;
  m.labels_offset = 7872;
  m.labels_bytes = 40;
  m.ids_offset = 7936;
  m.ids_bytes = 40;
  m.skipped = 2;
  return m;
}

JobInfo SampleGpuJobInfo() {
  JobInfo m = SampleJobInfo();
  m.device = 1;
  m.device_handle = std::string(kIpcHandleBytes, '\x5a');
  m.device_pci_bus_id = "0000:1B:00.0";
  m.device_slot_stride = 77 << 20;
  m.device_slot_bytes = (77 << 20) - 256;
  m.device_offset = 512;
  return m;
}

BatchReady SampleGpuBatchReady() {
  BatchReady m = SampleBatchReady();
  m.on_device = true;
  m.device_labels_offset = 8192;
  return m;
}

std::vector<Message> OneOfEach() {
  return {Hello{1234, "trainer-7"},
          HelloReply{"inst-1", 2000, kMaxPayloadBytes, 65536, 64},
          CreateJob{"imagenet", 256, 2, "random_crop(224)|flip", "cuda:0", 4, true, 99, "", 0, 1, 0, 1},
          CreateJob{"imagenet", 64, 1, "", "cuda:1", 8, false, 7, "torchelastic-run-3", 1, 4, 2, 3},
          CreateJob{"fm", 32, 3, "", "cpu", 4, false, 5, "", 0, 1, 0, 1, 2, 17,
                    EncodeIdSet({3, 4, 5, 9, 100})},
          SampleJobInfo(),
          SampleGpuJobInfo(),
          SampleBatchReady(),
          SampleGpuBatchReady(),
          Release{42, 3, 17},
          Heartbeat{},
          StatsRequest{42},
          StatsReply{R"({"jobs": 1})"},
          Error{StatusCode::kNotFound, "dataset \"x\" not found"},
          EndOfData{42, 2},
          Bye{}};
}

TEST(ProtocolTest, EveryMessageRoundTrips) {
  std::vector<Message> all = OneOfEach();
  // job-info and batch-ready twice (CPU, GPU), create-job three times (one job, a rank of a DDP job, a resumed job)
  ASSERT_EQ(all.size(), size_t{kMaxMessageType} + 4);
  for (const Message& m : all) {
    auto frame = EncodeFrame(m);
    ASSERT_TRUE(frame.ok()) << frame.status().ToString();
    auto header = DecodeFrameHeader(*frame);
    ASSERT_TRUE(header.ok());
    EXPECT_EQ(header->type, TypeOf(m));
    EXPECT_EQ(header->payload_bytes, frame->size() - kFrameHeaderBytes);
    auto back = DecodeFrame(*frame);
    ASSERT_TRUE(back.ok()) << MessageTypeName(TypeOf(m)) << ": " << back.status().ToString();
    EXPECT_EQ(*back, m) << MessageTypeName(TypeOf(m));
  }
}

TEST(ProtocolTest, HeaderIsLittleEndian) {
  auto frame = EncodeFrame(Release{1, 2, 3});
  ASSERT_TRUE(frame.ok());
  const std::vector<uint8_t> expected = {'C', 'R', 'P', 'L', kProtocolVersion, 0, 6, 0, 20, 0, 0, 0};
  EXPECT_EQ(std::vector<uint8_t>(frame->begin(), frame->begin() + 12), expected);
  EXPECT_EQ((*frame)[12], 1);  // job_id low byte first
}

void ExpectRejected(const std::vector<uint8_t>& bytes, const std::string& needle) {
  auto r = DecodeFrame(bytes);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

TEST(ProtocolTest, RejectsBadHeaders) {
  std::vector<uint8_t> good = *EncodeFrame(Heartbeat{});
  auto bad_magic = good;
  bad_magic[0] ^= 0xff;
  ExpectRejected(bad_magic, "magic");
  auto bad_version = good;
  bad_version[4] = 1;  // version 1 (no device fields) is no longer spoken
  ExpectRejected(bad_version, "version 1");
  auto unknown = good;
  unknown[6] = 13;
  ExpectRejected(unknown, "unknown message type 13");
  unknown[6] = 0;
  ExpectRejected(unknown, "unknown message type 0");
  auto oversized = good;
  uint32_t big = kMaxPayloadBytes + 1;
  std::memcpy(&oversized[8], &big, 4);
  ExpectRejected(oversized, "exceeds the limit");
  ExpectRejected(std::vector<uint8_t>(good.begin(), good.begin() + 11), "frame header is 11");
}

TEST(ProtocolTest, RejectsTruncatedAndTrailingPayloads) {
  std::vector<uint8_t> frame = *EncodeFrame(SampleBatchReady());
  for (size_t cut = kFrameHeaderBytes; cut < frame.size(); ++cut) {
    std::vector<uint8_t> payload(frame.begin() + kFrameHeaderBytes, frame.begin() + cut);
    auto r = DecodePayload(MessageType::kBatchReady, payload);
    ASSERT_FALSE(r.ok()) << "cut at " << cut;
    EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status().message();
  }
  std::vector<uint8_t> payload(frame.begin() + kFrameHeaderBytes, frame.end());
  payload.push_back(0);
  auto r = DecodePayload(MessageType::kBatchReady, payload);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("trailing"), std::string::npos);
  // A frame whose header length disagrees with the bytes present.
  frame.push_back(0);
  ExpectRejected(frame, "declares");
}

TEST(ProtocolTest, RejectsOutOfRangeFields) {
  JobInfo info = SampleJobInfo();
  info.sample_shape = {};
  EXPECT_FALSE(EncodeFrame(info).ok());
  info.sample_shape = {1, 2, 3, 4, 5};
  EXPECT_FALSE(EncodeFrame(info).ok());
  info = SampleJobInfo();
  info.dtype = static_cast<DType>(9);
  EXPECT_FALSE(EncodeFrame(info).ok());
  info = SampleJobInfo();
  info.segment_name = "/carpool-abc-job-42";  // a path: the segment comes as an fd
  EXPECT_FALSE(EncodeFrame(info).ok());
  info.segment_name = "";
  EXPECT_FALSE(EncodeFrame(info).ok());
  info = SampleJobInfo();
  info.sample_shape = {0xffffffff, 0xffffffff, 0xffffffff};
  EXPECT_FALSE(EncodeFrame(info).ok());

  // Device slot fields: a handle of the wrong size, overlapping slots, or on a CPU job.
  info = SampleGpuJobInfo();
  info.device_handle.pop_back();
  EXPECT_FALSE(EncodeFrame(info).ok());
  info = SampleGpuJobInfo();
  info.device_slot_stride = info.device_slot_bytes - 1;
  EXPECT_FALSE(EncodeFrame(info).ok());
  info = SampleGpuJobInfo();
  info.device = -1;
  EXPECT_FALSE(EncodeFrame(info).ok());
  info = SampleGpuJobInfo();
  info.device_offset = 100;
  EXPECT_FALSE(EncodeFrame(info).ok());
  info = SampleGpuJobInfo();
  info.device = -2;
  info.device_handle.clear();
  info.device_slot_bytes = info.device_slot_stride = 0;
  EXPECT_FALSE(EncodeFrame(info).ok());
  BatchReady device_batch = SampleGpuBatchReady();
  device_batch.device_labels_offset = 8193;
  EXPECT_FALSE(EncodeFrame(device_batch).ok());
  device_batch.on_device = false;
  device_batch.device_labels_offset = 8192;
  EXPECT_FALSE(EncodeFrame(device_batch).ok());

  CreateJob job{std::string(kMaxNameBytes + 1, 'x'), 1, 1, "", "cpu", 1, false, 0, "", 0, 1, 0, 1};
  auto r = EncodeFrame(job);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("dataset"), std::string::npos);

  BatchReady b = SampleBatchReady();
  b.labels_bytes = 8;
  EXPECT_FALSE(EncodeFrame(b).ok());
  b = SampleBatchReady();
  b.images_offset = UINT64_MAX;
  EXPECT_FALSE(EncodeFrame(b).ok());

  EXPECT_FALSE(EncodeFrame(Error{StatusCode::kOk, "no"}).ok());
  // A bool byte other than 0/1 on the wire.
  std::vector<uint8_t> frame = *EncodeFrame(CreateJob{"d", 1, 1, "", "cpu", 1, true, 0, "", 0, 1, 0, 1});
  // then seed (8), job_key (4 + 0), rank, world_size, node, nodes, resume_epoch (4 each),
  // resume_batches (8), resume_taken (4 + 0)
  frame[frame.size() - 45] = 7;
  ExpectRejected(frame, "drop_last");
  // Data-parallel fields: a rank outside the world, an empty world, ranks without a key.
  CreateJob ddp{"d", 1, 1, "", "cpu", 1, false, 0, "key", 2, 2, 0, 1};
  auto bad_rank = EncodeFrame(ddp);
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_NE(bad_rank.status().message().find("rank is 2"), std::string::npos);
  ddp.rank = 0;
  ddp.world_size = 0;
  EXPECT_FALSE(EncodeFrame(ddp).ok());
  ddp.world_size = 2;
  ddp.job_key.clear();
  auto no_key = EncodeFrame(ddp);
  ASSERT_FALSE(no_key.ok());
  EXPECT_NE(no_key.status().message().find("job_key"), std::string::npos);
  ddp = CreateJob{"d", 1, 1, "", "cpu", 1, false, 0, "key", 0, 1, 2, 2};  // node outside nodes
  EXPECT_FALSE(EncodeFrame(ddp).ok());
  ddp.node = 1;
  ddp.job_key.clear();  // one rank per node, several nodes: still one job, so a key
  EXPECT_FALSE(EncodeFrame(ddp).ok());
  // A string length pointing past the end of the payload.
  std::vector<uint8_t> hello = *EncodeFrame(Hello{1, "abc"});
  hello[16] = 200;
  ExpectRejected(hello, "truncated");
}

// A hello as protocol `version` lays it out: pid, client name, then (6 on) the package version
// and whatever later versions add.
std::vector<uint8_t> ForeignHelloFrame(uint16_t version, const std::string& tail) {
  std::vector<uint8_t> frame = *EncodeFrame(Hello{7, "old", ""});
  frame.resize(frame.size() - 4);  // drop the empty version string: protocol 5's layout
  frame.insert(frame.end(), tail.begin(), tail.end());
  frame[4] = static_cast<uint8_t>(version);
  frame[5] = static_cast<uint8_t>(version >> 8);
  uint32_t payload = static_cast<uint32_t>(frame.size() - kFrameHeaderBytes);
  for (size_t i = 0; i < 4; ++i) frame[8 + i] = static_cast<uint8_t>(payload >> (8 * i));
  return frame;
}

TEST(ProtocolTest, HelloOfAnotherVersionIsReadForItsVersion) {
  EXPECT_EQ(Hello{}.version, PackageVersion());
  EXPECT_EQ(HelloReply{}.server_version, PackageVersion());
  // Protocol 5: pid and name only. The strict decoder refuses it, the peer decoder reads it.
  std::vector<uint8_t> v5 = ForeignHelloFrame(5, "");
  ExpectRejected(v5, "protocol version 5 is not supported");
  auto header = DecodePeerFrameHeader(v5);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_EQ(header->version, 5);
  EXPECT_EQ(header->type, MessageType::kHello);
  auto hello = DecodeForeignHello(std::span<const uint8_t>(v5).subspan(kFrameHeaderBytes));
  ASSERT_TRUE(hello.ok()) << hello.status().ToString();
  EXPECT_EQ(hello->pid, 7u);
  EXPECT_EQ(hello->client_name, "old");
  EXPECT_EQ(hello->version, "");
  EXPECT_EQ(DescribePeer(hello->version, header->version), "carpool 0.1.0 (protocol 5)");
  // A later protocol: its version string, then fields this build does not know (ignored).
  std::string tail = std::string("\x05\0\0\0", 4) + "9.1.0" + "more fields";
  std::vector<uint8_t> v9 = ForeignHelloFrame(9, tail);
  hello = DecodeForeignHello(std::span<const uint8_t>(v9).subspan(kFrameHeaderBytes));
  ASSERT_TRUE(hello.ok()) << hello.status().ToString();
  EXPECT_EQ(hello->version, "9.1.0");
  EXPECT_EQ(DescribePeer(hello->version, 9), "carpool 9.1.0 (protocol 9)");
  EXPECT_EQ(DescribePeer("", 9), "carpool of an unknown version (protocol 9)");
  // A truncated version string is still an error.
  std::vector<uint8_t> cut = ForeignHelloFrame(9, tail.substr(0, 6));
  EXPECT_FALSE(DecodeForeignHello(std::span<const uint8_t>(cut).subspan(kFrameHeaderBytes)).ok());
  // Frames other than hello and error of another version stay refused.
  std::vector<uint8_t> beat = *EncodeFrame(Heartbeat{});
  beat[4] = 5;
  EXPECT_FALSE(DecodePeerFrameHeader(beat).ok());
}

TEST(ProtocolTest, ErrorForAPeerOfAnotherVersionNamesBothVersions) {
  std::string message = VersionMismatchMessage(DescribePeer("", 5),
                                               DescribePeer(PackageVersion(), kProtocolVersion));
  EXPECT_NE(message.find("the client is carpool 0.1.0 (protocol 5)"), std::string::npos) << message;
  EXPECT_NE(message.find(fmt::format("the server is carpool {} (protocol {})", PackageVersion(),
                                     kProtocolVersion)),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("install the same carpool version on both sides"), std::string::npos);
  auto frame = EncodeErrorFor(5, Error{StatusCode::kFailedPrecondition, message});
  ASSERT_TRUE(frame.ok());
  EXPECT_EQ((*frame)[4], 5);  // a protocol-5 client's strict decoder accepts the header
  EXPECT_EQ((*frame)[5], 0);
  auto header = DecodePeerFrameHeader(*frame);
  ASSERT_TRUE(header.ok());
  EXPECT_EQ(header->type, MessageType::kError);
  auto error = DecodeForeignError(std::span<const uint8_t>(*frame).subspan(kFrameHeaderBytes));
  ASSERT_TRUE(error.ok());
  EXPECT_EQ(error->code, StatusCode::kFailedPrecondition);
  EXPECT_EQ(error->message, message);
}

TEST(ProtocolTest, RejectsOversizedMessages) {
  EXPECT_FALSE(EncodeFrame(StatsReply{std::string(kMaxPayloadBytes, 'x')}).ok());
  EXPECT_TRUE(EncodeFrame(StatsReply{std::string(kMaxPayloadBytes - 4, 'x')}).ok());
  EXPECT_FALSE(EncodeFrame(Error{StatusCode::kInternal, std::string(kMaxMessageBytes + 1, 'e')}).ok());
}

// Fuzz: random bytes and mutated valid frames must always yield a Status or a message that
// re-encodes to the same bytes, never a crash or an over-read (run under ASan in CI).
TEST(ProtocolTest, FuzzRandomAndMutatedFramesNeverCrash) {
  std::mt19937_64 rng(20240501);
  std::vector<std::vector<uint8_t>> seeds;
  for (const Message& m : OneOfEach()) seeds.push_back(*EncodeFrame(m));
  size_t total_bytes = 0, accepted = 0;
  for (int iter = 0; iter < 500000; ++iter) {
    std::vector<uint8_t> bytes;
    if (iter % 4 == 0) {
      bytes.resize(rng() % 64);
      for (auto& b : bytes) b = static_cast<uint8_t>(rng());
      if (bytes.size() >= 8 && rng() % 2 == 0) {  // valid-looking header, random rest
        std::vector<uint8_t> h = seeds[rng() % seeds.size()];
        std::memcpy(bytes.data(), h.data(), 8);
      }
    } else {
      bytes = seeds[rng() % seeds.size()];
      int mutations = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < mutations; ++k) {
        switch (rng() % 4) {
          case 0:
            bytes[rng() % bytes.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
            break;
          case 1:
            bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
            break;
          case 2:
            if (bytes.size() > 1) bytes.resize(rng() % bytes.size());
            break;
          default:
            bytes.push_back(static_cast<uint8_t>(rng()));
        }
        if (bytes.empty()) bytes.push_back(0);
      }
    }
    total_bytes += bytes.size();
    auto r = DecodeFrame(bytes);
    if (r.ok()) {
      ++accepted;
      auto again = EncodeFrame(*r);
      ASSERT_TRUE(again.ok()) << again.status().ToString();
      EXPECT_EQ(*again, bytes);
    } else {
      EXPECT_FALSE(r.status().message().empty());
    }
  }
  EXPECT_GT(total_bytes, size_t{15'000'000});
  EXPECT_GT(accepted, 0u);  // some mutations (e.g. of a seed's value bytes) stay valid
}

}  // namespace
}  // namespace carpool::protocol
