// `carpool dataset bench`: times registering a --list of N existing (empty) files, the
// ImageNet-train size by default, against a plain single-threaded stat() loop over the same
// paths measured in the same run. Prints a Markdown table (docs/benchmarks.md).
#include <fcntl.h>
#include <fmt/core.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "datasets/file_list.h"
#include "tools/dataset_cmd.h"

namespace carpool::tools {

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string FileName(uint64_t i) { return fmt::format("img_{:08}.JPEG", i); }
std::string ClassDir(uint64_t c) { return fmt::format("n{:05}", c); }

// Creates `count` empty files spread over `classes` folders and a list.csv naming them.
Status MakeFiles(const fs::path& root, uint64_t count, uint64_t classes, bool quiet) {
  ProgressBar bar(quiet);
  std::string list = "path,label\n";
  list.reserve(count * 32);
  for (uint64_t c = 0; c < classes; ++c) {
    fs::path dir = root / ClassDir(c);
    if (::mkdir(dir.c_str(), 0755) != 0) {
      return Status::IOError(fmt::format("cannot create \"{}\"", dir.string()));
    }
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    for (uint64_t i = c; i < count; i += classes) {
      std::string name = FileName(i);
      int fd = ::openat(dfd, name.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
      if (fd < 0) {
        ::close(dfd);
        return Status::IOError(fmt::format(
            "cannot create \"{}/{}\" (out of inodes or space?); pass --dir on a roomier disk",
            dir.string(), name));
      }
      ::close(fd);
      list += fmt::format("{}/{},{}\n", ClassDir(c), name, c);
    }
    ::close(dfd);
    bar.Update("creating files", (c + 1) * count / classes, count);
  }
  std::ofstream(root / "list.csv", std::ios::binary).write(list.data(), list.size());
  return Status::OK();
}

// The baseline: one stat() per path, single-threaded, as a naive registration would do.
Result<double> StatLoop(const fs::path& root, uint64_t count, uint64_t classes) {
  Clock::time_point t = Clock::now();
  for (uint64_t i = 0; i < count; ++i) {
    std::string path = fmt::format("{}/{}/{}", root.string(), ClassDir(i % classes), FileName(i));
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      return Status::IOError(fmt::format("stat \"{}\" failed in the baseline", path));
    }
  }
  return Since(t);
}

struct Timed {
  double scan = 0, write = 0;
  uint64_t samples = 0;
};

Result<Timed> Register(const fs::path& root, const std::string& name, bool quiet) {
  Timed t;
  Clock::time_point start = Clock::now();
  Result<std::unique_ptr<Catalog>> catalog = Catalog::Open(root / "state");
  if (!catalog.ok()) return catalog.status();
  ProgressBar bar(quiet);
  Result<SourceScan> scan = ReadFileList(root / "list.csv", bar.Fn());
  if (!scan.ok()) return scan.status();
  t.scan = Since(start);
  Clock::time_point write = Clock::now();
  DatasetMeta meta{name, "resize=256,crop=256", scan->classes, scan->description};
  Result<RegisterReport> r = (*catalog)->Register(meta, *scan, false, bar.Fn());
  bar.Done();
  if (!r.ok()) return r.status();
  t.write = Since(write);
  t.samples = r->info.ids.cardinality();
  return t;
}

}  // namespace

int DatasetBench(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--tar") return DatasetBenchTar(argc, argv);
  }
  uint64_t count = 1281167, classes = 1000;
  std::string base = fs::temp_directory_path().string();
  bool keep = false, quiet = false;
  po::options_description opts("carpool dataset bench [options]");
  opts.add_options()("help,h", "show this help")("count", po::value(&count)->default_value(count),
                                                 "files to register")(
      "classes", po::value(&classes)->default_value(classes), "class folders")(
      "dir", po::value(&base)->default_value(base), "where to create the temporary tree")(
      "keep", po::bool_switch(&keep), "keep the tree")("quiet,q", po::bool_switch(&quiet),
                                                       "no progress bar");
  po::variables_map vm;
  if (std::optional<int> rc = ParseVerbArgs("bench", argc, argv, opts, {}, &vm)) return *rc;
  if (count == 0 || classes == 0 || classes > count) {
    return UsageError("bench", "need 1 <= --classes <= --count");
  }
  std::string tmpl = (fs::path(base) / "carpool-bench-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return Fail("bench", Status::IOError(fmt::format("cannot create a temp dir in \"{}\"", base)));
  }
  fs::path root = tmpl;
  fs::create_directory(root / "state");
  Clock::time_point t0 = Clock::now();
  Status s = MakeFiles(root, count, classes, quiet);
  double create = Since(t0);
  Result<double> stat_loop = s.ok() ? StatLoop(root, count, classes) : Result<double>(s);
  Result<Timed> first = stat_loop.ok() ? Register(root, "bench", quiet) : stat_loop.status();
  Result<Timed> again = first.ok() ? Register(root, "bench-again", quiet) : first.status();
  int rc = 0;
  if (!again.ok()) {
    rc = Fail("bench", again.status());
  } else {
    double base_s = *stat_loop, reg = first->scan + first->write,
           rereg = again->scan + again->write;
    auto row = [&](std::string_view what, double secs) {
      fmt::print("| {:<38} | {:>9} | {:>7.2f} | {:>9.0f} | {:>6.2f} |\n", what, count, secs,
                 count / secs, secs / base_s);
    };
    fmt::print("files: {} in {} folders under {} ({} cores); creating them took {:.1f} s\n\n",
               count, classes, root.string(), std::thread::hardware_concurrency(), create);
    fmt::print("| {:<38} | {:>9} | {:>7} | {:>9} | {:>6} |\n", "step", "files", "seconds",
               "files/s", "vs stat");
    fmt::print("|{:-<40}|{:->11}|{:->9}|{:->11}|{:->8}|\n", "", ":", ":", ":", ":");
    row("baseline: plain stat() loop, 1 thread", base_s);
    row("register --list, new samples", reg);
    row("  read list + canonicalize + check", first->scan);
    row("  write catalog (one transaction)", first->write);
    row("register --list again, known samples", rereg);
    fmt::print("\nregistered {} samples in {:.2f} s: {} the 10 s target\n", first->samples, reg,
               reg <= 10.0 ? "meets" : "MISSES");
  }
  if (!keep) {
    std::error_code ec;
    fs::remove_all(root, ec);
  } else {
    fmt::print("kept {}\n", root.string());
  }
  return rc;
}

}  // namespace carpool::tools
