// The carpool wire protocol: length-prefixed, versioned, little-endian binary frames between a job
// (client) and the server. Shared by both sides; it depends on nothing of the server. See
// docs/protocol.md. Pure functions over bytes: thread-safe.
//
// Frame = header (12 bytes) + payload:
//   u32 magic (kFrameMagic) | u16 version (kProtocolVersion) | u16 type (MessageType) | u32 length
// Every decoder validates every field (lengths, string sizes, enum ranges, trailing bytes) before
// use and returns a Status on any violation; it never reads past the span it was given.
#ifndef CARPOOL_PROTOCOL_PROTOCOL_H_
#define CARPOOL_PROTOCOL_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "carpool/status.h"
#include "carpool/types.h"

namespace carpool::protocol {

inline constexpr uint32_t kFrameMagic = 0x4C505243;  // "CRPL" as little-endian bytes
// 2: device batch slots (CUDA IPC); 3: data-parallel ranks (CreateJob job_key, rank, world_size);
// 4: resume positions; 5: job-info carries its batch segment as a memfd (segment_fd.h);
// 6: hello and hello-reply carry the package version, and a peer of another protocol version is
// answered with an error frame in its own version naming both (docs/protocol.md, "Versions");
// 7: GPU decode in the job's own process (create-job and job-info say decode_in_job; the
// decode-segment, decode-work and decode-done frames)
inline constexpr uint16_t kProtocolVersion = 7;
// Protocols 1..kLastUnnamedProtocol did not say their package version; all were carpool 0.1.0.
inline constexpr uint16_t kLastUnnamedProtocol = 5;
inline constexpr uint32_t kMaxWorldSize = 4096;
inline constexpr size_t kFrameHeaderBytes = 12;
inline constexpr uint32_t kMaxPayloadBytes = 1u << 20;  // 1 MiB; larger frames are rejected
inline constexpr uint32_t kMaxNameBytes = 256;          // dataset, device, segment names
inline constexpr uint32_t kMaxTransformBytes = 1024;
inline constexpr uint32_t kMaxMessageBytes = 64 * 1024;  // error messages, client names
inline constexpr uint32_t kMaxImageRank = 4;
inline constexpr uint32_t kIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)

enum class MessageType : uint16_t {
  kHello = 1,         // client -> server, first frame of every connection
  kHelloReply = 2,    // server -> client
  kCreateJob = 3,     // client -> server
  kJobInfo = 4,       // server -> client, reply to kCreateJob
  kBatchReady = 5,    // server -> client, one per published batch slot (uses one credit)
  kRelease = 6,       // client -> server, returns the slot and its credit
  kHeartbeat = 7,     // both ways: client sends, server echoes; any frame renews the lease
  kStatsRequest = 8,  // client -> server
  kStatsReply = 9,    // server -> client, JSON text
  kError = 10,        // both ways; from the server after a protocol violation the socket closes
  kEndOfData = 11,    // server -> client, the job has finished all its epochs
  kBye = 12,          // client -> server, orderly goodbye: the job is removed
  kDecodeSegment = 13,  // server -> client, carries the memfd that decode work's JPEGs lie in
  kDecodeWork = 14,     // server -> client, JPEGs to decode on the job's GPU (decode_in_job)
  kDecodeDone = 15,     // client -> server, the answer to one decode work
};
inline constexpr uint16_t kMinMessageType = 1;
inline constexpr uint16_t kMaxMessageType = 15;

std::string_view MessageTypeName(MessageType type);

// This build's package version (CMake's PROJECT_VERSION), e.g. "0.1.0".
std::string_view PackageVersion();
// What a peer of protocol `version` is: "carpool 0.1.0 (protocol 5)". `package` is the version the
// peer said; empty: known only for protocols up to kLastUnnamedProtocol (0.1.0), else "unknown".
std::string DescribePeer(std::string_view package, uint16_t version);
// The error both sides give when the protocol versions differ: names both package and protocol
// versions (DescribePeer) and what to do. `server_at`: the server's socket, where known.
std::string VersionMismatchMessage(std::string_view client, std::string_view server,
                                   std::string_view server_at = {});

// Its first three fields (pid, client_name, version) stay in this order in every protocol version
// from 6 on, so that a server of another version can name the client (DecodeForeignHello).
struct Hello {
  uint32_t pid = 0;
  std::string client_name;
  std::string version{PackageVersion()};  // the client's package version; since protocol 6
  bool operator==(const Hello&) const = default;
};

struct HelloReply {
  std::string server_instance;
  uint32_t lease_ms = 0;          // a session silent for this long is closed
  uint32_t max_payload_bytes = 0;
  uint32_t max_batch_size = 0;
  uint32_t max_prefetch = 0;
  std::string server_version{PackageVersion()};  // the server's package version; since protocol 6
  bool operator==(const HelloReply&) const = default;
};

