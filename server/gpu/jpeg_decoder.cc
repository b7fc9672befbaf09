#include "server/gpu/jpeg_decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "server/gpu/cuda_check.h"
#include "server/gpu/upload_runs.h"

#ifdef CARPOOL_HAVE_NVJPEG
#include <dlfcn.h>
#include <nvjpeg.h>

#include <mutex>
#endif

namespace carpool::gpu {

const char* JpegBackendName(JpegBackend backend) {
  return backend == JpegBackend::kHardware ? "hardware" : "gpu-hybrid";
}

const char* JpegOutputName(JpegOutput output) {
  switch (output) {
    case JpegOutput::kRgbInterleaved: return "rgbi";
    case JpegOutput::kYuvPlanar: return "yuv";
    case JpegOutput::kNv12: return "nv12";
  }
  return "unknown";
}

#ifndef CARPOOL_HAVE_NVJPEG

struct JpegDecoder::Impl {};

bool JpegDecoder::device_input() const { return false; }

Result<std::unique_ptr<JpegDecoder>> JpegDecoder::Create(uint32_t, const JpegDecoderOptions&) {
  return Status::Unavailable(
      "this carpool was built without nvJPEG (scripts/fetch_nvjpeg.sh could not fetch it at "
      "configure time); GPU decode is off and the CPU decodes");
}
JpegFacts JpegDecoder::Inspect(std::span<const uint8_t>) { return {false, 0, 0, 0, "no nvJPEG"}; }
Status JpegDecoder::DecodePlanes(std::span<const std::span<const uint8_t>>,
                                 std::span<const JpegPlanes>, JpegOutput, cudaStream_t) {
  return Status::Unavailable("this carpool was built without nvJPEG");
}

#else

namespace {

// The nvJPEG entry points carpool calls, from the library loaded at run time.
struct NvjpegApi {
  decltype(&nvjpegCreateEx) create_ex = nullptr;
  decltype(&nvjpegDestroy) destroy = nullptr;
  decltype(&nvjpegGetHardwareDecoderInfo) hardware_info = nullptr;
  decltype(&nvjpegJpegStateCreate) state_create = nullptr;
  decltype(&nvjpegJpegStateDestroy) state_destroy = nullptr;
  decltype(&nvjpegJpegStreamCreate) stream_create = nullptr;
  decltype(&nvjpegJpegStreamDestroy) stream_destroy = nullptr;
  decltype(&nvjpegJpegStreamParseHeader) parse_header = nullptr;
  decltype(&nvjpegJpegStreamGetJpegEncoding) encoding = nullptr;
  decltype(&nvjpegJpegStreamGetFrameDimensions) dimensions = nullptr;
  decltype(&nvjpegJpegStreamGetComponentsNum) components = nullptr;
  decltype(&nvjpegDecodeBatchedSupported) batched_supported = nullptr;
  decltype(&nvjpegDecodeBatchedInitialize) batched_initialize = nullptr;
  decltype(&nvjpegDecodeBatched) decode_batched = nullptr;
  decltype(&nvjpegDecodeBatchedPreAllocate) batched_preallocate = nullptr;
};

constexpr const char* kLibrary = "libnvjpeg.so.13";

// Loads the library once per process; the error names the library and what to do.
Result<const NvjpegApi*> LoadApi() {
  static std::once_flag once;
  static NvjpegApi api;
  static std::string error;
  std::call_once(once, [] {
    void* lib = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);  // kept for the process's life
    if (lib == nullptr) {
      error = fmt::format("{} did not load ({}); put it next to carpool's libraries (the bundle's "
                          "lib/) or on LD_LIBRARY_PATH, or run with --gpu-decode off",
                          kLibrary, dlerror());
      return;
    }
    auto bind = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (fn == nullptr && error.empty()) error = fmt::format("{} lacks {}", kLibrary, name);
    };
    bind(api.create_ex, "nvjpegCreateEx");
    bind(api.destroy, "nvjpegDestroy");
    bind(api.hardware_info, "nvjpegGetHardwareDecoderInfo");
    bind(api.state_create, "nvjpegJpegStateCreate");
    bind(api.state_destroy, "nvjpegJpegStateDestroy");
    bind(api.stream_create, "nvjpegJpegStreamCreate");
    bind(api.stream_destroy, "nvjpegJpegStreamDestroy");
    bind(api.parse_header, "nvjpegJpegStreamParseHeader");
    bind(api.encoding, "nvjpegJpegStreamGetJpegEncoding");
    bind(api.dimensions, "nvjpegJpegStreamGetFrameDimensions");
    bind(api.components, "nvjpegJpegStreamGetComponentsNum");
    bind(api.batched_supported, "nvjpegDecodeBatchedSupported");
    bind(api.batched_initialize, "nvjpegDecodeBatchedInitialize");
    bind(api.decode_batched, "nvjpegDecodeBatched");
    // Optional: only JpegDecoderOptions' pre-allocation needs it (Create says so if absent).
    api.batched_preallocate = reinterpret_cast<decltype(api.batched_preallocate)>(
        dlsym(lib, "nvjpegDecodeBatchedPreAllocate"));
  });
  if (!error.empty()) return Status::Unavailable(error);
  return &api;
}

