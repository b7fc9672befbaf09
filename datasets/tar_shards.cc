#include "datasets/tar_shards.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <glob.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "datasets/image_dir.h"

namespace carpool {

namespace {

// ustar header fields: (offset, length).
constexpr size_t kNameOff = 0, kNameLen = 100;
constexpr size_t kModeOff = 100, kUidOff = 108, kGidOff = 116;
constexpr size_t kSizeOff = 124, kSizeLen = 12;
constexpr size_t kMtimeOff = 136;
constexpr size_t kSumOff = 148, kSumLen = 8;
constexpr size_t kTypeOff = 156;
constexpr size_t kMagicOff = 257;
constexpr size_t kPrefixOff = 345, kPrefixLen = 155;

uint64_t PaddedSize(uint64_t size) { return (size + kTarBlock - 1) / kTarBlock * kTarBlock; }

std::string_view Field(const uint8_t* h, size_t off, size_t len) {
  const char* p = reinterpret_cast<const char*>(h + off);
  return std::string_view(p, strnlen(p, len));
}

// Octal digits, optionally space- or NUL-padded; or GNU base-256 when the top bit is set.
bool ParseNumber(const uint8_t* h, size_t off, size_t len, uint64_t* out) {
  const uint8_t* p = h + off;
  if (p[0] & 0x80) {
    uint64_t v = p[0] & 0x7f;
    for (size_t i = 1; i < len; ++i) {
      if (v >> 56) return false;
      v = (v << 8) | p[i];
    }
    *out = v;
    return true;
  }
  size_t i = 0;
  while (i < len && p[i] == ' ') ++i;
  uint64_t v = 0;
  bool digits = false;
  for (; i < len && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (v >> 60) return false;
    v = v * 8 + (p[i] - '0');
    digits = true;
  }
  for (; i < len; ++i) {
    if (p[i] != ' ' && p[i] != '\0') return false;
  }
  *out = v;
  return digits;
}

bool ChecksumOk(const uint8_t* h) {
  uint64_t stored = 0;
  if (!ParseNumber(h, kSumOff, kSumLen, &stored)) return false;
  uint64_t sum = 0;
  for (size_t i = 0; i < kTarBlock; ++i) {
    sum += (i >= kSumOff && i < kSumOff + kSumLen) ? ' ' : h[i];
  }
  return sum == stored;
}

void PutOctal(uint8_t* h, size_t off, size_t len, uint64_t value) {
  std::string digits = fmt::format("{:0{}o}", value, len - 1);
  std::memcpy(h + off, digits.data(), len - 1);
  h[off + len - 1] = '\0';
}

// The WebDataset key and lowercased extension of a member name: "a/b.c.jpg" -> ("a/b", "c.jpg").
std::pair<std::string_view, std::string> SplitKey(std::string_view name) {
  size_t slash = name.rfind('/');
  size_t dot = name.find('.', slash == std::string_view::npos ? 0 : slash + 1);
  if (dot == std::string_view::npos) return {name, ""};
  std::string ext(name.substr(dot + 1));
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return {name.substr(0, dot), ext};
}

bool IsImageExt(std::string_view ext) { return ext == "jpg" || ext == "jpeg" || ext == "png"; }

class ShardFd {
 public:
  explicit ShardFd(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {}
  ~ShardFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ShardFd(const ShardFd&) = delete;
  ShardFd& operator=(const ShardFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

Result<size_t> PreadFully(int fd, uint64_t offset, size_t n, uint8_t* buf) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd, buf + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::IOError(std::strerror(errno));
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

struct ShardResult {
  std::string canonical;
  std::vector<SourceSample> samples;  // dir left 0; the merge sets it
  std::vector<std::string> problems;
  bool has_labels = false;
  int32_t max_label = -1;
};

// One label member's content as a non-negative decimal integer, or a problem line.
bool ParseLabel(std::string_view text, int32_t* label) {
  auto space = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *label);
  return ec == std::errc() && end == text.data() + text.size() && !text.empty() && *label >= 0;
}

constexpr uint64_t kMaxLabelBytes = 64;

ShardResult ScanShard(const std::string& path) {
  ShardResult r;
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) == nullptr) {
    r.problems.push_back(fmt::format("{}: {}", path, std::strerror(errno)));
    return r;
  }
  r.canonical = buf;
  ShardFd fd(r.canonical);
  struct stat st;
  if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0) {
    r.problems.push_back(fmt::format("{}: {}", r.canonical, std::strerror(errno)));
    return r;
  }
  if (!S_ISREG(st.st_mode)) {
    r.problems.push_back(fmt::format("{}: not a regular file", r.canonical));
    return r;
  }
  TarReadAt read_at = [&](uint64_t off, size_t n, uint8_t* out) {
    return PreadFully(fd.get(), off, n, out);
  };
  std::vector<TarMember> members;
  Status s = ListTarMembers(r.canonical, static_cast<uint64_t>(st.st_size), read_at, &members);
  if (!s.ok()) r.problems.push_back(s.message());
  struct Key {
    std::vector<const TarMember*> images;
    const TarMember* cls = nullptr;
  };
  std::map<std::string_view, Key> keys;  // sorted: problems come out in a stable order
  for (const TarMember& m : members) {
    auto [key, ext] = SplitKey(m.name);
    if (IsImageExt(ext)) keys[key].images.push_back(&m);
    if (ext == "cls") keys[key].cls = &m;
  }
  for (auto& [key, k] : keys) {
    int32_t label = -1;
    if (k.cls != nullptr) {
      r.has_labels = true;
      char text[kMaxLabelBytes];
      size_t n = static_cast<size_t>(std::min<uint64_t>(k.cls->size, kMaxLabelBytes));
      Result<size_t> got = read_at(k.cls->offset, n, reinterpret_cast<uint8_t*>(text));
      if (!got.ok() || *got != n || k.cls->size > kMaxLabelBytes ||
          !ParseLabel(std::string_view(text, n), &label)) {
        r.problems.push_back(fmt::format(
            "{}: member {}: label \"{}\" is not a non-negative decimal integer; skipped",
            r.canonical, k.cls->name, got.ok() ? std::string_view(text, *got) : "(unreadable)"));
        continue;
      }
      if (k.images.empty()) {
        r.problems.push_back(fmt::format(
            "{}: member {} has no image {}.jpg/.jpeg/.png beside it; skipped", r.canonical,
            k.cls->name, key));
        continue;
      }
      r.max_label = std::max(r.max_label, label);
    }
    for (const TarMember* img : k.images) {
      r.samples.push_back({0, img->name, -1, img->size, label, static_cast<int64_t>(img->offset)});
    }
  }
  return r;
}

// The records "LEN KEY=VALUE\n" of a pax extended header: `path` and `size` are kept.
Status ParsePaxRecords(std::string_view text, std::optional<std::string>* path, uint64_t* size) {
  while (!text.empty()) {
    uint64_t len = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), len);
    const size_t digits = static_cast<size_t>(end - text.data());
    if (ec != std::errc() || len <= digits + 1 || len > text.size() || text[digits] != ' ' ||
        text[len - 1] != '\n') {
      return Status::Corruption("a record is not \"LENGTH KEY=VALUE\\n\"");
    }
    std::string_view record = text.substr(digits + 1, len - digits - 2);
    text.remove_prefix(len);
    const size_t eq = record.find('=');
    if (eq == std::string_view::npos) return Status::Corruption("a record has no '='");
    std::string_view key = record.substr(0, eq), value = record.substr(eq + 1);
    if (key == "path") {
      *path = std::string(value);
    } else if (key == "size") {
      uint64_t v = 0;
      auto [e, err] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (err != std::errc() || e != value.data() + value.size()) {
        return Status::Corruption(fmt::format("size \"{}\" is not a number", value));
      }
      *size = v;
    }
  }
  return Status::OK();
}

}  // namespace

