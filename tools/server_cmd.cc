// `carpool server`: opens the catalog, creates the cache segment, starts the engine and the
// control plane, and runs until SIGINT or SIGTERM, then shuts down cleanly (jobs removed,
// segments unlinked, socket removed).
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <execinfo.h>
#include <pthread.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cctype>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>

#include "cache/client_access.h"
#include "common/log.h"
#include "datasets/catalog.h"
#include "datasets/state_dir.h"
#include "server/batch_pool.h"
#include "server/control_plane.h"
#include "server/engine.h"
#include "server/instance_name.h"
#include "server/metrics_http.h"
#include "server/metrics_text.h"
#include "tools/cache_fraction.h"
#include "tools/command.h"
#include "tools/options.h"
#include "tools/socket_path.h"

namespace carpool::tools {
namespace {

namespace po = boost::program_options;

constexpr std::string_view kUsage = R"(usage: carpool server [options]

Serves the registered datasets to jobs on a unix socket until SIGINT or SIGTERM.

options:
)";

int Fail(const Status& s) {
  fmt::print(stderr, "carpool server: {}\n", s.message());
  return 1;
}

// "2s", "500ms", "1.5s", "1m".
Result<std::chrono::milliseconds> ParseDuration(const std::string& flag, const std::string& text) {
  const Status bad = Status::InvalidArgument(
      fmt::format("{} \"{}\" is not a duration; expected e.g. 2s, 500ms or 1.5s", flag, text));
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    return bad;
  }
  const std::string unit = text.substr(used);
  double ms = 0;
  if (unit == "ms") {
    ms = value;
  } else if (unit == "s") {
    ms = value * 1e3;
  } else if (unit == "m") {
    ms = value * 60e3;
  } else {
    return bad;
  }
  if (!(ms >= 1 && ms <= 24 * 3600e3)) return bad;
  return std::chrono::milliseconds(static_cast<int64_t>(ms));
}

constexpr uint32_t kMaxWorkers = 1024;

// A crash report on stderr (the server's log): the signal and the stack as module+offset, which
// `addr2line -f -e carpool OFFSET` turns into functions. Async-signal-safe enough for a process
// that is about to die: backtrace() is primed at start so it does not allocate here.
void OnFatalSignal(int sig) {
  static const char kHead[] = "carpool server: fatal signal, backtrace follows\n";
  (void)!write(STDERR_FILENO, kHead, sizeof(kHead) - 1);
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  raise(sig);  // SA_RESETHAND: the default action (core dump) follows
}

void InstallCrashReport() {
  void* prime[1];
  (void)backtrace(prime, 1);
  struct sigaction sa{};
  sa.sa_handler = OnFatalSignal;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigaction(sig, &sa, nullptr);
}