struct CreateJob {
  std::string dataset;
  uint32_t batch_size = 0;
  uint32_t epochs = 0;
  std::string transform;
  std::string device;  // "cpu" or "cuda:N"
  uint32_t prefetch = 0;  // credits: batches the server may have unreleased at once
  bool drop_last = false;
  uint64_t seed = 0;
  // A data-parallel job: world_size ranks that join with one job_key form one job whose global
  // batch is world_size x batch_size; this rank gets slice `rank` of each. world_size 1: a job of
  // its own (job_key ignored).
  std::string job_key{};
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // A job whose ranks span `nodes` nodes: this server serves its part `node` (node_partition.h).
  uint32_t node = 0;
  uint32_t nodes = 1;
  // Resuming from a checkpoint (carpool::JobPosition): start in epoch resume_epoch, whose first
  // resume_batches batches and the samples in resume_taken (an id set, id_set.h) were taken
  // before. All zero/empty: a fresh start.
  uint32_t resume_epoch = 0;
  uint64_t resume_batches = 0;
  std::string resume_taken{};
  // A GPU job whose process can decode JPEGs on its GPU (it found libcarpool_job_decode.so and
  // was not told otherwise): the server may send it decode work (JobInfo::decode_in_job).
  bool decode_in_job = false;
  bool resuming() const { return resume_epoch > 0 || resume_batches > 0 || !resume_taken.empty(); }
  bool operator==(const CreateJob&) const = default;
};

struct JobInfo {
  uint64_t job_id = 0;
  uint64_t dataset_size = 0;
  uint64_t batches_per_epoch = 0;
  uint32_t batch_size = 0;
  uint32_t epochs = 0;
  std::vector<uint32_t> sample_shape;  // per sample, in `layout` order; 1..kMaxImageRank dims
  DType dtype = DType::kUint8;
  Layout layout = Layout::kNHWC;
  // The batch slot segment (batch_slot_layout.h) comes as the fd attached to this frame
  // (segment_fd.h); this is the memfd's name, for messages only.
  std::string segment_name;
  uint32_t slot_count = 0;
  uint64_t slot_bytes = 0;
  // A GPU job (device >= 0): its images and int64 labels live in device batch slots, one device
  // allocation of slot_count * device_slot_stride bytes exported as a legacy CUDA IPC handle.
  int32_t device = -1;              // the server's CUDA device index; -1 for a CPU job
  std::string device_handle{};      // cudaIpcMemHandle_t, kIpcHandleBytes; empty for a CPU job
  std::string device_pci_bus_id{};  // of that device: the client checks it opens the same one
  uint64_t device_slot_stride = 0;
  uint64_t device_slot_bytes = 0;
  // Of slot 0 from the base of the allocation the handle names (the driver may place a small
  // cudaMalloc inside a larger allocation; the handle then names that one).
  uint64_t device_offset = 0;
  // Where the job starts: epoch 0, batch 0, unless it resumed from a checkpoint.
  uint32_t start_epoch = 0;
  uint64_t start_batch = 0;
  // The server will send this job decode work: JPEGs of its batches to decode in its own
  // process, in the training process's CUDA context (docs/gpu.md, "Decoding in the jobs'
  // processes"). Only when the job asked (CreateJob::decode_in_job).
  bool decode_in_job = false;
  bool operator==(const JobInfo&) const = default;
};

// A published batch. Offsets are relative to the start of the slot's data area; images are
// sample_count * (bytes of one sample), labels int32 and sample ids uint32, one per sample.
struct BatchReady {
  uint64_t job_id = 0;
  uint32_t slot = 0;
  uint64_t generation = 0;
  uint32_t epoch = 0;
  uint64_t batch_index = 0;  // within the epoch
  uint32_t sample_count = 0;
  uint64_t images_offset = 0, images_bytes = 0;
  uint64_t labels_offset = 0, labels_bytes = 0;
  uint64_t ids_offset = 0, ids_bytes = 0;
  uint32_t skipped = 0;  // samples of this batch's range skipped as unreadable
  // A GPU job's batch: images_* are relative to device slot `slot`, which also holds the labels
  // as int64 at device_labels_offset; labels_* and ids_* stay in the host slot.
  bool on_device = false;
  uint64_t device_labels_offset = 0;
  bool operator==(const BatchReady&) const = default;
};

struct Release {
  uint64_t job_id = 0;
  uint32_t slot = 0;
  uint64_t generation = 0;
  bool operator==(const Release&) const = default;
};

struct Heartbeat {
  bool operator==(const Heartbeat&) const = default;
};

struct StatsRequest {
  uint64_t job_id = 0;  // 0: server-wide statistics
  bool operator==(const StatsRequest&) const = default;
};

struct StatsReply {
  std::string json;
  bool operator==(const StatsReply&) const = default;
};

