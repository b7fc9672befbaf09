#include "protocol/protocol.h"
#include "protocol/id_set.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
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

JobInfo SampleDecodeJobInfo() {
  JobInfo m = SampleGpuJobInfo();
  m.decode_in_job = true;
  return m;
}

CreateJob SampleDecodeCreateJob() {
  CreateJob m{"imagenet", 256, 2, "", "cuda:0", 4, false, 99, "", 0, 1, 0, 1};
  m.decode_in_job = true;
  return m;
}

// Two JPEGs of 224 x 224 x 3, the second one's pixels after the first's.
DecodeWork SampleDecodeWork() {
  DecodeWork m;
  m.job_id = 42;
  m.work_id = 5;
  m.prepare = "resize=256,crop=224,decode=gpu";
  m.output_bytes = 2 * 224 * 224 * 3;
  m.items = {DecodeItem{0, 51234, 224, 224, 3, 0},
             DecodeItem{51234, 40000, 224, 224, 3, 224 * 224 * 3}};
  return m;
}

DecodeDone SampleDecodeDone() {
  DecodeDone m;
  m.job_id = 42;
  m.work_id = 5;
  m.buffer_handle = std::string(kIpcHandleBytes, '\x3c');
  m.buffer_offset = 0;
  m.buffer_bytes = 2 << 20;
  m.failed = {1};
  return m;
}

DecodeDone SampleFailedDecodeDone() {
  DecodeDone m;
  m.job_id = 42;
  m.work_id = 6;
  m.code = StatusCode::kUnavailable;
  m.message = "GPU decode in this process: libcarpool_job_decode.so not found";
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
          Bye{},
          SampleDecodeCreateJob(),
          SampleDecodeJobInfo(),
          DecodeSegment{42, 64 << 20},
          SampleDecodeWork(),
          DecodeDone{42, 9, StatusCode::kOk, "", std::string(kIpcHandleBytes, 'h'), 0, 4096,
                     {}},  // nothing failed
          SampleDecodeDone(),
          SampleFailedDecodeDone()};
}

