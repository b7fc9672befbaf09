#include "datasets/sample_reader.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "datasets/idx.h"

namespace carpool {

namespace {

// A tar member larger than this is a damaged catalog row, not an image.
constexpr uint64_t kMaxRangeBytes = uint64_t{1} << 30;

}  // namespace

// Loaded once under its own mutex, so that a slow gunzip of one file does not block readers of
// another.
struct SampleReader::IdxFile {
  Mutex mu;
  bool loaded GUARDED_BY(mu) = false;  // a failed load is retried on the next read
  std::vector<uint8_t> data;
  IdxHeader header;
};

namespace {

// A file descriptor for reading, or NotFound/IOError naming the sample's file.
Result<int> OpenSampleFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) return fd;
  int e = errno;
  std::string msg = fmt::format("cannot read sample \"{}\": {}", path, std::strerror(e));
  return e == ENOENT ? Status::NotFound(msg) : Status::IOError(msg);
}

}  // namespace

Result<std::vector<uint8_t>> ReadWholeFile(const std::string& path) {
  Result<int> opened = OpenSampleFile(path);
  if (!opened.ok()) return opened.status();
  int fd = *opened;
  std::vector<uint8_t> data;
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) data.reserve(static_cast<size_t>(st.st_size));
  uint8_t buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      return Status::IOError(fmt::format("reading sample \"{}\": {}", path, std::strerror(e)));
    }
    if (n == 0) break;
    data.insert(data.end(), buf, buf + n);
  }
  ::close(fd);
  return data;
}

Result<std::vector<uint8_t>> ReadFileRange(const std::string& path, uint64_t offset,
                                           uint64_t size) {
  if (size > kMaxRangeBytes) {
    return Status::Corruption(fmt::format(
        "sample \"{}\" at byte {} claims {} bytes (limit {}); re-register the dataset", path,
        offset, size, kMaxRangeBytes));
  }
  Result<int> opened = OpenSampleFile(path);
  if (!opened.ok()) return opened.status();
  int fd = *opened;
  std::vector<uint8_t> data(static_cast<size_t>(size));
  size_t got = 0;
  while (got < data.size()) {
    ssize_t n = ::pread(fd, data.data() + got, data.size() - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = n < 0 ? errno : 0;
      ::close(fd);
      if (e != 0) {
        return Status::IOError(fmt::format("reading sample \"{}\" at byte {}: {}", path, offset,
                                           std::strerror(e)));
      }
      return Status::Corruption(fmt::format(
          "sample \"{}\": bytes {}..{} are past the end of the file (it shrank since it was "
          "registered); re-register the dataset",
          path, offset, offset + size));
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  return data;
}

Result<std::shared_ptr<const SampleReader::IdxFile>> SampleReader::OpenIdx(
    const std::string& path) {
  std::shared_ptr<IdxFile> file;
  {
    MutexLock lock(mu_);
    std::shared_ptr<IdxFile>& slot = idx_files_[path];
    if (!slot) slot = std::make_shared<IdxFile>();
    file = slot;
  }
  MutexLock lock(file->mu);
  if (!file->loaded) {
    Result<std::vector<uint8_t>> data = ReadMaybeGzip(path);
    if (!data.ok()) return data.status();
    Result<IdxHeader> header = ParseIdxHeader(*data, path);
    if (!header.ok()) return header.status();
    file->header = std::move(*header);
    file->data = std::move(*data);
    file->loaded = true;
  }
  return std::shared_ptr<const IdxFile>(file);
}

void SampleReader::Forget(const std::string& idx_path) {
  MutexLock lock(mu_);
  idx_files_.erase(idx_path);
}

size_t SampleReader::idx_files_loaded() const {
  MutexLock lock(mu_);
  return idx_files_.size();
}

Result<std::vector<uint8_t>> SampleReader::Read(const SampleRecord& sample) {
  if (sample.source == "file") return ReadWholeFile(sample.path);
  if (sample.source == "tar") {
    return ReadFileRange(sample.path, static_cast<uint64_t>(sample.offset), sample.size);
  }
  if (sample.source != "idx") {
    return Status::InvalidArgument(
        fmt::format("sample {} has source \"{}\", expected \"file\", \"idx\" or \"tar\"",
                    sample.id, sample.source));
  }
  Result<std::shared_ptr<const IdxFile>> file = OpenIdx(sample.path);
  if (!file.ok()) return file.status();
  const IdxFile& f = **file;
  if (sample.record_index < 0 || static_cast<uint64_t>(sample.record_index) >= f.header.count()) {
    return Status::Corruption(fmt::format(
        "sample {}: record {} is outside IDX file \"{}\" ({} records); re-register the dataset",
        sample.id, sample.record_index, sample.path, f.header.count()));
  }
  const uint8_t* begin = f.data.data() + f.header.header_bytes +
                         static_cast<uint64_t>(sample.record_index) * f.header.record_bytes;
  return std::vector<uint8_t>(begin, begin + f.header.record_bytes);
}

Result<std::vector<uint8_t>> ReadSample(const SampleRecord& sample) {
  static SampleReader* reader = new SampleReader();  // never destroyed: workers may outlive main
  return reader->Read(sample);
}

}  // namespace carpool