Status ListTarMembers(std::string_view shard, uint64_t shard_size, const TarReadAt& read_at,
                      std::vector<TarMember>* out) {
  uint8_t h[kTarBlock];
  uint64_t off = 0;
  // A pax ('x') or GNU ('L') extension header names the next member (Python's tarfile, and so
  // the webdataset library, writes pax headers); its path and size override the ustar fields.
  std::optional<std::string> next_name;
  constexpr uint64_t kNoSize = UINT64_MAX;
  uint64_t next_size = kNoSize;
  while (off < shard_size) {
    Result<size_t> got = read_at(off, kTarBlock, h);
    if (!got.ok()) {
      return Status::IOError(
          fmt::format("reading tar shard \"{}\" at byte {}: {}", shard, off, got.status().message()));
    }
    if (*got < kTarBlock) {
      return Status::Corruption(fmt::format(
          "tar shard \"{}\" is truncated: a header at byte {} ends past its size {}; re-create or "
          "re-copy the shard",
          shard, off, shard_size));
    }
    if (std::all_of(h, h + kTarBlock, [](uint8_t b) { return b == 0; })) return Status::OK();
    if (!ChecksumOk(h)) {
      return Status::Corruption(fmt::format(
          "tar shard \"{}\": the header at byte {} has a bad checksum; is it a tar file (ustar), "
          "and is it intact?",
          shard, off));
    }
    uint64_t size = 0;
    if (!ParseNumber(h, kSizeOff, kSizeLen, &size)) {
      return Status::Corruption(fmt::format("tar shard \"{}\": the header at byte {} has a bad size "
                                            "field; re-create the shard",
                                            shard, off));
    }
    char type = static_cast<char>(h[kTypeOff]);
    std::string name(Field(h, kNameOff, kNameLen));
    if (type == 'L' || type == 'K' || type == 'x' || type == 'g') {
      constexpr uint64_t kMaxExtension = uint64_t{1} << 20;
      if (size > kMaxExtension || off + kTarBlock + size > shard_size) {
        return Status::Corruption(fmt::format(
            "tar shard \"{}\": the extension header at byte {} claims {} bytes; is the shard "
            "intact?",
            shard, off, size));
      }
      std::string text(size, '\0');
      Result<size_t> read = read_at(off + kTarBlock, size, reinterpret_cast<uint8_t*>(text.data()));
      if (!read.ok() || *read != size) {
        return Status::IOError(fmt::format("reading tar shard \"{}\" at byte {}: {}", shard,
                                           off + kTarBlock,
                                           read.ok() ? "short read" : read.status().message()));
      }
      if (type == 'L') {
        next_name = std::string(text.c_str());  // NUL-terminated
      } else if (type == 'x') {
        if (Status parsed = ParsePaxRecords(text, &next_name, &next_size); !parsed.ok()) {
          return Status::Corruption(fmt::format("tar shard \"{}\": the pax header at byte {}: {}",
                                                shard, off, parsed.message()));
        }
      }  // 'K' (a long link name) and 'g' (global records) name no member of ours
      off += kTarBlock + PaddedSize(size);
      continue;
    }
    std::string_view magic = Field(h, kMagicOff, 6);
    std::string_view prefix = Field(h, kPrefixOff, kPrefixLen);
    if (magic == "ustar" && !prefix.empty()) name = fmt::format("{}/{}", prefix, name);
    if (next_name) name = *std::exchange(next_name, std::nullopt);
    if (next_size != kNoSize) size = std::exchange(next_size, kNoSize);
    uint64_t data = off + kTarBlock;
    if (size > shard_size || data + size > shard_size) {
      return Status::Corruption(fmt::format(
          "tar shard \"{}\" is truncated: member \"{}\" needs bytes {}..{} but the shard has {}; "
          "re-create or re-copy the shard",
          shard, name, data, data + size, shard_size));
    }
    if (type == '0' || type == '\0' || type == '7') out->push_back({std::move(name), data, size});
    off = data + PaddedSize(size);
  }
  return Status::OK();
}