TEST(ProtocolTest, EveryMessageRoundTrips) {
  std::vector<Message> all = OneOfEach();
  // job-info three times (CPU, GPU, GPU decoding in the job), batch-ready twice (CPU, GPU),
  // create-job four times (one job, a rank of a DDP job, a resumed job, a job offering to decode),
  // decode-done three times (all decoded, some failed, a failed work)
  ASSERT_EQ(all.size(), size_t{kMaxMessageType} + 8);
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

// The encoder refuses `message` (it would not decode), saying `needle`.
void ExpectEncodeRejected(const Message& message, const std::string& needle) {
  auto r = EncodeFrame(message);
  ASSERT_FALSE(r.ok()) << needle;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
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
  unknown[6] = 16;
  ExpectRejected(unknown, "unknown message type 16");
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
  // resume_batches (8), resume_taken (4 + 0), decode_in_job (1)
  frame[frame.size() - 46] = 7;
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

// Overwrites the u32 at `at` of a frame (little-endian), e.g. a count or a string length.
void PutU32(std::vector<uint8_t>& frame, size_t at, uint32_t v) {
  for (size_t i = 0; i < 4; ++i) frame[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t GetU64(const std::vector<uint8_t>& frame, size_t at) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v |= uint64_t{frame[at + i]} << (8 * i);
  return v;
}

uint32_t GetU32(const std::vector<uint8_t>& frame, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v |= uint32_t{frame[at + i]} << (8 * i);
  return v;
}

TEST(ProtocolTest, DecodeFramesAreTheLastTypes) {
  EXPECT_EQ(kMaxMessageType, 15);
  EXPECT_EQ(static_cast<uint16_t>(MessageType::kDecodeSegment), 13);
  EXPECT_EQ(static_cast<uint16_t>(MessageType::kDecodeWork), 14);
  EXPECT_EQ(static_cast<uint16_t>(MessageType::kDecodeDone), 15);
  EXPECT_EQ(MessageTypeName(MessageType::kDecodeSegment), "decode-segment");
  EXPECT_EQ(MessageTypeName(MessageType::kDecodeWork), "decode-work");
  EXPECT_EQ(MessageTypeName(MessageType::kDecodeDone), "decode-done");
  EXPECT_EQ(TypeOf(DecodeSegment{}), MessageType::kDecodeSegment);
  EXPECT_EQ(TypeOf(DecodeWork{}), MessageType::kDecodeWork);
  EXPECT_EQ(TypeOf(DecodeDone{}), MessageType::kDecodeDone);
  // Type 15 is the last one a header may name, 16 the first it may not.
  std::vector<uint8_t> frame = *EncodeFrame(SampleDecodeDone());
  EXPECT_EQ(frame[6], 15);
  EXPECT_EQ(frame[7], 0);
  auto header = DecodeFrameHeader(frame);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_EQ(header->type, MessageType::kDecodeDone);
  frame[6] = 16;
  ExpectRejected(frame, "unknown message type 16, expected 1..15");
  EXPECT_FALSE(DecodePayload(static_cast<MessageType>(16), {}).ok());
}

// The wire layouts of docs/protocol.md, byte for byte.
TEST(ProtocolTest, DecodeFramesHaveTheDocumentedLayout) {
  std::vector<uint8_t> segment = *EncodeFrame(DecodeSegment{42, 64 << 20});
  ASSERT_EQ(segment.size(), kFrameHeaderBytes + 16);  // job_id u64, bytes u64
  EXPECT_EQ(GetU64(segment, 12), 42u);
  EXPECT_EQ(GetU64(segment, 20), uint64_t{64} << 20);

  const DecodeWork work = SampleDecodeWork();
  std::vector<uint8_t> w = *EncodeFrame(work);
  // job_id u64, work_id u64, prepare (u32 + bytes), output_bytes u64, item count u32, then per
  // item offset u64, length u64, height u32, width u32, channels u32, dst_offset u64 (36 bytes).
  const size_t p = work.prepare.size();
  ASSERT_EQ(w.size(), kFrameHeaderBytes + 8 + 8 + 4 + p + 8 + 4 + 2 * 36);
  EXPECT_EQ(GetU64(w, 12), 42u);
  EXPECT_EQ(GetU64(w, 20), 5u);
  EXPECT_EQ(GetU32(w, 28), p);
  EXPECT_EQ(std::string(w.begin() + 32, w.begin() + 32 + p), work.prepare);
  EXPECT_EQ(GetU64(w, 32 + p), work.output_bytes);
  EXPECT_EQ(GetU32(w, 40 + p), 2u);
  const size_t item1 = 44 + p + 36;
  EXPECT_EQ(GetU64(w, item1), 51234u);
  EXPECT_EQ(GetU64(w, item1 + 8), 40000u);
  EXPECT_EQ(GetU32(w, item1 + 16), 224u);
  EXPECT_EQ(GetU32(w, item1 + 20), 224u);
  EXPECT_EQ(GetU32(w, item1 + 24), 3u);
  EXPECT_EQ(GetU64(w, item1 + 28), uint64_t{224 * 224 * 3});

  const DecodeDone done = SampleDecodeDone();
  std::vector<uint8_t> d = *EncodeFrame(done);
  // job_id u64, work_id u64, code u16, message (u32 + bytes), buffer_handle (u32 + bytes),
  // buffer_offset u64, buffer_bytes u64, failed count u32 + u32 each.
  ASSERT_EQ(d.size(), kFrameHeaderBytes + 8 + 8 + 2 + 4 + 4 + 64 + 8 + 8 + 4 + 4);
  EXPECT_EQ(GetU64(d, 12), 42u);
  EXPECT_EQ(GetU64(d, 20), 5u);
  EXPECT_EQ(d[28] | d[29] << 8, 0);  // kOk
  EXPECT_EQ(GetU32(d, 30), 0u);      // no message
  EXPECT_EQ(GetU32(d, 34), kIpcHandleBytes);
  EXPECT_EQ(GetU64(d, 38 + 64), 0u);
  EXPECT_EQ(GetU64(d, 46 + 64), uint64_t{2} << 20);
  EXPECT_EQ(GetU32(d, 54 + 64), 1u);
  EXPECT_EQ(GetU32(d, 58 + 64), 1u);
}

// The two bools of protocol 7 end their payloads: one byte 0/1 after every older field.
TEST(ProtocolTest, DecodeInJobIsTheLastByteOfCreateJobAndJobInfo) {
  for (const Message& m : {Message(SampleDecodeCreateJob()), Message(SampleDecodeJobInfo())}) {
    std::vector<uint8_t> frame = *EncodeFrame(m);
    EXPECT_EQ(frame.back(), 1) << MessageTypeName(TypeOf(m));
    Message off = m;
    std::visit([](auto& v) {
      if constexpr (requires { v.decode_in_job; }) v.decode_in_job = false;
    }, off);
    std::vector<uint8_t> off_frame = *EncodeFrame(off);
    ASSERT_EQ(off_frame.size(), frame.size());
    EXPECT_EQ(off_frame.back(), 0);
    EXPECT_TRUE(std::equal(frame.begin(), frame.end() - 1, off_frame.begin()))
        << "only the last byte differs";
    frame.back() = 2;
    ExpectRejected(frame, "decode_in_job is 2, expected 0 or 1");
    // Without it (a protocol-6 payload): truncated at that field.
    std::vector<uint8_t> payload(frame.begin() + kFrameHeaderBytes, frame.end() - 1);
    auto r = DecodePayload(TypeOf(m), payload);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("truncated at field decode_in_job"), std::string::npos)
        << r.status().message();
  }
  EXPECT_FALSE(CreateJob{}.decode_in_job);
  EXPECT_FALSE(JobInfo{}.decode_in_job);
  // Only a GPU job decodes in its process.
  JobInfo cpu = SampleJobInfo();
  cpu.decode_in_job = true;
  auto r = EncodeFrame(cpu);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("decode_in_job"), std::string::npos) << r.status().message();
}

TEST(ProtocolTest, RejectsTruncatedAndTrailingDecodeFrames) {
  for (const Message& m :
       {Message(DecodeSegment{42, 4096}), Message(SampleDecodeWork()), Message(SampleDecodeDone()),
        Message(SampleFailedDecodeDone())}) {
    std::vector<uint8_t> frame = *EncodeFrame(m);
    const MessageType type = TypeOf(m);
    for (size_t cut = kFrameHeaderBytes; cut < frame.size(); ++cut) {
      std::vector<uint8_t> payload(frame.begin() + kFrameHeaderBytes, frame.begin() + cut);
      auto r = DecodePayload(type, payload);
      ASSERT_FALSE(r.ok()) << MessageTypeName(type) << " cut at " << cut;
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    }
    std::vector<uint8_t> payload(frame.begin() + kFrameHeaderBytes, frame.end());
    payload.push_back(0);
    auto r = DecodePayload(type, payload);
    ASSERT_FALSE(r.ok()) << MessageTypeName(type);
    EXPECT_NE(r.status().message().find("trailing"), std::string::npos) << r.status().message();
  }
}

TEST(ProtocolTest, RejectsBadDecodeSegments) {
  EXPECT_FALSE(EncodeFrame(DecodeSegment{42, 0}).ok());
  EXPECT_TRUE(EncodeFrame(DecodeSegment{42, 1}).ok());
  EXPECT_TRUE(EncodeFrame(DecodeSegment{42, uint64_t{1} << 40}).ok());
  auto r = EncodeFrame(DecodeSegment{42, (uint64_t{1} << 40) + 1});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("decode segment bytes"), std::string::npos)
      << r.status().message();
}

