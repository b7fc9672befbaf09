#include "datasets/file_resolver.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string_view>
#include <thread>
#include <unordered_map>

namespace carpool {

namespace {

constexpr size_t kChunk = 4096;
constexpr int32_t kNoDir = -1;

// Per-file outcome of the parallel check.
struct Check {
  int32_t dir = kNoDir;  // index into scan->dirs when found
  int err = 0;           // errno, or -1 for "not a regular file"
  bool slow = false;     // needs a full realpath (symlink or odd name)
  uint64_t size = 0;
};

struct Chunk {
  uint32_t group;
  size_t begin, end;  // range in the group's item list
};

std::string Reason(int err) {
  return err == -1 ? std::string("not a regular file") : std::string(std::strerror(err));
}

// Size of a readable regular file at `name` relative to `dirfd`, following nothing.
Check StatAt(int dirfd, const char* name) {
  Check c;
  struct stat st;
  if (::fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    c.err = errno;
  } else if (S_ISLNK(st.st_mode)) {
    c.slow = true;
  } else if (!S_ISREG(st.st_mode)) {
    c.err = -1;
  } else if (::faccessat(dirfd, name, R_OK, AT_EACCESS) != 0) {
    c.err = errno;
  } else {
    c.size = static_cast<uint64_t>(st.st_size);
  }
  return c;
}

class DirTable {
 public:
  explicit DirTable(SourceScan* scan) : scan_(scan) {
    for (size_t i = 0; i < scan->dirs.size(); ++i) index_.emplace(scan->dirs[i], i);
  }
  uint32_t Intern(std::string canonical) {
    auto [it, inserted] = index_.emplace(canonical, scan_->dirs.size());
    if (inserted) scan_->dirs.push_back(std::move(canonical));
    return static_cast<uint32_t>(it->second);
  }

 private:
  SourceScan* scan_;
  std::unordered_map<std::string, size_t> index_;
};

// Follows every symlink of `path`; on success fills dir index, name and size.
Check ResolveSlow(const std::string& path, DirTable* dirs, std::string* name) {
  Check c;
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) == nullptr) {
    c.err = errno;
    return c;
  }
  std::string_view real(buf);
  size_t slash = real.rfind('/');
  std::string dir(slash == 0 ? std::string_view("/") : real.substr(0, slash));
  *name = std::string(real.substr(slash + 1));
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    c.err = errno;
    return c;
  }
  c = StatAt(fd, name->c_str());
  ::close(fd);
  if (c.err == 0) c.dir = static_cast<int32_t>(dirs->Intern(std::move(dir)));
  return c;
}

}  // namespace

Status ResolveFiles(std::vector<RawFile> files, const std::filesystem::path& base, SourceScan* scan,
                    const ProgressFn& progress, unsigned threads) {
  const size_t n = files.size();
  DirTable dirs(scan);
  // Split into raw directory groups; names stay in `names`.
  std::vector<std::string> names(n);
  std::unordered_map<std::string, uint32_t> group_of;
  std::vector<std::string> group_dir;
  std::vector<std::vector<uint32_t>> group_items;
  std::vector<Check> checks(n);
  for (size_t i = 0; i < n; ++i) {
    std::string& p = files[i].path;
    if (p.empty() || p[0] != '/') p = (base / p).string();
    size_t slash = p.rfind('/');
    std::string_view name = std::string_view(p).substr(slash + 1);
    if (name.empty() || name == "." || name == "..") {
      checks[i].slow = true;
      continue;
    }
    names[i] = std::string(name);
    std::string dir = slash == 0 ? std::string("/") : p.substr(0, slash);
    auto [it, inserted] = group_of.emplace(std::move(dir), group_dir.size());
    if (inserted) {
      group_dir.push_back(it->first);
      group_items.emplace_back();
    }
    group_items[it->second].push_back(static_cast<uint32_t>(i));
  }
  // Canonicalize each raw directory once.
  std::vector<int32_t> group_canon(group_dir.size(), kNoDir);
  std::vector<int> group_err(group_dir.size(), 0);
  std::vector<Chunk> chunks;
  for (uint32_t g = 0; g < group_dir.size(); ++g) {
    char buf[PATH_MAX];
    if (::realpath(group_dir[g].c_str(), buf) == nullptr) {
      group_err[g] = errno;
    } else {
      group_canon[g] = static_cast<int32_t>(dirs.Intern(buf));
      for (size_t b = 0; b < group_items[g].size(); b += kChunk) {
        chunks.push_back({g, b, std::min(group_items[g].size(), b + kChunk)});
      }
    }
  }
  // Check the files in parallel, one directory fd per chunk.
  std::atomic<size_t> next_chunk{0}, done{0};
  std::atomic<int> open_errno{0};
  auto worker = [&] {
    for (size_t c = next_chunk++; c < chunks.size(); c = next_chunk++) {
      const Chunk& ch = chunks[c];
      const std::string& dir = scan->dirs[group_canon[ch.group]];
      int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (fd < 0) {
        int e = errno;
        if (e == EMFILE || e == ENFILE || e == ENOMEM) open_errno = e;
        for (size_t k = ch.begin; k < ch.end; ++k) checks[group_items[ch.group][k]].err = e;
      } else {
        for (size_t k = ch.begin; k < ch.end; ++k) {
          uint32_t i = group_items[ch.group][k];
          checks[i] = StatAt(fd, names[i].c_str());
          if (checks[i].err == 0 && !checks[i].slow) checks[i].dir = group_canon[ch.group];
        }
        ::close(fd);
      }
      done += ch.end - ch.begin;
    }
  };
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::future<void>> workers;
  for (unsigned t = 0; t < threads; ++t) workers.push_back(std::async(std::launch::async, worker));
  for (auto& w : workers) {
    while (w.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      if (progress) progress("checking files", done.load(), n);
    }
  }
  if (progress) progress("checking files", n, n);
  if (open_errno != 0) {
    return Status::ResourceExhausted(fmt::format(
        "cannot open directories while checking files: {}; raise the open-file limit (ulimit -n)",
        std::strerror(open_errno)));
  }
  for (uint32_t g = 0; g < group_dir.size(); ++g) {
    for (uint32_t i : group_items[g]) {
      if (group_err[g] != 0) checks[i].err = group_err[g];
    }
  }
  // Symlinks and odd names, then the results in input order.
  scan->samples.reserve(scan->samples.size() + n);
  for (size_t i = 0; i < n; ++i) {
    Check& c = checks[i];
    if (c.slow) c = ResolveSlow(files[i].path, &dirs, &names[i]);
    if (c.err != 0) {
      scan->unreadable.push_back(fmt::format("{}: {}", files[i].path, Reason(c.err)));
      continue;
    }
    scan->samples.push_back(
        {static_cast<uint32_t>(c.dir), std::move(names[i]), -1, c.size, files[i].label});
  }
  return Status::OK();
}

}  // namespace carpool
