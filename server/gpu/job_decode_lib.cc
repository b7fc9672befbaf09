// libcarpool_job_decode.so: the server's GPU decode path (BatchDecoder: nvJPEG, then the exact
// resize and crop of the dataset's prepare spec) for a job's own process, which libcarpool loads
// with dlopen when the server sends it decode work (server/job_decode.h says why). It runs in the
// process's primary CUDA context, the one PyTorch uses. What nvJPEG refuses is reported back for
// the server to decode: the training process never decodes on its CPU.
//
// A C ABI, so that the client library needs neither CUDA nor nvJPEG to build or load. One
// decoder per job; its calls come from one thread at a time (the job's decode thread).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "datasets/prepare_spec.h"
#include "server/gpu/batch_decoder.h"
#include "server/gpu/cuda_check.h"

namespace {

using namespace carpool;

constexpr uint64_t kGranule = uint64_t{2} << 20;  // whole 2 MiB pages: an allocation of its own

struct JobDecodeState {
  int device = 0;
  std::string spec_text;
  PrepareSpec spec;
  std::unique_ptr<gpu::BatchDecoder> decoder;
  gpu::CudaStream stream;
  gpu::DeviceBuffer buffer;  // the decoded pixels the server copies out
  gpu::HostRegistration segment;  // the decode segment, page-locked: nvJPEG's uploads are DMA
  char handle[64] = {};      // buffer's cudaIpcMemHandle_t
  uint64_t buffer_offset = 0;  // of the buffer in the allocation the handle names
  // Totals for CARPOOL_JOB_DECODE_TRACE (printed at close): where a decode call's time goes.
  uint64_t calls = 0;
  gpu::DecodeCounts totals;
  double sync_s = 0, run_s = 0;
};

// With CARPOOL_JOB_DECODE_TRACE set, one line on stderr: the decoder's phases per call.
void PrintTrace(const JobDecodeState& s) {
  const char* trace = std::getenv("CARPOOL_JOB_DECODE_TRACE");
  if (trace == nullptr || *trace == '\0' || s.calls == 0) return;
  const double ms = 1e3 / double(s.calls);
  std::fprintf(
      stderr,
      "carpool job decode (%s%s): %llu calls, %llu images (%llu refused), ms a call: run %.2f "
      "= header parse %.2f + nvJPEG %.2f + resize launch %.2f + wait %.2f + stream "
      "%.2f; %llu nvJPEG re-initializations\n",
      s.decoder->backend().c_str(), s.decoder->device_input() ? ", JPEGs from device memory" : "",
      (unsigned long long)s.calls, (unsigned long long)s.totals.gpu,
      (unsigned long long)s.totals.failed, s.run_s * ms, s.totals.inspect_s * ms,
      s.totals.decode_s * ms, s.totals.resize_s * ms, s.totals.wait_s * ms, s.sync_s * ms,
      (unsigned long long)s.decoder->initializations());
}

int Fail(const Status& s, char* err, int err_len) {
  std::snprintf(err, static_cast<size_t>(err_len), "%s", s.ToString().c_str());
  return -1;
}

Status OnDevice(int device) {
  return gpu::CudaCheck(cudaSetDevice(device), "cudaSetDevice (job decode)");
}

}  // namespace

// Opens a decoder on CUDA device `device` of this process, batches of up to `max_batch` JPEGs
// (the nvJPEG handle, its batched state, a stream). Null with the reason in err on failure.
extern "C" void* carpool_job_decode_open(int device, int max_batch, char* err, int err_len) {
  auto fail = [&](const Status& s) -> void* {
    Fail(s, err, err_len);
    return nullptr;
  };
  if (max_batch < 1) return fail(Status::InvalidArgument("max_batch must be at least 1"));
  if (Status s = OnDevice(device); !s.ok()) return fail(s);
  Result<std::unique_ptr<gpu::JpegDecoder>> d = gpu::JpegDecoder::Create(uint32_t(max_batch));
  if (!d.ok()) return fail(d.status());
  Result<gpu::CudaStream> stream = gpu::CudaStream::Create();
  if (!stream.ok()) return fail(stream.status());
  auto state = std::make_unique<JobDecodeState>();
  state->device = device;
  state->stream = std::move(*stream);
  state->decoder = std::make_unique<gpu::BatchDecoder>(std::move(*d), uint64_t{512} << 20,
                                                       /*cpu_fallback=*/false);
  return state.release();
}

// The nvJPEG backend the decoder uses ("hardware" or "gpu-hybrid").
extern "C" int carpool_job_decode_backend(void* handle, char* out, int out_len) {
  auto* state = static_cast<JobDecodeState*>(handle);
  std::snprintf(out, static_cast<size_t>(out_len), "%s", state->decoder->backend().c_str());
  return 0;
}

// Page-locks the decode segment [data, data + bytes) that the JPEGs will lie in (once per
// segment: the server's own cache segment is registered for the same reason), replacing the one
// registered before. Unregisters it with data null. Returns 0, or -1 with the reason in err.
extern "C" int carpool_job_decode_segment(void* handle, uint8_t* data, uint64_t bytes, char* err,
                                          int err_len) {
  auto* state = static_cast<JobDecodeState*>(handle);
  if (Status s = OnDevice(state->device); !s.ok()) return Fail(s, err, err_len);
  state->segment.Reset();
  if (data == nullptr) return 0;
  Result<gpu::HostRegistration> reg = gpu::HostRegistration::Register(data, bytes);
  if (!reg.ok()) return Fail(reg.status(), err, err_len);
  state->segment = std::move(*reg);
  return 0;
}