const char* StatusName(nvjpegStatus_t s) {
  switch (s) {
    case NVJPEG_STATUS_SUCCESS: return "NVJPEG_STATUS_SUCCESS";
    case NVJPEG_STATUS_NOT_INITIALIZED: return "NVJPEG_STATUS_NOT_INITIALIZED";
    case NVJPEG_STATUS_INVALID_PARAMETER: return "NVJPEG_STATUS_INVALID_PARAMETER";
    case NVJPEG_STATUS_BAD_JPEG: return "NVJPEG_STATUS_BAD_JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED: return "NVJPEG_STATUS_JPEG_NOT_SUPPORTED";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE: return "NVJPEG_STATUS_ALLOCATOR_FAILURE";
    case NVJPEG_STATUS_EXECUTION_FAILED: return "NVJPEG_STATUS_EXECUTION_FAILED";
    case NVJPEG_STATUS_ARCH_MISMATCH: return "NVJPEG_STATUS_ARCH_MISMATCH";
    case NVJPEG_STATUS_INTERNAL_ERROR: return "NVJPEG_STATUS_INTERNAL_ERROR";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED: return "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM: return "NVJPEG_STATUS_INCOMPLETE_BITSTREAM";
  }
  return "an unknown nvjpegStatus_t";
}

}  // namespace

// The handle, the batched-decode state and a parse stream, each released by its own deleter.
struct JpegDecoder::Impl {
  const NvjpegApi* api = nullptr;
  nvjpegHandle_t handle = nullptr;
  nvjpegJpegState_t state = nullptr;
  nvjpegJpegStream_t parsed = nullptr;
  int initialized_batch = 0;  // the batch size the state was initialized for; 0: none yet
  nvjpegOutputFormat_t initialized_format = NVJPEG_OUTPUT_RGBI;
  bool device_input = false;  // NVJPEG_BACKEND_HARDWARE_DEVICE: JPEGs uploaded by Upload
  DeviceBuffer uploaded;      // a batch's JPEGs on the device (device_input)

  ~Impl() {
    if (parsed != nullptr) api->stream_destroy(parsed);
    if (state != nullptr) api->state_destroy(state);
    if (handle != nullptr) api->destroy(handle);
  }
};

JpegDecoder::JpegDecoder(std::unique_ptr<Impl> impl, JpegBackend backend, uint32_t max_batch)
    : impl_(std::move(impl)), backend_(backend), max_batch_(max_batch) {}

static nvjpegOutputFormat_t NvjpegFormat(JpegOutput output) {
  switch (output) {
    case JpegOutput::kRgbInterleaved: return NVJPEG_OUTPUT_RGBI;
    case JpegOutput::kYuvPlanar: return NVJPEG_OUTPUT_YUV;
    case JpegOutput::kNv12: return NVJPEG_OUTPUT_NV12;
  }
  return NVJPEG_OUTPUT_RGBI;
}