TEST(ProtocolTest, RejectsBadDecodeWork) {
  const auto rejected = ExpectEncodeRejected;
  DecodeWork w = SampleDecodeWork();
  w.items[1].length = 0;
  rejected(w, "item 1 has length 0");
  w = SampleDecodeWork();
  w.items[0].channels = 0;
  rejected(w, "item 0 has 0 channels, expected 1..4");
  w.items[0].channels = 5;
  rejected(w, "item 0 has 5 channels, expected 1..4");
  w = SampleDecodeWork();
  w.items[0].height = 0;
  rejected(w, "item 0 is 0 x 224");
  w = SampleDecodeWork();
  w.items[1].width = 0;
  rejected(w, "item 1 is 224 x 0");
  w = SampleDecodeWork();
  w.items[0].offset = UINT64_MAX - 10;
  rejected(w, "overflows");
  // An item's pixels must lie in the output: past its end, or too large for it.
  w = SampleDecodeWork();
  w.output_bytes -= 1;
  rejected(w, "does not fit the");
  w = SampleDecodeWork();
  w.items[0].dst_offset = w.output_bytes + 1;
  rejected(w, "does not fit the");
  w = SampleDecodeWork();
  w.items[0] = {0, 10, 0xffffffff, 0xffffffff, 4, 0};  // 2^66 bytes: no overflow to a small size
  w.output_bytes = UINT64_MAX;
  rejected(w, "does not fit the");
  w = SampleDecodeWork();
  w.items[1].channels = 1;  // fewer bytes than its room: fine
  EXPECT_TRUE(EncodeFrame(w).ok());
  w.items[1].channels = 4;
  rejected(w, "does not fit the");
  w = SampleDecodeWork();
  w.prepare = std::string(kMaxTransformBytes + 1, 'x');
  rejected(w, "prepare");
  w.prepare = std::string(kMaxTransformBytes, 'x');
  EXPECT_TRUE(EncodeFrame(w).ok());
  w = SampleDecodeWork();
  w.items.clear();
  w.output_bytes = 0;
  EXPECT_TRUE(EncodeFrame(w).ok());  // an empty work decodes, as an empty batch would

  // More items than 1 MiB holds: refused by size, before the decoder reads a count.
  w = SampleDecodeWork();
  w.output_bytes = 3;
  w.items.assign(kMaxPayloadBytes / 36 + 1, DecodeItem{0, 1, 1, 1, 1, 0});
  rejected(w, "exceeds the limit");
  w.items.resize((kMaxPayloadBytes - 100) / 36);
  EXPECT_TRUE(EncodeFrame(w).ok());

  // A count on the wire larger than the items present: refused before anything is allocated.
  std::vector<uint8_t> frame = *EncodeFrame(SampleDecodeWork());
  const size_t count_at = kFrameHeaderBytes + 8 + 8 + 4 + SampleDecodeWork().prepare.size() + 8;
  ASSERT_EQ(GetU32(frame, count_at), 2u);
  PutU32(frame, count_at, 3);
  ExpectRejected(frame, "item_count is 3, but 72 bytes hold at most 2 items of 36 bytes");
  PutU32(frame, count_at, 0xffffffff);
  ExpectRejected(frame, "item_count is 4294967295");
  PutU32(frame, count_at, 1);  // fewer: the second item is trailing bytes
  ExpectRejected(frame, "36 trailing bytes");
}