// Decodes n JPEGs (host bytes data[i], lengths[i]) prepared by `spec` to hwc[3i..3i+2] uint8
// pixels at dst_offsets[i] of the decode buffer, which it first grows to at least output_bytes,
// and waits for them. failed[i] is set to 1 for a JPEG it left undecoded (nvJPEG refused it),
// else 0. handle_out (64 bytes) gets the buffer's IPC handle, *buffer_bytes its size and
// *buffer_offset where it starts in the allocation the handle names.
// Returns 0, or -1 with the reason in err (a CUDA error: nothing decoded is to be trusted).
extern "C" int carpool_job_decode_run(void* handle, const char* spec, int n,
                                      const uint8_t* const* data, const uint64_t* lengths,
                                      const uint32_t* hwc, const uint64_t* dst_offsets,
                                      uint64_t output_bytes, uint8_t* failed, char* handle_out,
                                      uint64_t* buffer_bytes, uint64_t* buffer_offset, char* err,
                                      int err_len) {
  auto* state = static_cast<JobDecodeState*>(handle);
  const auto run_start = std::chrono::steady_clock::now();
  if (Status s = OnDevice(state->device); !s.ok()) return Fail(s, err, err_len);
  if (state->spec_text != spec) {
    Result<PrepareSpec> parsed = ParsePrepareSpec(spec);
    if (!parsed.ok()) return Fail(parsed.status(), err, err_len);
    state->spec = *parsed;
    state->spec_text = spec;
  }
  if (state->buffer.bytes() < output_bytes) {
    state->buffer.Reset();  // cudaFree: the server copied out of it before this work came
    const uint64_t bytes = (output_bytes + kGranule - 1) / kGranule * kGranule;
    Result<gpu::DeviceBuffer> buf = gpu::DeviceBuffer::Allocate(bytes);
    if (!buf.ok()) return Fail(buf.status(), err, err_len);
    state->buffer = std::move(*buf);
    cudaIpcMemHandle_t h{};
    if (Status s = gpu::CudaCheck(cudaIpcGetMemHandle(&h, state->buffer.data()),
                                  "cudaIpcGetMemHandle(job decode buffer)");
        !s.ok()) {
      state->buffer.Reset();
      return Fail(s, err, err_len);
    }
    std::memcpy(state->handle, &h, sizeof(h));
    // The handle names the allocation holding the buffer, which whole pages normally make the
    // buffer's own; where the driver placed it inside a larger one, the server needs the offset.
    Result<std::pair<uintptr_t, size_t>> range = gpu::AllocationRange(state->buffer.data());
    if (!range.ok()) {
      state->buffer.Reset();
      return Fail(range.status(), err, err_len);
    }
    state->buffer_offset = reinterpret_cast<uintptr_t>(state->buffer.data()) - range->first;
  }
  auto* base = static_cast<uint8_t*>(state->buffer.data());
  std::vector<gpu::DecodeTarget> targets;
  targets.reserve(size_t(n));
  for (int i = 0; i < n; ++i) {
    const PreparedShape shape{int(hwc[3 * i]), int(hwc[3 * i + 1]), int(hwc[3 * i + 2])};
    if (dst_offsets[i] + shape.bytes() > state->buffer.bytes()) {
      return Fail(Status::InvalidArgument(
                      "a decode item lies outside the decode buffer (a server bug: report it)"),
                  err, err_len);
    }
    targets.push_back({size_t(i), {data[i], size_t(lengths[i])}, shape, base + dst_offsets[i]});
  }
  std::vector<std::pair<size_t, Status>> refused;
  // Decode adds its phases to the totals the trace prints.
  Status s =
      state->decoder->Decode(state->spec, targets, state->stream.get(), &refused, &state->totals);
  const auto sync_start = std::chrono::steady_clock::now();
  if (s.ok()) s = state->stream.Synchronize();
  const auto end = std::chrono::steady_clock::now();
  ++state->calls;
  state->sync_s += std::chrono::duration<double>(end - sync_start).count();
  state->run_s += std::chrono::duration<double>(end - run_start).count();
  if (!s.ok()) return Fail(s, err, err_len);
  std::memset(failed, 0, size_t(n));
  for (const auto& [index, why] : refused) failed[index] = 1;
  std::memcpy(handle_out, state->handle, sizeof(state->handle));
  *buffer_bytes = state->buffer.bytes();
  *buffer_offset = state->buffer_offset;
  return 0;
}

extern "C" void carpool_job_decode_close(void* handle) {
  auto* state = static_cast<JobDecodeState*>(handle);
  if (state == nullptr) return;
  int current = -1;  // the calling thread's device, given back after
  const bool known = cudaGetDevice(&current) == cudaSuccess;
  (void)OnDevice(state->device);
  PrintTrace(*state);
  delete state;
  if (known) (void)cudaSetDevice(current);
}