Result<std::unique_ptr<JpegDecoder>> JpegDecoder::Create(uint32_t max_batch,
                                                         const JpegDecoderOptions& options) {
  if (max_batch == 0) return Status::InvalidArgument("a JPEG decoder needs a batch of at least 1");
  Result<const NvjpegApi*> api = LoadApi();
  if (!api.ok()) return api.status();
  auto impl = std::make_unique<Impl>();
  impl->api = *api;
  JpegBackend backend = options.prefer;
  const unsigned flags = options.memory_pools ? NVJPEG_FLAGS_ENABLE_MEMORY_POOLS : 0;
  nvjpegStatus_t s = NVJPEG_STATUS_NOT_INITIALIZED;
  if (options.prefer == JpegBackend::kHardware && options.device_input) {
    s = impl->api->create_ex(NVJPEG_BACKEND_HARDWARE_DEVICE, nullptr, nullptr, flags,
                             &impl->handle);
    impl->device_input = s == NVJPEG_STATUS_SUCCESS;
    if (!impl->device_input) impl->handle = nullptr;
  }
  if (options.prefer == JpegBackend::kHardware && !impl->device_input) {
    s = impl->api->create_ex(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, flags, &impl->handle);
  }
  if (s != NVJPEG_STATUS_SUCCESS) {  // no JPEG engines on this GPU (or not asked for)
    impl->handle = nullptr;
    backend = JpegBackend::kGpuHybrid;
    s = impl->api->create_ex(NVJPEG_BACKEND_GPU_HYBRID, nullptr, nullptr, flags, &impl->handle);
    if (s != NVJPEG_STATUS_SUCCESS) {
      impl->handle = nullptr;
      return Status::Unavailable(
          fmt::format("nvJPEG could not start on this GPU: nvjpegCreateEx: {}", StatusName(s)));
    }
  }
  if ((s = impl->api->state_create(impl->handle, &impl->state)) != NVJPEG_STATUS_SUCCESS ||
      (s = impl->api->stream_create(impl->handle, &impl->parsed)) != NVJPEG_STATUS_SUCCESS) {
    return Status::Unavailable(fmt::format("nvJPEG state: {}", StatusName(s)));
  }
  if (backend == JpegBackend::kHardware && options.preallocate_width > 0 &&
      options.preallocate_height > 0) {
    if (impl->api->batched_preallocate == nullptr) {
      return Status::Unavailable(fmt::format(
          "{} lacks nvjpegDecodeBatchedPreAllocate; create the decoder without a pre-allocation",
          kLibrary));
    }
    s = impl->api->batched_preallocate(impl->handle, impl->state, static_cast<int>(max_batch),
                                       static_cast<int>(options.preallocate_width),
                                       static_cast<int>(options.preallocate_height),
                                       NVJPEG_CSS_420, NVJPEG_OUTPUT_RGBI);
    if (s != NVJPEG_STATUS_SUCCESS) {
      return Status::Unavailable(fmt::format("nvjpegDecodeBatchedPreAllocate({}, {}x{}): {}",
                                             max_batch, options.preallocate_width,
                                             options.preallocate_height, StatusName(s)));
    }
  }
  return std::unique_ptr<JpegDecoder>(new JpegDecoder(std::move(impl), backend, max_batch));
}

bool JpegDecoder::device_input() const { return impl_->device_input; }

namespace {

// Copies the JPEGs to `device` (grown as needed) on `stream`, one copy per run of JPEGs that lie
// together in host memory (PlanUploadRuns), and points data[i] at JPEG i's device copy. Later
// calls on the same stream reuse `device` after this call's decode.
Status Upload(std::span<const std::span<const uint8_t>> encoded, DeviceBuffer* device,
              cudaStream_t stream, std::vector<const unsigned char*>* data) {
  const UploadPlan plan = PlanUploadRuns(encoded);
  if (device->bytes() < plan.bytes) {
    const uint64_t bytes = std::max<uint64_t>(plan.bytes, 2 * device->bytes()) + (1 << 20);
    *device = DeviceBuffer{};  // cudaFree waits for the earlier decode that read it; size 0
    Result<DeviceBuffer> grown = DeviceBuffer::Allocate(bytes);
    if (!grown.ok()) return grown.status();
    *device = std::move(*grown);
  }
  auto* base = static_cast<uint8_t*>(device->data());
  for (const UploadRun& r : plan.runs) {
    if (Status s =
            CudaCheck(cudaMemcpyAsync(base + r.offset, reinterpret_cast<const void*>(r.begin),
                                      r.end - r.begin, cudaMemcpyHostToDevice, stream),
                      "cudaMemcpyAsync(JPEGs to the device)");
        !s.ok()) {
      return s;
    }
  }
  for (size_t i = 0; i < encoded.size(); ++i) (*data)[i] = base + plan.at[i];
  return Status::OK();
}

}  // namespace