int Serve(int argc, char** argv) {
  std::string state_dir, socket, cache_size = "1GiB", policy = "refcnt", lease = "2s";
  std::string gpus = "all", gpu_cache_size = "2GiB", metrics, rank_join_timeout = "60s", group;
  std::string pacing = "on", follow = "on", gpu_decode = "auto", gpu_decode_memory = "512MiB",
              job_decode = "on";
  uint32_t workers = 0, max_jobs = ControlPlaneOptions{}.max_jobs;
  uint64_t lookahead = kDefaultLookahead, seed = 1, partition_seed = kDefaultPartitionSeed;
  po::options_description opts;
  opts.add_options()("help,h", "show this help")(
      "state-dir", po::value(&state_dir), "catalog and socket directory (default: see docs)")(
      "socket", po::value(&socket), "unix socket path (default <state-dir>/carpool.sock)")(
      "group", po::value(&group),
      "share the socket with this group (a name or gid): mode 0660 and that group instead of "
      "0600, so its members' jobs can connect; the socket's directory must let them in. The "
      "shared memory stays the server's and each job's own (default: the server's user only)")(
      "cache-size", po::value(&cache_size),
      "shared-memory sample cache, e.g. 512MiB or 8GiB; 0 = no cache (default 1GiB)")(
      "workers", po::value(&workers), "preparation/assembly threads (default: number of cores)")(
      "lookahead", po::value(&lookahead),
      "look-ahead L in samples; overrides the derived one: the pacing window (the cache's "
      "capacity in samples less the pinned ones) plus twice the largest prefetch (default: "
      "derived, shown by `carpool status`)")(
      "pacing", po::value(&pacing),
      "on | off: hold a job that leads the jobs sharing its samples by more than the cache can "
      "hold for them (docs/scheduler.md); off is for comparison (default on)")(
      "follow", po::value(&follow),
      "on | off: a job joining mid-epoch copies a running job's order in its first epoch, so "
      "the two take their common samples together (docs/scheduler.md); off is for comparison "
      "(default on)")("policy", po::value(&policy),
                      "eviction policy: refcnt | next-use | lru (default refcnt)")(
      "seed", po::value(&seed), "the sampling tree's seed (default 1)")(
      "lease", po::value(&lease), "remove a job silent this long, e.g. 2s or 500ms (default 2s)")(
      "max-jobs", po::value(&max_jobs),
      "jobs at once (each holds a connection and a batch segment); more are refused with a "
      "retry message (default 64)")(
      "gpus", po::value(&gpus),
      "CUDA devices to build GPU jobs' batches on: all | none | 0,2,... (default all: every GPU "
      "found, none without one)")(
      "gpu-cache-size", po::value(&gpu_cache_size),
      "device-resident sample area per GPU, e.g. 4GiB; 0 = upload every use (default 2GiB)")(
      "gpu-decode", po::value(&gpu_decode),
      "auto | on | off: decode GPU jobs' JPEGs on their GPU with nvJPEG (the JPEG engines where "
      "the GPU has them); their samples are then prepared apart from CPU jobs' (decode=gpu, "
      "docs/gpu.md). auto: where libnvjpeg loads; on: fail to start without it (default auto)")(
      "job-decode", po::value(&job_decode),
      "on | off: with GPU decode, a GPU job's JPEGs are decoded in the job's own process (its "
      "CUDA context: beside training that costs the trainer a quarter of a decode in the server's "
      "context) where its client offers to and it is its GPU's only job; the server decodes what "
      "it does not; off under --group (default on)")(
      "gpu-decode-memory", po::value(&gpu_decode_memory),
      "device memory per GPU for decoded images awaiting their resize (default 512MiB)")(
      "metrics", po::value(&metrics),
      "serve Prometheus metrics at http://HOST:PORT/metrics, e.g. 127.0.0.1:9464 (default off)")(
      "rank-join-timeout", po::value(&rank_join_timeout),
      "fail a data-parallel job whose ranks have not all joined this long after the first, e.g. "
      "60s (default 60s)")(
      "partition-seed", po::value(&partition_seed),
      "seed of the cross-node partition of jobs that span several nodes; the same on every node "
      "of a sweep (default fixed)");
  po::variables_map vm;
  if (auto rc = ParseCommandLine(argc, argv, "carpool server", kUsage, opts, &vm)) return *rc;
  InstallCrashReport();
  EngineOptions eo;
  cache::ClientAccess access;  // of the socket
  if (vm.count("group") != 0) {
    Result<cache::ClientAccess> resolved = cache::ResolveClientGroup(group);
    if (!resolved.ok()) return Fail(resolved.status());
    access = *resolved;
  }
  Result<uint64_t> bytes = ParseByteCount("--cache-size", cache_size);
  if (!bytes.ok()) return Fail(bytes.status());
  eo.cache_bytes = *bytes;
  Result<cache::EvictionPolicy> p = cache::ParseEvictionPolicy(policy);
  if (!p.ok()) return Fail(p.status());
  eo.policy = *p;
  Result<std::chrono::milliseconds> lease_ms = ParseDuration("--lease", lease);
  if (!lease_ms.ok()) return Fail(lease_ms.status());
  Result<std::chrono::milliseconds> join_ms =
      ParseDuration("--rank-join-timeout", rank_join_timeout);
  if (!join_ms.ok()) return Fail(join_ms.status());
  eo.rank_join_timeout = *join_ms;
  eo.partition_seed = partition_seed;
  // For fault-injection tests only (docs/server.md "Failures"): tasks of these samples throw.
  if (const char* faults = std::getenv("CARPOOL_INJECT_FAULTS"); faults != nullptr && *faults) {
    Result<FaultInjection> parsed = FaultInjection::Parse(faults);
    if (!parsed.ok()) {
      return Fail(Status::InvalidArgument(
          fmt::format("CARPOOL_INJECT_FAULTS: {}", parsed.status().message())));
    }
    eo.faults = std::move(*parsed);
    log::Warn("CARPOOL_INJECT_FAULTS is set: {} (tests only)", eo.faults.ToString());
  }
  if (vm.count("lookahead") != 0 && lookahead == 0) {
    return Fail(Status::InvalidArgument(
        "--lookahead 0: the look-ahead must be at least 1 sample; leave the flag out for the "
        "derived one"));
  }
  if (Status s = SetOnOff("pacing", pacing, &eo.pacing); !s.ok()) return Fail(s);
  if (Status s = SetOnOff("follow", follow, &eo.follow); !s.ok()) return Fail(s);
  if (const Result<bool> decode = ParseOnOff("job-decode", job_decode); !decode.ok()) {
    return Fail(decode.status());
  }
  // Under --group other users' jobs read the resident samples a job decoded: only the server
  // decodes for them.
  eo.job_decode = job_decode == "on" && group.empty();
  if (job_decode == "on" && !group.empty()) {
    log::Info(
        "--group: JPEGs are decoded by the server only (--job-decode off), since a job's "
        "decoded samples would serve other users' jobs");
  }
  if (workers > kMaxWorkers) {
    return Fail(Status::InvalidArgument(fmt::format(
        "--workers {} is more than the limit of {}; 0 means one per core", workers, kMaxWorkers)));
  }
  eo.workers = workers;
  eo.lookahead = lookahead;
  eo.seed = seed;
  Result<std::vector<int>> gpu_list = ParseGpuList(gpus, VisibleGpuCount());
  if (!gpu_list.ok()) return Fail(gpu_list.status());
  eo.gpus = *gpu_list;
  Result<uint64_t> gpu_bytes = ParseByteCount("--gpu-cache-size", gpu_cache_size);
  if (!gpu_bytes.ok()) return Fail(gpu_bytes.status());
  eo.gpu_cache_bytes = *gpu_bytes;
  Result<GpuDecode> decode = ParseGpuDecode(gpu_decode);
  if (!decode.ok()) return Fail(decode.status());
  eo.gpu_decode = *decode;
  Result<uint64_t> decode_bytes = ParseByteCount("--gpu-decode-memory", gpu_decode_memory);
  if (!decode_bytes.ok()) return Fail(decode_bytes.status());
  if (*decode_bytes < (uint64_t{16} << 20)) {
    return Fail(Status::InvalidArgument(fmt::format(
        "--gpu-decode-memory {} is under 16 MiB; decoded photos take about 0.5 MiB each: use "
        "at least 64MiB",
        gpu_decode_memory)));
  }
  eo.gpu_decode_bytes = *decode_bytes;
  std::optional<MetricsAddress> metrics_address;
  if (!metrics.empty()) {
    Result<MetricsAddress> a = ParseMetricsAddress(metrics);
    if (!a.ok()) return Fail(a.status());
    metrics_address = *a;
  }

  Result<std::filesystem::path> dir = ResolveStateDir(state_dir);
  if (!dir.ok()) return Fail(dir.status());
  Result<std::string> socket_path = ResolveSocketPath(socket, dir->string());
  if (!socket_path.ok()) return Fail(socket_path.status());
  eo.instance = InstanceNameForSocket(*socket_path);
  if (access.group) {
    log::Info("server {}: the socket is mode 0660, group {} (gid {}); the shared memory stays "
              "0600",
              eo.instance, group, *access.group);
    if (std::string closed = cache::FirstDirClosedToGroup(*socket_path, *access.group);
        !closed.empty()) {
      log::Warn(
          "--group {}: its members cannot reach {}: the directory {} does not let them in; pass a "
          "--socket in a directory they may enter (docs/server.md, \"Sharing one server with a "
          "team\")",
          group, *socket_path, closed);
    }
  }
  Result<std::unique_ptr<Catalog>> catalog = Catalog::Open(*dir);
  if (!catalog.ok()) return Fail(catalog.status());

  // Block the stop signals in every thread (they inherit the mask); main waits for them below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  Result<std::unique_ptr<Engine>> engine = Engine::Create(eo, catalog->get());
  if (!engine.ok()) return Fail(engine.status());
  ControlPlaneOptions co;
  co.socket_path = *socket_path;
  co.instance = eo.instance;
  co.lease = *lease_ms;
  co.access = access;
  if (max_jobs == 0) {
    fmt::print(stderr, "carpool server: --max-jobs 0 admits no job; use 1 or more (default 64)\n");
    return 1;
  }
  co.max_jobs = max_jobs;
  // Bound but not yet accepting: batch segments of this instance can only be a crashed server's.
  co.before_accepting = [instance = eo.instance] {
    if (int removed = BatchPool::RemoveStaleSegments(instance); removed > 0) {
      log::Warn("server {}: removed {} batch segment(s) left by a crashed server", instance,
                removed);
    }
  };
  std::unique_ptr<MetricsListener> metrics_listener;
  if (metrics_address) {
    Result<std::unique_ptr<MetricsListener>> l = MetricsListener::Start(
        *metrics_address, [e = engine->get()] { return RenderPrometheus(e->Snapshot()); });
    if (!l.ok()) return Fail(l.status());
    metrics_listener = std::move(*l);
    log::Info("server {}: metrics at http://{}:{}/metrics", eo.instance, metrics_address->host,
              metrics_listener->port());
  }
  Result<std::unique_ptr<ControlPlane>> plane = ControlPlane::Start(co, engine->get());
  if (!plane.ok()) return Fail(plane.status());
  log::Info(
      "server {} listening on {} (cache {} bytes{}, policy {}, {} workers, look-ahead {}, pacing "
      "{}, follow {}, lease {} ms, GPUs: {})",
      eo.instance, *socket_path, eo.cache_bytes,
      (*engine)->cache_segment().empty() ? ", disabled" : ", segment " + (*engine)->cache_segment(),
      policy, eo.workers == 0 ? std::thread::hardware_concurrency() : eo.workers,
      eo.lookahead == 0 ? std::string("derived") : std::to_string(eo.lookahead), pacing, follow,
      lease_ms->count(), eo.gpus.empty() ? "none" : fmt::format("{}", fmt::join(eo.gpus, ",")));

  int signal = 0;
  sigwait(&stop_signals, &signal);
  log::Info("server {}: {} received, shutting down", eo.instance, strsignal(signal));
  if (metrics_listener) metrics_listener->Stop();  // before the engine it reads
  (*plane)->Stop();
  (*engine)->Stop();
  plane->reset();
  engine->reset();  // unlinks the cache segment
  return 0;
}

const CommandRegistrar kRegistrar("server", "serve registered datasets to training jobs", Serve);

}  // namespace
}  // namespace carpool::tools
