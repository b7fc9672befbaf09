#include "protocol/protocol.h"

#include <fmt/format.h>

#include <type_traits>

namespace carpool::protocol {
namespace {

// One DecodeItem on the wire: offset, length (u64 each), height, width, channels (u32 each),
// dst_offset (u64).
constexpr size_t kDecodeItemBytes = 8 + 8 + 4 + 4 + 4 + 8;
// A decode segment is at most 1 TiB, as a batch segment (docs/protocol.md, "Bounds").
constexpr uint64_t kMaxDecodeSegmentBytes = uint64_t{1} << 40;

// Appends little-endian fields. Only the encoder uses it; limits are checked by decoding back.
class Writer {
 public:
  template <typename T>
  void Int(T v) {
    static_assert(std::is_unsigned_v<T>);
    for (size_t i = 0; i < sizeof(T); ++i) bytes_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void Str(const std::string& s) {
    Int(static_cast<uint32_t>(s.size()));
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// Reads little-endian fields from a span. The first failure sticks; later reads return zero, so a
// decoder can read all fields and check status() once at the end without ever over-reading.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  template <typename T>
  T Int(const char* field) {
    static_assert(std::is_unsigned_v<T>);
    if (!Need(sizeof(T), field)) return 0;
    T v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(bytes_[pos_ + i]) << (8 * i));
    pos_ += sizeof(T);
    return v;
  }
  bool Bool(const char* field) {
    uint8_t v = Int<uint8_t>(field);
    if (v > 1) Fail(fmt::format("field {} is {}, expected 0 or 1", field, v));
    return v == 1;
  }
  std::string Str(const char* field, uint32_t max_bytes) {
    uint32_t n = Int<uint32_t>(field);
    if (!status_.ok()) return {};
    if (n > max_bytes) {
      Fail(fmt::format("field {} is {} bytes, limit is {}", field, n, max_bytes));
      return {};
    }
    if (!Need(n, field)) return {};
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  // A count of elements of `element_bytes` each that follow: checked against the bytes present
  // before the caller allocates for them; 0 after a failure.
  uint32_t Count(const char* field, size_t element_bytes, const char* elements) {
    const uint32_t count = Int<uint32_t>(field);
    if (count > remaining() / element_bytes) {
      Fail(fmt::format("{} is {}, but {} bytes hold at most {} {} of {} bytes", field, count,
                       remaining(), remaining() / element_bytes, elements, element_bytes));
      return 0;
    }
    return count;
  }
  // A StatusCode, at least `lowest` (kOk, or kInvalidArgument for an error).
  StatusCode Code(const char* field, StatusCode lowest) {
    const uint16_t code = Int<uint16_t>(field);
    if (code < static_cast<uint16_t>(lowest) ||
        code > static_cast<uint16_t>(StatusCode::kInternal)) {
      Fail(fmt::format("{} is {}, expected {}..{}", field, code, static_cast<int>(lowest),
                       static_cast<int>(StatusCode::kInternal)));
    }
    return static_cast<StatusCode>(code);
  }
  void Fail(std::string message) {
    if (status_.ok()) status_ = Status::InvalidArgument(std::move(message));
  }
  size_t remaining() const { return bytes_.size() - pos_; }
  // OK only if every read succeeded and every byte was consumed (or `allow_trailing`).
  Status Finish(MessageType type, bool allow_trailing = false) {
    if (status_.ok() && pos_ != bytes_.size() && !allow_trailing) {
      Fail(fmt::format("{} payload has {} trailing bytes", MessageTypeName(type),
                       bytes_.size() - pos_));
    }
    if (!status_.ok()) {
      return Status::InvalidArgument(
          fmt::format("malformed {} frame: {}", MessageTypeName(type), status_.message()));
    }
    return Status::OK();
  }

 private:
  bool Need(size_t n, const char* field) {
    if (!status_.ok()) return false;
    if (bytes_.size() - pos_ < n) {
      Fail(fmt::format("truncated at field {} (needs {} bytes, {} left)", field, n,
                       bytes_.size() - pos_));
      return false;
    }
    return true;
  }

  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
  Status status_;
};

void Put(Writer& w, const Hello& m) {
  w.Int(m.pid);
  w.Str(m.client_name);
  w.Str(m.version);
}
void Get(Reader& r, Hello& m) {
  m.pid = r.Int<uint32_t>("pid");
  m.client_name = r.Str("client_name", kMaxMessageBytes);
  m.version = r.Str("version", kMaxNameBytes);
}

void Put(Writer& w, const HelloReply& m) {
  w.Str(m.server_instance);
  w.Int(m.lease_ms);
  w.Int(m.max_payload_bytes);
  w.Int(m.max_batch_size);
  w.Int(m.max_prefetch);
  w.Str(m.server_version);
}
void Get(Reader& r, HelloReply& m) {
  m.server_instance = r.Str("server_instance", kMaxNameBytes);
  m.lease_ms = r.Int<uint32_t>("lease_ms");
  m.max_payload_bytes = r.Int<uint32_t>("max_payload_bytes");
  m.max_batch_size = r.Int<uint32_t>("max_batch_size");
  m.max_prefetch = r.Int<uint32_t>("max_prefetch");
  m.server_version = r.Str("server_version", kMaxNameBytes);
  if (m.lease_ms == 0) r.Fail("lease_ms is 0, expected a positive lease");
}

void Put(Writer& w, const CreateJob& m) {
  w.Str(m.dataset);
  w.Int(m.batch_size);
  w.Int(m.epochs);
  w.Str(m.transform);
  w.Str(m.device);
  w.Int(m.prefetch);
  w.Int(static_cast<uint8_t>(m.drop_last));
  w.Int(m.seed);
  w.Str(m.job_key);
  w.Int(m.rank);
  w.Int(m.world_size);
  w.Int(m.node);
  w.Int(m.nodes);
  w.Int(m.resume_epoch);
  w.Int(m.resume_batches);
  w.Str(m.resume_taken);
  w.Int(static_cast<uint8_t>(m.decode_in_job));  // since protocol 7
}
void Get(Reader& r, CreateJob& m) {
  m.dataset = r.Str("dataset", kMaxNameBytes);
  m.batch_size = r.Int<uint32_t>("batch_size");
  m.epochs = r.Int<uint32_t>("epochs");
  m.transform = r.Str("transform", kMaxTransformBytes);
  m.device = r.Str("device", kMaxNameBytes);
  m.prefetch = r.Int<uint32_t>("prefetch");
  m.drop_last = r.Bool("drop_last");
  m.seed = r.Int<uint64_t>("seed");
  m.job_key = r.Str("job_key", kMaxNameBytes);
  m.rank = r.Int<uint32_t>("rank");
  m.world_size = r.Int<uint32_t>("world_size");
  m.node = r.Int<uint32_t>("node");
  m.nodes = r.Int<uint32_t>("nodes");
  m.resume_epoch = r.Int<uint32_t>("resume_epoch");
  m.resume_batches = r.Int<uint64_t>("resume_batches");
  m.resume_taken = r.Str("resume_taken", kMaxPayloadBytes);
  m.decode_in_job = r.Bool("decode_in_job");
  if (m.world_size == 0 || m.world_size > kMaxWorldSize) {
    r.Fail(fmt::format("world_size is {}, expected 1..{}", m.world_size, kMaxWorldSize));
  } else if (m.rank >= m.world_size) {
    r.Fail(fmt::format("rank is {}, expected 0..{} (world_size {})", m.rank, m.world_size - 1,
                       m.world_size));
  } else if (m.nodes == 0 || m.nodes > kMaxWorldSize || m.node >= m.nodes) {
    r.Fail(fmt::format("node is {} of nodes {}, expected nodes 1..{} and node < nodes", m.node,
                       m.nodes, kMaxWorldSize));
  } else if ((m.world_size > 1 || m.nodes > 1) && m.job_key.empty()) {
    r.Fail(fmt::format("world_size is {} but job_key is empty; the ranks of one job join with a "
                       "common key", m.world_size));
  }
}

void Put(Writer& w, const JobInfo& m) {
  w.Int(m.job_id);
  w.Int(m.dataset_size);
  w.Int(m.batches_per_epoch);
  w.Int(m.batch_size);
  w.Int(m.epochs);
  w.Int(static_cast<uint8_t>(m.sample_shape.size()));
  for (uint32_t d : m.sample_shape) w.Int(d);
  w.Int(static_cast<uint8_t>(m.dtype));
  w.Int(static_cast<uint8_t>(m.layout));
  w.Str(m.segment_name);
  w.Int(m.slot_count);
  w.Int(m.slot_bytes);
  w.Int(static_cast<uint32_t>(m.device));
  w.Str(m.device_handle);
  w.Str(m.device_pci_bus_id);
  w.Int(m.device_slot_stride);
  w.Int(m.device_slot_bytes);
  w.Int(m.device_offset);
  w.Int(m.start_epoch);
  w.Int(m.start_batch);
  w.Int(static_cast<uint8_t>(m.decode_in_job));  // since protocol 7
}
void Get(Reader& r, JobInfo& m) {
  m.job_id = r.Int<uint64_t>("job_id");
  m.dataset_size = r.Int<uint64_t>("dataset_size");
  m.batches_per_epoch = r.Int<uint64_t>("batches_per_epoch");
  m.batch_size = r.Int<uint32_t>("batch_size");
  m.epochs = r.Int<uint32_t>("epochs");
  uint8_t rank = r.Int<uint8_t>("rank");
  if (rank == 0 || rank > kMaxImageRank) {
    r.Fail(fmt::format("rank is {}, expected 1..{}", rank, kMaxImageRank));
    rank = 0;
  }
  uint64_t elements = 1;
  for (uint8_t i = 0; i < rank; ++i) {
    uint32_t d = r.Int<uint32_t>("sample_shape");
    constexpr uint64_t kMaxElements = uint64_t{1} << 40;
    if (d == 0) {
      r.Fail("a sample_shape dimension is 0");
    } else if (elements > kMaxElements / d) {
      r.Fail("sample_shape has more than 2^40 elements");
    } else {
      elements *= d;
    }
    m.sample_shape.push_back(d);
  }
  uint8_t dtype = r.Int<uint8_t>("dtype");
  if (dtype < 1 || dtype > 3) r.Fail(fmt::format("dtype is {}, expected 1..3", dtype));
  m.dtype = static_cast<DType>(dtype);
  uint8_t layout = r.Int<uint8_t>("layout");
  if (layout < 1 || layout > 3) r.Fail(fmt::format("layout is {}, expected 1..3", layout));
  m.layout = static_cast<Layout>(layout);
  m.segment_name = r.Str("segment_name", kMaxNameBytes);
  m.slot_count = r.Int<uint32_t>("slot_count");
  m.slot_bytes = r.Int<uint64_t>("slot_bytes");
  // The memfd's name, shown in messages: a plain name, never a path to open.
  if (m.segment_name.empty() || m.segment_name.find('/') != std::string::npos) {
    r.Fail(fmt::format("segment_name \"{}\" is empty or has a '/'", m.segment_name));
  }
  if (m.slot_count == 0) r.Fail("slot_count is 0");
  if (m.batch_size == 0) r.Fail("batch_size is 0");
  m.device = static_cast<int32_t>(r.Int<uint32_t>("device"));
  m.device_handle = r.Str("device_handle", kIpcHandleBytes);
  m.device_pci_bus_id = r.Str("device_pci_bus_id", kMaxNameBytes);
  m.device_slot_stride = r.Int<uint64_t>("device_slot_stride");
  m.device_slot_bytes = r.Int<uint64_t>("device_slot_bytes");
  m.device_offset = r.Int<uint64_t>("device_offset");
  m.start_epoch = r.Int<uint32_t>("start_epoch");
  m.start_batch = r.Int<uint64_t>("start_batch");
  m.decode_in_job = r.Bool("decode_in_job");
  if (m.device_offset % 256 != 0 || m.device_offset > (uint64_t{1} << 48)) {
    r.Fail(fmt::format("device_offset {} is not 256-aligned or exceeds 2^48", m.device_offset));
  }
  if (m.device < -1) r.Fail(fmt::format("device is {}, expected -1 or a device index", m.device));
  if (m.device >= 0) {
    if (m.device_handle.size() != kIpcHandleBytes) {
      r.Fail(fmt::format("device_handle is {} bytes, expected {}", m.device_handle.size(),
                         kIpcHandleBytes));
    }
    if (m.device_slot_bytes == 0 || m.device_slot_stride < m.device_slot_bytes ||
        m.device_slot_stride > (uint64_t{1} << 40) / m.slot_count) {
      r.Fail(fmt::format("device slots of {} bytes at stride {} are empty, overlap or exceed 2^40",
                         m.device_slot_bytes, m.device_slot_stride));
    }
  } else if (!m.device_handle.empty() || m.device_slot_bytes != 0 || m.device_slot_stride != 0 ||
             m.device_offset != 0) {
    r.Fail("a CPU job (device -1) carries device slot fields");
  } else if (m.decode_in_job) {
    r.Fail("a CPU job (device -1) has decode_in_job; only a GPU job decodes in its process");
  }
}

void Put(Writer& w, const BatchReady& m) {
  w.Int(m.job_id);
  w.Int(m.slot);
  w.Int(m.generation);
  w.Int(m.epoch);
  w.Int(m.batch_index);
  w.Int(m.sample_count);
  for (uint64_t v : {m.images_offset, m.images_bytes, m.labels_offset, m.labels_bytes,
                     m.ids_offset, m.ids_bytes}) {
    w.Int(v);
  }
  w.Int(m.skipped);
  w.Int(static_cast<uint8_t>(m.on_device));
  w.Int(m.device_labels_offset);
}
void Get(Reader& r, BatchReady& m) {
  m.job_id = r.Int<uint64_t>("job_id");
  m.slot = r.Int<uint32_t>("slot");
  m.generation = r.Int<uint64_t>("generation");
  m.epoch = r.Int<uint32_t>("epoch");
  m.batch_index = r.Int<uint64_t>("batch_index");
  m.sample_count = r.Int<uint32_t>("sample_count");
  m.images_offset = r.Int<uint64_t>("images_offset");
  m.images_bytes = r.Int<uint64_t>("images_bytes");
  m.labels_offset = r.Int<uint64_t>("labels_offset");
  m.labels_bytes = r.Int<uint64_t>("labels_bytes");
  m.ids_offset = r.Int<uint64_t>("ids_offset");
  m.ids_bytes = r.Int<uint64_t>("ids_bytes");
  m.skipped = r.Int<uint32_t>("skipped");
  // Ranges are checked against the slot by the receiver; here only that they cannot overflow.
  if (m.images_offset > UINT64_MAX - m.images_bytes || m.labels_offset > UINT64_MAX - m.labels_bytes ||
      m.ids_offset > UINT64_MAX - m.ids_bytes) {
    r.Fail("a byte range overflows 64 bits");
  }
  if (m.labels_bytes != uint64_t{m.sample_count} * 4 || m.ids_bytes != uint64_t{m.sample_count} * 4) {
    r.Fail(fmt::format("labels_bytes {} / ids_bytes {} do not match sample_count {} (4 bytes each)",
                       m.labels_bytes, m.ids_bytes, m.sample_count));
  }
  if (m.labels_offset % 4 != 0 || m.ids_offset % 4 != 0) r.Fail("labels/ids are not 4-aligned");
  m.on_device = r.Bool("on_device");
  m.device_labels_offset = r.Int<uint64_t>("device_labels_offset");
  if (m.device_labels_offset % 8 != 0) r.Fail("device labels are not 8-aligned");
  if (!m.on_device && m.device_labels_offset != 0) r.Fail("a host batch has device labels");
}

void Put(Writer& w, const Release& m) {
  w.Int(m.job_id);
  w.Int(m.slot);
  w.Int(m.generation);
}
void Get(Reader& r, Release& m) {
  m.job_id = r.Int<uint64_t>("job_id");
  m.slot = r.Int<uint32_t>("slot");
  m.generation = r.Int<uint64_t>("generation");
}

void Put(Writer&, const Heartbeat&) {}
void Get(Reader&, Heartbeat&) {}
void Put(Writer&, const Bye&) {}
void Get(Reader&, Bye&) {}

void Put(Writer& w, const StatsRequest& m) { w.Int(m.job_id); }
void Get(Reader& r, StatsRequest& m) { m.job_id = r.Int<uint64_t>("job_id"); }

void Put(Writer& w, const StatsReply& m) { w.Str(m.json); }
void Get(Reader& r, StatsReply& m) { m.json = r.Str("json", kMaxPayloadBytes - 4); }

void Put(Writer& w, const Error& m) {
  w.Int(static_cast<uint16_t>(m.code));
  w.Str(m.message);
}
void Get(Reader& r, Error& m) {
  m.code = r.Code("error code", StatusCode::kInvalidArgument);
  m.message = r.Str("message", kMaxMessageBytes);
}

void Put(Writer& w, const EndOfData& m) {
  w.Int(m.job_id);
  w.Int(m.epochs_completed);
}
void Get(Reader& r, EndOfData& m) {
  m.job_id = r.Int<uint64_t>("job_id");
  m.epochs_completed = r.Int<uint32_t>("epochs_completed");
}

void Put(Writer& w, const DecodeSegment& m) {
  w.Int(m.job_id);
  w.Int(m.bytes);
}
void Get(Reader& r, DecodeSegment& m) {
  m.job_id = r.Int<uint64_t>("job_id");
  m.bytes = r.Int<uint64_t>("bytes");
  if (m.bytes == 0 || m.bytes > kMaxDecodeSegmentBytes) {
    r.Fail(fmt::format("decode segment bytes is {}, expected 1..2^40", m.bytes));
  }
}

void Put(Writer& w, const DecodeWork& m) {
  w.Int(m.job_id);
  w.Int(m.work_id);
  w.Str(m.prepare);
  w.Int(m.output_bytes);
  w.Int(static_cast<uint32_t>(m.items.size()));
  for (const DecodeItem& it : m.items) {
    w.Int(it.offset);
    w.Int(it.length);
    w.Int(it.height);
    w.Int(it.width);
    w.Int(it.channels);
    w.Int(it.dst_offset);
  }
}
void Get(Reader& r, DecodeWork& m) {
  m.job_id = r.Int<uint64_t>("job_id");
  m.work_id = r.Int<uint64_t>("work_id");
  m.prepare = r.Str("prepare", kMaxTransformBytes);
  m.output_bytes = r.Int<uint64_t>("output_bytes");
  const uint32_t count = r.Count("item_count", kDecodeItemBytes, "items");
  m.items.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    DecodeItem& it = m.items[i];
    it.offset = r.Int<uint64_t>("item offset");
    it.length = r.Int<uint64_t>("item length");
    it.height = r.Int<uint32_t>("item height");
    it.width = r.Int<uint32_t>("item width");
    it.channels = r.Int<uint32_t>("item channels");
    it.dst_offset = r.Int<uint64_t>("item dst_offset");
    if (it.length == 0) {
      r.Fail(fmt::format("item {} has length 0", i));
    } else if (it.offset > UINT64_MAX - it.length) {
      r.Fail(fmt::format("item {}'s byte range overflows 64 bits", i));
    } else if (it.channels < 1 || it.channels > 4) {
      r.Fail(fmt::format("item {} has {} channels, expected 1..4", i, it.channels));
    } else if (it.height == 0 || it.width == 0) {
      r.Fail(fmt::format("item {} is {} x {}, expected both at least 1", i, it.height, it.width));
    } else if (it.dst_offset > m.output_bytes ||
               uint64_t{it.height} * it.width > (m.output_bytes - it.dst_offset) / it.channels) {
      // height * width < 2^64; times channels only when it fits below output_bytes.
      r.Fail(fmt::format("item {} ({} x {} x {} at {}) does not fit the {}-byte output", i,
                         it.height, it.width, it.channels, it.dst_offset, m.output_bytes));
    }
  }
}

void Put(Writer& w, const DecodeDone& m) {
  w.Int(m.job_id);
  w.Int(m.work_id);
  w.Int(static_cast<uint16_t>(m.code));
  w.Str(m.message);
  w.Str(m.buffer_handle);
  w.Int(m.buffer_offset);
  w.Int(m.buffer_bytes);
  w.Int(static_cast<uint32_t>(m.failed.size()));
  for (uint32_t i : m.failed) w.Int(i);
}
void Get(Reader& r, DecodeDone& m) {
  m.job_id = r.Int<uint64_t>("job_id");
  m.work_id = r.Int<uint64_t>("work_id");
  m.code = r.Code("code", StatusCode::kOk);
  m.message = r.Str("message", kMaxMessageBytes);
  m.buffer_handle = r.Str("buffer_handle", kIpcHandleBytes);
  m.buffer_offset = r.Int<uint64_t>("buffer_offset");
  m.buffer_bytes = r.Int<uint64_t>("buffer_bytes");
  if (m.code == StatusCode::kOk && m.buffer_handle.size() != kIpcHandleBytes) {
    r.Fail(fmt::format("buffer_handle is {} bytes, expected {} with code ok",
                       m.buffer_handle.size(), kIpcHandleBytes));
  } else if (!m.buffer_handle.empty() && m.buffer_handle.size() != kIpcHandleBytes) {
    r.Fail(fmt::format("buffer_handle is {} bytes, expected 0 or {}", m.buffer_handle.size(),
                       kIpcHandleBytes));
  }
  m.failed.resize(r.Count("failed_count", sizeof(uint32_t), "indices"));
  for (uint32_t& i : m.failed) i = r.Int<uint32_t>("failed");
}

// Default-constructs alternative `index` of Message.
template <size_t... I>
Message MakeAlternative(size_t index, std::index_sequence<I...>) {
  Message m;
  (void)((index == I ? (m = std::variant_alternative_t<I, Message>{}, true) : false) || ...);
  return m;
}

}  // namespace

std::string_view MessageTypeName(MessageType type) {
  switch (type) {
    case MessageType::kHello: return "hello";
    case MessageType::kHelloReply: return "hello-reply";
    case MessageType::kCreateJob: return "create-job";
    case MessageType::kJobInfo: return "job-info";
    case MessageType::kBatchReady: return "batch-ready";
    case MessageType::kRelease: return "release";
    case MessageType::kHeartbeat: return "heartbeat";
    case MessageType::kStatsRequest: return "stats-request";
    case MessageType::kStatsReply: return "stats-reply";
    case MessageType::kError: return "error";
    case MessageType::kEndOfData: return "end-of-data";
    case MessageType::kBye: return "bye";
    case MessageType::kDecodeSegment: return "decode-segment";
    case MessageType::kDecodeWork: return "decode-work";
    case MessageType::kDecodeDone: return "decode-done";
  }
  return "unknown";
}

// The wire carries DType and Layout as these bytes; renumbering breaks every deployed peer.
static_assert(static_cast<uint8_t>(DType::kUint8) == 1);
static_assert(static_cast<uint8_t>(DType::kFloat16) == 2);
static_assert(static_cast<uint8_t>(DType::kFloat32) == 3);
static_assert(static_cast<uint8_t>(Layout::kNHWC) == 1);
static_assert(static_cast<uint8_t>(Layout::kNCHW) == 2);
static_assert(static_cast<uint8_t>(Layout::kRaw) == 3);

// Message alternatives are declared in MessageType order, so the type is index + 1.
MessageType TypeOf(const Message& message) {
  return static_cast<MessageType>(message.index() + 1);
}
static_assert(std::variant_size_v<Message> == kMaxMessageType);
static_assert(std::is_same_v<std::variant_alternative_t<4, Message>, BatchReady>);
static_assert(std::is_same_v<std::variant_alternative_t<11, Message>, Bye>);
static_assert(std::is_same_v<std::variant_alternative_t<12, Message>, DecodeSegment>);
static_assert(std::is_same_v<std::variant_alternative_t<13, Message>, DecodeWork>);
static_assert(std::is_same_v<std::variant_alternative_t<14, Message>, DecodeDone>);

namespace {

Result<FrameHeader> DecodeHeader(std::span<const uint8_t> bytes, bool any_version) {
  if (bytes.size() < kFrameHeaderBytes) {
    return Status::InvalidArgument(fmt::format("frame header is {} bytes, expected {}",
                                               bytes.size(), kFrameHeaderBytes));
  }
  Reader r(bytes.first(kFrameHeaderBytes));
  uint32_t magic = r.Int<uint32_t>("magic");
  uint16_t version = r.Int<uint16_t>("version");
  uint16_t type = r.Int<uint16_t>("type");
  uint32_t length = r.Int<uint32_t>("length");
  if (magic != kFrameMagic) {
    return Status::InvalidArgument(fmt::format(
        "bad frame magic 0x{:08x}, expected 0x{:08x}; is the peer a carpool endpoint?", magic,
        kFrameMagic));
  }
  bool foreign_ok = any_version && (type == static_cast<uint16_t>(MessageType::kHello) ||
                                    type == static_cast<uint16_t>(MessageType::kError));
  if (version != kProtocolVersion && !foreign_ok) {
    return Status::InvalidArgument(fmt::format(
        "protocol version {} is not supported (this side speaks {}); use matching client and "
        "server builds",
        version, kProtocolVersion));
  }
  if (type < kMinMessageType || type > kMaxMessageType) {
    return Status::InvalidArgument(fmt::format("unknown message type {}, expected {}..{}", type,
                                               kMinMessageType, kMaxMessageType));
  }
  if (length > kMaxPayloadBytes) {
    return Status::InvalidArgument(
        fmt::format("frame payload of {} bytes exceeds the limit of {}", length, kMaxPayloadBytes));
  }
  return FrameHeader{static_cast<MessageType>(type), length, version};
}

}  // namespace

Result<FrameHeader> DecodeFrameHeader(std::span<const uint8_t> bytes) {
  return DecodeHeader(bytes, false);
}

Result<FrameHeader> DecodePeerFrameHeader(std::span<const uint8_t> bytes) {
  return DecodeHeader(bytes, true);
}

std::string_view PackageVersion() { return CARPOOL_PACKAGE_VERSION; }

std::string DescribePeer(std::string_view package, uint16_t version) {
  std::string name(package);
  if (name.empty()) name = version <= kLastUnnamedProtocol ? "0.1.0" : "of an unknown version";
  return fmt::format("carpool {} (protocol {})", name, version);
}

std::string VersionMismatchMessage(std::string_view client, std::string_view server,
                                   std::string_view server_at) {
  return fmt::format(
      "carpool versions differ: the client is {}, the server{}{} is {}; install the same carpool "
      "version on both sides (one wheel or build for the server and the training environment), "
      "or restart the server from the client's install (`carpool server`)",
      client, server_at.empty() ? "" : " at ", server_at, server);
}

Result<Hello> DecodeForeignHello(std::span<const uint8_t> payload) {
  Reader r(payload);
  Hello m;
  m.pid = r.Int<uint32_t>("pid");
  m.client_name = r.Str("client_name", kMaxMessageBytes);
  // Protocols up to 5 end here; from 6 on the version follows (and maybe more, ignored).
  m.version = r.remaining() > 0 ? r.Str("version", kMaxNameBytes) : std::string();
  Status s = r.Finish(MessageType::kHello, /*allow_trailing=*/true);
  if (!s.ok()) return s;
  return m;
}

Result<Error> DecodeForeignError(std::span<const uint8_t> payload) {
  auto m = DecodePayload(MessageType::kError, payload);
  if (!m.ok()) return m.status();
  return std::get<Error>(*m);
}

Result<std::vector<uint8_t>> EncodeErrorFor(uint16_t version, const Error& error) {
  auto frame = EncodeFrame(error);
  if (!frame.ok()) return frame.status();
  (*frame)[4] = static_cast<uint8_t>(version);
  (*frame)[5] = static_cast<uint8_t>(version >> 8);
  return frame;
}

Result<Message> DecodePayload(MessageType type, std::span<const uint8_t> payload) {
  auto raw = static_cast<uint16_t>(type);
  if (raw < kMinMessageType || raw > kMaxMessageType) {
    return Status::InvalidArgument(fmt::format("unknown message type {}", raw));
  }
  if (payload.size() > kMaxPayloadBytes) {
    return Status::InvalidArgument(fmt::format("payload of {} bytes exceeds the limit of {}",
                                               payload.size(), kMaxPayloadBytes));
  }
  Message message = MakeAlternative(raw - 1u, std::make_index_sequence<kMaxMessageType>{});
  Reader r(payload);
  std::visit([&r](auto& m) { Get(r, m); }, message);
  Status s = r.Finish(type);
  if (!s.ok()) return s;
  return message;
}

Result<Message> DecodeFrame(std::span<const uint8_t> bytes) {
  auto header = DecodeFrameHeader(bytes);
  if (!header.ok()) return header.status();
  if (bytes.size() - kFrameHeaderBytes != header->payload_bytes) {
    return Status::InvalidArgument(fmt::format("frame declares {} payload bytes but has {}",
                                               header->payload_bytes,
                                               bytes.size() - kFrameHeaderBytes));
  }
  return DecodePayload(header->type, bytes.subspan(kFrameHeaderBytes));
}

Result<std::vector<uint8_t>> EncodeFrame(const Message& message) {
  Writer w;
  w.Int(kFrameMagic);
  w.Int(kProtocolVersion);
  w.Int(static_cast<uint16_t>(TypeOf(message)));
  w.Int(uint32_t{0});  // length, patched below
  std::visit([&w](const auto& m) { Put(w, m); }, message);
  std::vector<uint8_t>& bytes = w.bytes();
  size_t payload = bytes.size() - kFrameHeaderBytes;
  if (payload > kMaxPayloadBytes) {
    return Status::InvalidArgument(fmt::format("{} payload of {} bytes exceeds the limit of {}",
                                               MessageTypeName(TypeOf(message)), payload,
                                               kMaxPayloadBytes));
  }
  for (size_t i = 0; i < 4; ++i) bytes[8 + i] = static_cast<uint8_t>(payload >> (8 * i));
  // Refuse to send what the peer would reject: the decoder is the single statement of the limits.
  Result<Message> check =
      DecodePayload(TypeOf(message), std::span<const uint8_t>(bytes).subspan(kFrameHeaderBytes));
  if (!check.ok()) {
    return Status::InvalidArgument(fmt::format("refusing to send: {}", check.status().message()));
  }
  return std::move(bytes);
}

}  // namespace carpool::protocol