struct Error {
  StatusCode code = StatusCode::kInternal;
  std::string message;
  bool operator==(const Error&) const = default;
};

struct EndOfData {
  uint64_t job_id = 0;
  uint32_t epochs_completed = 0;
  bool operator==(const EndOfData&) const = default;
};

struct Bye {
  bool operator==(const Bye&) const = default;
};

// The segment that the next decode works' JPEGs lie in: a memfd of `bytes` bytes, attached to
// this frame (segment_fd.h), replacing the job's previous one. Its data is read-only for the
// client.
struct DecodeSegment {
  uint64_t job_id = 0;
  uint64_t bytes = 0;
  bool operator==(const DecodeSegment&) const = default;
};

// One JPEG of a decode work: its bytes at [offset, offset + length) of the decode segment, to be
// decoded, resized and cropped by the work's prepare spec to height x width x channels (uint8,
// HWC), and written at dst_offset of the client's decode buffer.
struct DecodeItem {
  uint64_t offset = 0, length = 0;
  uint32_t height = 0, width = 0, channels = 0;
  uint64_t dst_offset = 0;
  bool operator==(const DecodeItem&) const = default;
};

// JPEGs of one batch build for the job's process to decode on its GPU. The client answers each
// with one DecodeDone of the same work_id; the server waits for it before its next decode work
// to this job, so one buffer serves them all.
struct DecodeWork {
  uint64_t job_id = 0;
  uint64_t work_id = 0;
  std::string prepare;  // the dataset's prepare spec, e.g. "resize=256,crop=256,decode=gpu"
  uint64_t output_bytes = 0;  // the decode buffer holds at least this many bytes
  std::vector<DecodeItem> items;
  bool operator==(const DecodeWork&) const = default;
};

// The client's answer to a DecodeWork. code != kOk: nothing was decoded (message says why) and
// the server decodes the work itself, and every later one. Otherwise every item not in `failed`
// (indices into the work's items; streams its nvJPEG refused, the server decodes them) is in the
// decode buffer: one device allocation of buffer_bytes exported as a legacy CUDA IPC handle,
// its first byte buffer_offset bytes from the base the handle names.
struct DecodeDone {
  uint64_t job_id = 0;
  uint64_t work_id = 0;
  StatusCode code = StatusCode::kOk;
  std::string message;
  std::string buffer_handle;  // kIpcHandleBytes, or empty when code != kOk
  uint64_t buffer_offset = 0, buffer_bytes = 0;
  std::vector<uint32_t> failed;
  bool operator==(const DecodeDone&) const = default;
};

using Message = std::variant<Hello, HelloReply, CreateJob, JobInfo, BatchReady, Release, Heartbeat,
                             StatsRequest, StatsReply, Error, EndOfData, Bye, DecodeSegment,
                             DecodeWork, DecodeDone>;

MessageType TypeOf(const Message& message);

struct FrameHeader {
  MessageType type = MessageType::kHeartbeat;
  uint32_t payload_bytes = 0;
  uint16_t version = kProtocolVersion;
};

// Validates magic, version, type range and payload length (<= kMaxPayloadBytes).
// REQUIRES: bytes.size() >= kFrameHeaderBytes, else InvalidArgument.
Result<FrameHeader> DecodeFrameHeader(std::span<const uint8_t> bytes);
// The same, but a hello or an error frame of another protocol version is accepted (header.version
// says which): every version keeps their leading fields, so that each side can name the other's
// version (DecodeForeignHello, DecodeForeignError) instead of only rejecting the frame.
Result<FrameHeader> DecodePeerFrameHeader(std::span<const uint8_t> bytes);

// A hello payload of protocol `version` != kProtocolVersion: its pid and client name, and its
// version when the protocol has one (6 on; empty before). Fields after those are ignored.
Result<Hello> DecodeForeignHello(std::span<const uint8_t> payload);
// An error payload of any protocol version (code, message: the same in every version).
Result<Error> DecodeForeignError(std::span<const uint8_t> payload);
// An error frame that a peer of protocol `version` decodes: its header says that version.
Result<std::vector<uint8_t>> EncodeErrorFor(uint16_t version, const Error& error);

// Decodes one payload of the given type; the payload must be consumed exactly.
Result<Message> DecodePayload(MessageType type, std::span<const uint8_t> payload);

// Decodes exactly one whole frame (header + payload, no trailing bytes).
Result<Message> DecodeFrame(std::span<const uint8_t> bytes);

// Encodes a whole frame. Fails (InvalidArgument) when a field breaks a limit the decoder enforces,
// so that whatever is sent will decode.
Result<std::vector<uint8_t>> EncodeFrame(const Message& message);

}  // namespace carpool::protocol

#endif  // CARPOOL_PROTOCOL_PROTOCOL_H_
