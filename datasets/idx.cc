#include "datasets/idx.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <system_error>

namespace carpool {

namespace fs = std::filesystem;

namespace {

struct GzClose {
  void operator()(gzFile_s* gz) const { gzclose(gz); }
};
using GzFile = std::unique_ptr<gzFile_s, GzClose>;

Result<GzFile> OpenGz(const fs::path& file) {
  GzFile gz(gzopen(file.c_str(), "rb"));
  if (gz == nullptr) {
    return Status::NotFound(fmt::format("cannot open \"{}\": {}; check the path", file.string(),
                                        errno ? std::strerror(errno) : "out of memory"));
  }
  return gz;
}

// Reads up to n bytes; fewer only at the end of the file.
Status ReadGz(gzFile gz, const fs::path& file, uint8_t* out, unsigned n, unsigned* got) {
  int r = gzread(gz, out, n);
  if (r < 0) {
    int code = 0;
    return Status::Corruption(
        fmt::format("\"{}\" is not a readable gzip or plain file: {}; re-download it",
                    file.string(), gzerror(gz, &code)));
  }
  *got = static_cast<unsigned>(r);
  return Status::OK();
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

}  // namespace

Result<std::vector<uint8_t>> ReadMaybeGzip(const fs::path& file) {
  Result<GzFile> gz = OpenGz(file);
  if (!gz.ok()) return gz.status();
  gzbuffer(gz->get(), 1 << 20);
  std::vector<uint8_t> data;
  constexpr unsigned kStep = 1 << 20;
  while (true) {
    size_t old = data.size();
    data.resize(old + kStep);
    unsigned n = 0;
    if (Status s = ReadGz(gz->get(), file, data.data() + old, kStep, &n); !s.ok()) return s;
    data.resize(old + n);
    if (n < kStep) break;
  }
  return data;
}

Result<IdxHeader> ParseIdxHeaderPrefix(std::span<const uint8_t> prefix, std::string_view file) {
  auto bad = [&](std::string what) {
    return Status::Corruption(fmt::format(
        "bad IDX header in \"{}\": {}; pass IDX ubyte files (e.g. train-images-idx3-ubyte.gz), "
        "re-downloaded if damaged",
        file, what));
  };
  if (prefix.size() < 4) return bad(fmt::format("file has only {} bytes", prefix.size()));
  if (prefix[0] != 0 || prefix[1] != 0 || prefix[2] != 0x08 || prefix[3] == 0) {
    return bad(fmt::format("magic 0x{:08x}, expected 0x000008NN (unsigned bytes, NN dims)",
                           BigEndian32(prefix.data())));
  }
  IdxHeader h;
  const size_t ndims = prefix[3];
  h.header_bytes = 4 + 4 * ndims;
  if (prefix.size() < h.header_bytes) {
    return bad(fmt::format("{} dims need {} header bytes, file has {}", ndims, h.header_bytes,
                           prefix.size()));
  }
  for (size_t d = 0; d < ndims; ++d) h.dims.push_back(BigEndian32(prefix.data() + 4 + 4 * d));
  // Every product is checked: a wrapped size would let a damaged header pass the length check.
  h.record_bytes = 1;
  for (size_t d = 1; d < ndims; ++d) {
    if (h.dims[d] == 0) {
      return bad(fmt::format("dims [{}]: dimension {} is 0", fmt::join(h.dims, ","), d));
    }
    if (__builtin_mul_overflow(h.record_bytes, uint64_t{h.dims[d]}, &h.record_bytes) ||
        h.record_bytes > kMaxIdxRecordBytes) {
      return bad(fmt::format("dims [{}] make a record of more than {} bytes, the limit",
                             fmt::join(h.dims, ","), kMaxIdxRecordBytes));
    }
  }
  uint64_t total = 0;
  if (__builtin_mul_overflow(h.count(), h.record_bytes, &h.data_bytes) ||
      __builtin_add_overflow(h.header_bytes, h.data_bytes, &total)) {
    return bad(fmt::format("dims [{}] describe more than 2^64 bytes", fmt::join(h.dims, ",")));
  }
  return h;
}

Result<IdxHeader> ParseIdxHeader(std::span<const uint8_t> data, std::string_view file) {
  Result<IdxHeader> h = ParseIdxHeaderPrefix(data, file);
  if (!h.ok()) return h;
  if (data.size() - h->header_bytes != h->data_bytes) {
    return Status::Corruption(fmt::format(
        "bad IDX header in \"{}\": dims [{}] say {} bytes of data, file has {}; re-download it",
        file, fmt::join(h->dims, ","), h->data_bytes, data.size() - h->header_bytes));
  }
  return h;
}

Result<IdxHeader> ReadIdxHeader(const fs::path& file) {
  Result<GzFile> gz = OpenGz(file);
  if (!gz.ok()) return gz.status();
  uint8_t header[4 + 4 * 255];
  unsigned got = 0, more = 0;
  if (Status s = ReadGz(gz->get(), file, header, 4, &got); !s.ok()) return s;
  if (got == 4 && header[3] > 0) {
    if (Status s = ReadGz(gz->get(), file, header + 4, 4u * header[3], &more); !s.ok()) return s;
  }
  return ParseIdxHeaderPrefix(std::span<const uint8_t>(header, got + more), file.string());
}

Result<IdxRecordLayout> RawRecordLayout(const IdxHeader& h, const PrepareSpec& spec,
                                        std::string_view file) {
  const std::vector<uint32_t>& d = h.dims;
  if (!spec.raw || spec.channels < 1) {
    return Status::InvalidArgument(fmt::format(
        "prepare spec \"{}\" does not keep records as they are; use --prepare raw,channels=1",
        spec.ToString()));
  }
  if (d.empty() || d.size() > 4) {
    return Status::InvalidArgument(fmt::format(
        "prepare spec \"{}\" reads records of up to 3 dims (rows, columns, channels), but IDX file "
        "\"{}\" has dims [{}]; reshape it to [N,rows,columns] or [N,rows,columns,channels]",
        spec.ToString(), file, fmt::join(d, ",")));
  }
  // Each dim after the first is at most kMaxIdxRecordBytes, so it fits an int.
  IdxRecordLayout l{1, 1, spec.channels};
  if (d.size() == 2) l.width = static_cast<int>(d[1] / static_cast<uint32_t>(spec.channels));
  if (d.size() >= 3) {
    l.height = static_cast<int>(d[1]);
    l.width = static_cast<int>(d[2]);
  }
  if (d.size() == 4) l.channels = static_cast<int>(d[3]);
  const uint64_t bytes = uint64_t(l.height) * uint64_t(l.width) * uint64_t(l.channels);
  if (bytes != h.record_bytes) {
    return Status::InvalidArgument(fmt::format(
        "prepare spec \"{}\" reads each record of IDX file \"{}\" (dims [{}]) as {}x{}x{} = {} "
        "bytes, but a record holds {}; use --prepare raw,channels=1",
        spec.ToString(), file, fmt::join(d, ","), l.height, l.width, l.channels, bytes,
        h.record_bytes));
  }
  return l;
}

Result<SourceScan> ReadIdxPair(const fs::path& images, const fs::path& labels) {
  std::error_code ec;
  fs::path img = fs::canonical(images, ec);
  if (ec) {
    return Status::NotFound(
        fmt::format("IDX images file \"{}\": {}; check the path", images.string(), ec.message()));
  }
  fs::path lab = fs::canonical(labels, ec);
  if (ec) {
    return Status::NotFound(
        fmt::format("IDX labels file \"{}\": {}; check the path", labels.string(), ec.message()));
  }
  Result<std::vector<uint8_t>> img_data = ReadMaybeGzip(img);
  if (!img_data.ok()) return img_data.status();
  Result<IdxHeader> img_h = ParseIdxHeader(*img_data, img.string());
  if (!img_h.ok()) return img_h.status();
  Result<std::vector<uint8_t>> lab_data = ReadMaybeGzip(lab);
  if (!lab_data.ok()) return lab_data.status();
  Result<IdxHeader> lab_h = ParseIdxHeader(*lab_data, lab.string());
  if (!lab_h.ok()) return lab_h.status();
  if (lab_h->dims.size() != 1 || lab_h->count() != img_h->count()) {
    return Status::InvalidArgument(fmt::format(
        "IDX labels \"{}\" have shape [{}] but images \"{}\" have {} records; pass the labels "
        "file that belongs to these images",
        lab.string(), fmt::join(lab_h->dims, ","), img.string(), img_h->count()));
  }
  SourceScan scan;
  scan.default_prepare = std::string(kIdxPrepareDefault);
  scan.dirs.push_back(img.parent_path().string());
  std::string name = img.filename().string();
  const uint8_t* label_bytes = lab_data->data() + lab_h->header_bytes;
  uint8_t max_label = 0;
  scan.samples.reserve(img_h->count());
  for (uint64_t i = 0; i < img_h->count(); ++i) {
    max_label = std::max(max_label, label_bytes[i]);
    scan.samples.push_back({0, name, static_cast<int64_t>(i), img_h->record_bytes,
                            static_cast<int32_t>(label_bytes[i])});
  }
  if (img_h->count() > 0) {
    for (int c = 0; c <= max_label; ++c) scan.classes.push_back(std::to_string(c));
  }
  std::vector<uint32_t> shape(img_h->dims.begin() + 1, img_h->dims.end());
  scan.description = fmt::format("idx {} ({} records of {} uint8), labels {}", img.string(),
                                 img_h->count(), fmt::join(shape, "x"), lab.string());
  return scan;
}

}  // namespace carpool
