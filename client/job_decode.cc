#include "client/job_decode.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client/frame_socket.h"

namespace carpool {
namespace {

constexpr const char* kLibraryName = "libcarpool_job_decode.so";
constexpr int kMaxBatch = 256;  // nvJPEG's batch, as the server's decoder

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// $CARPOOL_JOB_DECODE_LIB, else beside the object holding this code (libcarpool.so, or a binary
// linking the client), else in ../lib from it (the bundle's bin/ and lib/). Empty: not found.
std::string FindLibrary() {
  if (const char* env = std::getenv("CARPOOL_JOB_DECODE_LIB"); env != nullptr && *env != 0) {
    return Exists(env) ? std::string(env) : std::string();
  }
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&FindLibrary), &info) == 0 || info.dli_fname == nullptr) {
    return {};
  }
  std::string self = info.dli_fname;
  const size_t slash = self.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : self.substr(0, slash);
  for (std::string candidate : {dir + "/" + kLibraryName, dir + "/../lib/" + kLibraryName}) {
    if (Exists(candidate)) return candidate;
  }
  return {};
}

}  // namespace

bool JobDecodeOffered() {
  if (const char* env = std::getenv("CARPOOL_JOB_DECODE");
      env != nullptr && env == std::string("0")) {
    return false;
  }
  return !FindLibrary().empty();
}

// The library's C ABI (server/gpu/job_decode_lib.cc), resolved once per process.
struct JobDecodeWorker::Library {
  void* (*open)(int, int, char*, int) = nullptr;
  int (*run)(void*, const char*, int, const uint8_t* const*, const uint64_t*, const uint32_t*,
             const uint64_t*, uint64_t, uint8_t*, char*, uint64_t*, uint64_t*, char*,
             int) = nullptr;
  void (*close)(void*) = nullptr;
  int (*segment)(void*, uint8_t*, uint64_t, char*, int) = nullptr;
  Status status;

  static const Library& Get() {
    static const Library* lib = [] {
      auto* l = new Library();  // leaked on purpose: the library stays loaded for the process
      const std::string path = FindLibrary();
      void* so = path.empty() ? nullptr : dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (so == nullptr) {
        l->status = Status::Unavailable(
            fmt::format("cannot load {} ({}); the server decodes this job's JPEGs instead",
                        kLibraryName, path.empty() ? "not found beside libcarpool" : dlerror()));
        return l;
      }
      l->open = reinterpret_cast<decltype(l->open)>(dlsym(so, "carpool_job_decode_open"));
      l->run = reinterpret_cast<decltype(l->run)>(dlsym(so, "carpool_job_decode_run"));
      l->close = reinterpret_cast<decltype(l->close)>(dlsym(so, "carpool_job_decode_close"));
      l->segment =
          reinterpret_cast<decltype(l->segment)>(dlsym(so, "carpool_job_decode_segment"));
      if (l->open == nullptr || l->run == nullptr || l->close == nullptr ||
          l->segment == nullptr) {
        l->status = Status::Unavailable(fmt::format(
            "{} lacks its entry points (another carpool version?); reinstall carpool", path));
      }
      return l;
    }();
    return *lib;
  }
};

JobDecodeWorker::JobDecodeWorker(int device, uint64_t job_id, FrameSocket* socket)
    : device_(device), job_id_(job_id), socket_(socket), thread_([this] { Run(); }) {}

JobDecodeWorker::~JobDecodeWorker() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();  // it closed the decoder: CUDA calls stay on its own thread
}

void JobDecodeWorker::Post(protocol::Message message, UniqueFd fd) {
  {
    MutexLock lock(mu_);
    queue_.push_back({std::move(message), std::move(fd)});
  }
  cv_.notify_all();
}