Status ListTarMembersInMemory(std::string_view shard, std::span<const uint8_t> data,
                              std::vector<TarMember>* out) {
  auto read_at = [&](uint64_t off, size_t n, uint8_t* buf) -> Result<size_t> {
    const size_t got = off >= data.size() ? 0 : std::min<uint64_t>(n, data.size() - off);
    if (got > 0) std::memcpy(buf, data.data() + off, got);
    return got;
  };
  return ListTarMembers(shard, data.size(), read_at, out);
}

Result<std::vector<std::string>> ExpandShardPattern(std::string_view pattern) {
  size_t open = pattern.find('{');
  if (open != std::string_view::npos) {
    size_t close = pattern.find('}', open);
    size_t dots = pattern.find("..", open);
    std::string_view lo_s, hi_s;
    if (close != std::string_view::npos && dots != std::string_view::npos && dots < close) {
      lo_s = pattern.substr(open + 1, dots - open - 1);
      hi_s = pattern.substr(dots + 2, close - dots - 2);
    }
    uint64_t lo = 0, hi = 0;
    auto parse = [](std::string_view s, uint64_t* v) {
      auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
      return !s.empty() && ec == std::errc() && end == s.data() + s.size();
    };
    constexpr uint64_t kMaxShards = 1000000;
    if (!parse(lo_s, &lo) || !parse(hi_s, &hi) || lo > hi || hi - lo >= kMaxShards) {
      return Status::InvalidArgument(fmt::format(
          "shard pattern \"{}\" has a bad brace range; expected {{LO..HI}} with decimal LO <= HI "
          "and under {} shards, e.g. 'train-{{000000..000146}}.tar'",
          pattern, kMaxShards));
    }
    std::vector<std::string> out;
    for (uint64_t i = lo; i <= hi; ++i) {
      std::string one = fmt::format("{}{:0{}}{}", pattern.substr(0, open), i, lo_s.size(),
                                    pattern.substr(close + 1));
      Result<std::vector<std::string>> rest = ExpandShardPattern(one);
      if (!rest.ok()) return rest.status();
      out.insert(out.end(), rest->begin(), rest->end());
    }
    return out;
  }
  std::string p(pattern);
  if (p.find_first_of("*?[") == std::string::npos) return std::vector<std::string>{p};
  glob_t g{};
  int rc = ::glob(p.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  if (out.empty()) {
    return Status::NotFound(fmt::format(
        "shard pattern \"{}\" matches no file; check the path (quote it so that the shell does "
        "not expand it)",
        pattern));
  }
  std::sort(out.begin(), out.end());
  return out;
}

Result<SourceScan> ScanTarShards(const std::vector<std::string>& patterns,
                                 const ProgressFn& progress) {
  std::vector<std::string> shards;
  for (const std::string& p : patterns) {
    Result<std::vector<std::string>> expanded = ExpandShardPattern(p);
    if (!expanded.ok()) return expanded.status();
    shards.insert(shards.end(), expanded->begin(), expanded->end());
  }
  std::vector<ShardResult> results(shards.size());
  std::atomic<size_t> next{0}, done{0};
  auto worker = [&] {
    for (size_t i = next++; i < shards.size(); i = next++) {
      results[i] = ScanShard(shards[i]);
      ++done;
    }
  };
  unsigned threads = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(),
                                                     static_cast<unsigned>(shards.size())));
  std::vector<std::future<void>> workers;
  for (unsigned t = 0; t < threads; ++t) workers.push_back(std::async(std::launch::async, worker));
  for (auto& w : workers) {
    while (w.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      if (progress) progress("reading shards", done.load(), shards.size());
    }
  }
  if (progress) progress("reading shards", shards.size(), shards.size());

  SourceScan scan;
  scan.default_prepare = std::string(kImagePrepareDefault);
  bool labelled = std::any_of(results.begin(), results.end(),
                              [](const ShardResult& r) { return r.has_labels; });
  int32_t max_label = -1;
  for (ShardResult& r : results) {
    scan.unreadable.insert(scan.unreadable.end(), r.problems.begin(), r.problems.end());
    if (r.canonical.empty()) continue;
    uint32_t dir = static_cast<uint32_t>(scan.dirs.size());
    scan.dirs.push_back(r.canonical);
    for (SourceSample& smp : r.samples) {
      if (labelled && smp.label < 0) {
        scan.unreadable.push_back(fmt::format("{}: member {} has no {}.cls label; skipped",
                                              r.canonical, smp.name, SplitKey(smp.name).first));
        continue;
      }
      smp.dir = dir;
      scan.samples.push_back(std::move(smp));
    }
    max_label = std::max(max_label, r.max_label);
  }
  for (int32_t c = 0; c <= max_label; ++c) scan.classes.push_back(std::to_string(c));
  std::string what = patterns.size() == 1 ? patterns[0] : fmt::format("{} patterns", patterns.size());
  scan.description = fmt::format("tar {} ({} shards{})", what, shards.size(),
                                 labelled ? "" : ", unlabelled");
  return scan;
}

