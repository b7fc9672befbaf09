#include "datasets/idx.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

namespace carpool {

namespace fs = std::filesystem;

Result<std::vector<uint8_t>> ReadMaybeGzip(const fs::path& file) {
  gzFile gz = gzopen(file.c_str(), "rb");
  if (gz == nullptr) {
    return Status::NotFound(fmt::format("cannot open \"{}\": {}; check the path", file.string(),
                                        errno ? std::strerror(errno) : "out of memory"));
  }
  gzbuffer(gz, 1 << 20);
  std::vector<uint8_t> data;
  constexpr size_t kStep = 1 << 20;
  while (true) {
    size_t old = data.size();
    data.resize(old + kStep);
    int n = gzread(gz, data.data() + old, kStep);
    if (n < 0) {
      int code = 0;
      std::string msg = gzerror(gz, &code);
      gzclose(gz);
      return Status::Corruption(fmt::format(
          "\"{}\" is not a readable gzip or plain file: {}; re-download it", file.string(), msg));
    }
    data.resize(old + static_cast<size_t>(n));
    if (static_cast<size_t>(n) < kStep) break;
  }
  gzclose(gz);
  return data;
}

Result<IdxHeader> ParseIdxHeader(std::span<const uint8_t> data, std::string_view file) {
  auto bad = [&](std::string what) {
    return Status::Corruption(fmt::format(
        "bad IDX header in \"{}\": {}; pass IDX ubyte files (e.g. train-images-idx3-ubyte.gz)",
        file, what));
  };
  if (data.size() < 4) return bad(fmt::format("file has only {} bytes", data.size()));
  uint32_t magic =
      (uint32_t{data[0]} << 24) | (uint32_t{data[1]} << 16) | (uint32_t{data[2]} << 8) | data[3];
  if (data[0] != 0 || data[1] != 0 || data[2] != 0x08 || data[3] == 0) {
    return bad(fmt::format("magic 0x{:08x}, expected 0x000008NN (unsigned bytes, NN dims)", magic));
  }
  IdxHeader h;
  size_t ndims = data[3];
  h.header_bytes = 4 + 4 * ndims;
  if (data.size() < h.header_bytes) {
    return bad(fmt::format("{} dims need {} header bytes, file has {}", ndims, h.header_bytes,
                           data.size()));
  }
  h.record_bytes = 1;
  for (size_t d = 0; d < ndims; ++d) {
    const uint8_t* p = data.data() + 4 + 4 * d;
    uint32_t dim = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
    h.dims.push_back(dim);
    if (d > 0) {
      if (dim == 0 || h.record_bytes > (uint64_t{1} << 40) / dim) {
        return bad(fmt::format("dimension {} = {} is zero or too large", d, dim));
      }
      h.record_bytes *= dim;
    }
  }
  uint64_t expected = h.header_bytes + h.count() * h.record_bytes;
  if (data.size() != expected) {
    return bad(fmt::format("dims say {} bytes of data, file has {}", expected - h.header_bytes,
                           data.size() - h.header_bytes));
  }
  return h;
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