JpegFacts JpegDecoder::Inspect(std::span<const uint8_t> encoded) {
  JpegFacts f;
  const NvjpegApi& api = *impl_->api;
  nvjpegStatus_t s =
      api.parse_header(impl_->handle, encoded.data(), encoded.size(), impl_->parsed);
  if (s != NVJPEG_STATUS_SUCCESS) {
    f.why = fmt::format("not a JPEG that nvJPEG parses ({})", StatusName(s));
    return f;
  }
  nvjpegJpegEncoding_t encoding = NVJPEG_ENCODING_UNKNOWN;
  unsigned int w = 0, h = 0, c = 0;
  api.encoding(impl_->parsed, &encoding);
  api.dimensions(impl_->parsed, &w, &h);
  api.components(impl_->parsed, &c);
  f.width = w;
  f.height = h;
  f.components = c;
  if (encoding != NVJPEG_ENCODING_BASELINE_DCT &&
      encoding != NVJPEG_ENCODING_EXTENDED_SEQUENTIAL_DCT_HUFFMAN) {
    f.why = encoding == NVJPEG_ENCODING_PROGRESSIVE_DCT_HUFFMAN ? "progressive JPEG"
            : encoding == NVJPEG_ENCODING_LOSSLESS_HUFFMAN    ? "lossless JPEG"
                                                              : "unknown JPEG encoding";
    return f;
  }
  if (c != 1 && c != 3) {
    f.why = fmt::format("{} colour components (CMYK or unusual)", c);
    return f;
  }
  if (w == 0 || h == 0) {
    f.why = "zero width or height";
    return f;
  }
  if (backend_ == JpegBackend::kHardware) {
    int unsupported = 1;
    s = api.batched_supported(impl_->handle, impl_->parsed, &unsupported);
    if (s != NVJPEG_STATUS_SUCCESS || unsupported != 0) {
      f.why = "a JPEG the hardware decoder does not take (410 or 411 sub-sampling, several scans)";
      return f;
    }
  }
  f.supported = true;
  return f;
}

Status JpegDecoder::DecodePlanes(std::span<const std::span<const uint8_t>> encoded,
                                 std::span<const JpegPlanes> out, JpegOutput format,
                                 cudaStream_t stream) {
  const size_t n = encoded.size();
  if (n == 0) return Status::OK();
  if (n > max_batch_ || out.size() != n) {
    return Status::InvalidArgument(fmt::format(
        "a batch of {} JPEGs with {} outputs, for a decoder of batch {}", n, out.size(),
        max_batch_));
  }
  const NvjpegApi& api = *impl_->api;
  const nvjpegOutputFormat_t nv_format = NvjpegFormat(format);
  nvjpegStatus_t s = NVJPEG_STATUS_SUCCESS;
  if (impl_->initialized_batch != static_cast<int>(n) || impl_->initialized_format != nv_format) {
    s = api.batched_initialize(impl_->handle, impl_->state, static_cast<int>(n), 1, nv_format);
    if (s != NVJPEG_STATUS_SUCCESS) {
      impl_->initialized_batch = 0;
      return Status::Internal(fmt::format("nvjpegDecodeBatchedInitialize({}, {}): {}", n,
                                          JpegOutputName(format), StatusName(s)));
    }
    impl_->initialized_batch = static_cast<int>(n);
    impl_->initialized_format = nv_format;
    ++initializations_;
  }
  std::vector<const unsigned char*> data(n);
  std::vector<size_t> lengths(n);
  std::vector<nvjpegImage_t> images(n);
  for (size_t i = 0; i < n; ++i) {
    data[i] = encoded[i].data();
    lengths[i] = encoded[i].size();
    images[i] = nvjpegImage_t{};
    for (int c = 0; c < 3; ++c) {
      images[i].channel[c] = out[i].data[c];
      images[i].pitch[c] = out[i].pitch[c];
    }
  }
  if (impl_->device_input) {
    if (Status u = Upload(encoded, &impl_->uploaded, stream, &data); !u.ok()) return u;
  }
  s = api.decode_batched(impl_->handle, impl_->state, data.data(), lengths.data(), images.data(),
                         stream);
  if (s != NVJPEG_STATUS_SUCCESS) {
    return Status::InvalidArgument(
        fmt::format("nvjpegDecodeBatched of {} JPEGs: {}", n, StatusName(s)));
  }
  return Status::OK();
}

#endif  // CARPOOL_HAVE_NVJPEG

JpegDecoder::~JpegDecoder() = default;

Result<std::unique_ptr<JpegDecoder>> JpegDecoder::Create(uint32_t max_batch, JpegBackend prefer) {
  JpegDecoderOptions options;
  options.prefer = prefer;
  return Create(max_batch, options);
}

Status JpegDecoder::DecodeBatch(std::span<const std::span<const uint8_t>> encoded,
                                std::span<uint8_t* const> out, std::span<const uint32_t> pitch,
                                cudaStream_t stream) {
  if (out.size() != encoded.size() || pitch.size() != encoded.size()) {
    return Status::InvalidArgument(fmt::format("a batch of {} JPEGs with {} outputs and {} pitches",
                                               encoded.size(), out.size(), pitch.size()));
  }
  std::vector<JpegPlanes> planes(encoded.size());
  for (size_t i = 0; i < encoded.size(); ++i) {
    planes[i].data[0] = out[i];
    planes[i].pitch[0] = pitch[i];
  }
  return DecodePlanes(encoded, planes, JpegOutput::kRgbInterleaved, stream);
}

}  // namespace carpool::gpu