TEST(ProtocolTest, RejectsBadDecodeDone) {
  const auto rejected = ExpectEncodeRejected;
  // The handle: exactly kIpcHandleBytes with code ok; empty or kIpcHandleBytes otherwise.
  DecodeDone d = SampleDecodeDone();
  d.buffer_handle.pop_back();
  rejected(d, "buffer_handle is 63 bytes, expected 64 with code ok");
  d.buffer_handle.clear();
  rejected(d, "buffer_handle is 0 bytes, expected 64 with code ok");
  d.buffer_handle = std::string(kIpcHandleBytes + 1, 'x');
  rejected(d, "buffer_handle is 65 bytes, limit is 64");
  d = SampleFailedDecodeDone();
  d.buffer_handle = std::string(kIpcHandleBytes - 1, 'x');
  rejected(d, "buffer_handle is 63 bytes, expected 0 or 64");
  d.buffer_handle = std::string(kIpcHandleBytes, 'x');  // a failure may still name its buffer
  EXPECT_TRUE(EncodeFrame(d).ok());
  // The code: any StatusCode, kOk included (unlike an error frame's).
  d = SampleFailedDecodeDone();
  d.code = StatusCode::kInternal;
  EXPECT_TRUE(EncodeFrame(d).ok());
  d.code = static_cast<StatusCode>(10);
  rejected(d, "code is 10, expected 0..9");
  d = SampleFailedDecodeDone();
  d.message = std::string(kMaxMessageBytes + 1, 'm');
  rejected(d, "message");
  d.message = std::string(kMaxMessageBytes, 'm');
  EXPECT_TRUE(EncodeFrame(d).ok());

  // More failed indices than 1 MiB holds; a count on the wire beyond the indices present.
  d = SampleDecodeDone();
  d.failed.assign(kMaxPayloadBytes / 4, 0);
  rejected(d, "exceeds the limit");
  std::vector<uint8_t> frame = *EncodeFrame(SampleDecodeDone());
  const size_t count_at = kFrameHeaderBytes + 8 + 8 + 2 + 4 + 4 + kIpcHandleBytes + 8 + 8;
  ASSERT_EQ(GetU32(frame, count_at), 1u);
  PutU32(frame, count_at, 2);
  ExpectRejected(frame, "failed_count is 2, but 4 bytes hold at most 1 indices");
  PutU32(frame, count_at, 0xffffffff);
  ExpectRejected(frame, "failed_count is 4294967295");
  PutU32(frame, count_at, 0);
  ExpectRejected(frame, "4 trailing bytes");
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