Status TarShardWriter::Add(std::string_view name, std::span<const uint8_t> data) {
  std::string_view prefix, base = name;
  if (name.size() > kNameLen) {
    size_t slash = name.rfind('/', kPrefixLen);
    if (slash == std::string_view::npos || name.size() - slash - 1 > kNameLen) {
      return Status::InvalidArgument(fmt::format(
          "tar member name \"{}\" does not fit a ustar header (name up to 100 bytes after a "
          "prefix up to 155); use a shorter name",
          name));
    }
    prefix = name.substr(0, slash);
    base = name.substr(slash + 1);
  }
  size_t at = bytes_.size();
  bytes_.resize(at + kTarBlock + PaddedSize(data.size()), 0);
  uint8_t* h = bytes_.data() + at;
  std::memcpy(h + kNameOff, base.data(), base.size());
  PutOctal(h, kModeOff, 8, 0644);
  PutOctal(h, kUidOff, 8, 0);
  PutOctal(h, kGidOff, 8, 0);
  PutOctal(h, kSizeOff, kSizeLen, data.size());
  PutOctal(h, kMtimeOff, 12, 0);
  h[kTypeOff] = '0';
  std::memcpy(h + kMagicOff, "ustar\0" "00", 8);
  // A short name has no prefix: a null view, which memcpy may not take even for 0 bytes (UBSan).
  if (!prefix.empty()) std::memcpy(h + kPrefixOff, prefix.data(), prefix.size());
  std::memset(h + kSumOff, ' ', kSumLen);
  uint64_t sum = 0;
  for (size_t i = 0; i < kTarBlock; ++i) sum += h[i];
  std::string chk = fmt::format("{:06o}", sum);
  std::memcpy(h + kSumOff, chk.data(), 6);
  h[kSumOff + 6] = '\0';
  if (!data.empty()) std::memcpy(h + kTarBlock, data.data(), data.size());
  return Status::OK();
}

std::vector<uint8_t> TarShardWriter::Finish() {
  bytes_.resize(bytes_.size() + 2 * kTarBlock, 0);
  std::vector<uint8_t> out;
  out.swap(bytes_);
  return out;
}

}  // namespace carpool