void JobDecodeWorker::Run() {
  for (;;) {
    Item item;
    {
      MutexLock lock(mu_);
      mu_.Wait(cv_, [this]() REQUIRES(mu_) { return stop_ || !queue_.empty(); });
      if (stop_) break;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    if (auto* seg = std::get_if<protocol::DecodeSegment>(&item.message)) {
      if (decoder_ != nullptr && segment_registered_) {  // unregistered before it is unmapped
        char err[256] = {0};
        (void)Library::Get().segment(decoder_, nullptr, 0, err, sizeof(err));
      }
      segment_registered_ = false;
      segment_.reset();
      Result<std::unique_ptr<protocol::SharedMapping>> mapped =
          protocol::SharedMapping::Map(item.fd.get(), seg->bytes, "the server's decode segment");
      if (mapped.ok()) segment_ = std::move(*mapped);  // else each work answers the failure
      if (!mapped.ok()) load_failure_ = mapped.status();
      continue;
    }
    if (auto* work = std::get_if<protocol::DecodeWork>(&item.message)) {
      // A send failure means the connection is gone: the reader thread reports it.
      (void)socket_->Send(Decode(*work));
    }
  }
  // Here, not in the destructor: the training thread's current CUDA device stays as it was.
  if (decoder_ != nullptr) Library::Get().close(decoder_);
  decoder_ = nullptr;
}

protocol::DecodeDone JobDecodeWorker::Decode(const protocol::DecodeWork& work) {
  protocol::DecodeDone done;
  done.job_id = job_id_;
  done.work_id = work.work_id;
  auto fail = [&](const Status& s) {
    done.code = s.code() == StatusCode::kOk ? StatusCode::kInternal : s.code();
    done.message = s.message();
    return done;
  };
  if (!load_failure_.ok()) return fail(load_failure_);
  const Library& lib = Library::Get();
  if (!lib.status.ok()) return fail(lib.status);
  if (decoder_ == nullptr) {
    char err[512] = {0};
    decoder_ = lib.open(device_, kMaxBatch, err, sizeof(err));
    if (decoder_ == nullptr) {
      load_failure_ = Status::Unavailable(fmt::format("GPU decode in this process: {}", err));
      return fail(load_failure_);
    }
  }
  if (segment_ == nullptr) {
    return fail(Status::FailedPrecondition("decode work came before its decode segment"));
  }
  if (!segment_registered_) {
    // Page-locked, nvJPEG's uploads of the JPEGs are DMA; without it they still work, slower.
    segment_registered_ = true;
    char err[512] = {0};
    if (lib.segment(decoder_, segment_->data(), segment_->size(), err, sizeof(err)) != 0) {
      std::fprintf(stderr, "carpool: the decode segment stays pageable: %s\n", err);
    }
  }
  const size_t n = work.items.size();
  std::vector<const uint8_t*> data(n);
  std::vector<uint64_t> lengths(n), offsets(n);
  std::vector<uint32_t> hwc(3 * n);
  for (size_t i = 0; i < n; ++i) {
    const protocol::DecodeItem& it = work.items[i];
    if (it.offset > segment_->size() || it.length > segment_->size() - it.offset) {
      return fail(Status::Corruption(
          fmt::format("decode item {} lies at [{}, +{}) outside the {}-byte decode segment", i,
                      it.offset, it.length, segment_->size())));
    }
    data[i] = segment_->data() + it.offset;
    lengths[i] = it.length;
    offsets[i] = it.dst_offset;
    hwc[3 * i] = it.height;
    hwc[3 * i + 1] = it.width;
    hwc[3 * i + 2] = it.channels;
  }
  std::vector<uint8_t> failed(n, 0);
  char handle[protocol::kIpcHandleBytes] = {0};
  uint64_t buffer_bytes = 0, buffer_offset = 0;
  char err[512] = {0};
  if (lib.run(decoder_, work.prepare.c_str(), static_cast<int>(n), data.data(), lengths.data(),
              hwc.data(), offsets.data(), work.output_bytes, failed.data(), handle, &buffer_bytes,
              &buffer_offset, err, sizeof(err)) != 0) {
    return fail(Status::Internal(fmt::format("GPU decode in this process failed: {}", err)));
  }
  done.buffer_handle.assign(handle, sizeof(handle));
  done.buffer_offset = buffer_offset;
  done.buffer_bytes = buffer_offset + buffer_bytes;  // of the allocation, from its base
  for (size_t i = 0; i < n; ++i) {
    if (failed[i] != 0) done.failed.push_back(static_cast<uint32_t>(i));
  }
  return done;
}

}  // namespace carpool
