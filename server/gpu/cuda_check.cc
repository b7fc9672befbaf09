#include "server/gpu/cuda_check.h"

#include <cuda.h>
#include <fmt/core.h>

#include "common/log.h"

namespace carpool::gpu {
namespace {

std::string Describe(cudaError_t err, std::string_view what) {
  return fmt::format("{}: {} ({})", what, cudaGetErrorName(err), cudaGetErrorString(err));
}

}  // namespace

Status CudaCheck(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return Status::OK();
  cudaGetLastError();  // a non-sticky error must not resurface at the next check
  std::string message = Describe(err, what);
  switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInitializationError:
      return Status::Unavailable(std::move(message) +
                                 "; run on a machine with an NVIDIA GPU and driver, or use the "
                                 "CPU batch path");
    case cudaErrorMemoryAllocation:
      return Status::ResourceExhausted(std::move(message) + "; free device or pinned memory");
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorHostMemoryAlreadyRegistered:
    case cudaErrorHostMemoryNotRegistered:
      return Status::InvalidArgument(std::move(message));
    default:
      return Status::Internal(std::move(message));
  }
}

void CudaCheckNoThrow(cudaError_t err, std::string_view what) noexcept {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  try {
    log::Write(log::Level::kError, Describe(err, what));
  } catch (...) {  // formatting may allocate; a destructor must not throw
  }
}

void StreamTraits::Release(cudaStream_t s) noexcept {
  CudaCheckNoThrow(cudaStreamDestroy(s), "cudaStreamDestroy");
}

void EventTraits::Release(cudaEvent_t e) noexcept {
  CudaCheckNoThrow(cudaEventDestroy(e), "cudaEventDestroy");
}

void DeviceMemoryTraits::Release(void* p) noexcept { CudaCheckNoThrow(cudaFree(p), "cudaFree"); }

void PinnedMemoryTraits::Release(void* p) noexcept {
  CudaCheckNoThrow(cudaFreeHost(p), "cudaFreeHost");
}

void HostRegistrationTraits::Release(void* p) noexcept {
  CudaCheckNoThrow(cudaHostUnregister(p), "cudaHostUnregister");
}

Result<CudaStream> CudaStream::Create() {
  cudaStream_t s = nullptr;
  if (Status st = CudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                            "cudaStreamCreateWithFlags");
      !st.ok()) {
    return st;
  }
  return CudaStream(s);
}

Status CudaStream::Synchronize() const {
  return CudaCheck(cudaStreamSynchronize(get()), "cudaStreamSynchronize");
}

Result<CudaEvent> CudaEvent::Create(bool timing) {
  cudaEvent_t e = nullptr;
  const unsigned flags = timing ? cudaEventDefault : cudaEventDisableTiming;
  if (Status st = CudaCheck(cudaEventCreateWithFlags(&e, flags), "cudaEventCreateWithFlags");
      !st.ok()) {
    return st;
  }
  return CudaEvent(e);
}

Status CudaEvent::Record(cudaStream_t stream) const {
  return CudaCheck(cudaEventRecord(get(), stream), "cudaEventRecord");
}

Status CudaEvent::Synchronize() const {
  return CudaCheck(cudaEventSynchronize(get()), "cudaEventSynchronize");
}

Result<float> CudaEvent::ElapsedSince(const CudaEvent& start) const {
  float ms = 0;
  if (Status st = CudaCheck(cudaEventElapsedTime(&ms, start.get(), get()), "cudaEventElapsedTime");
      !st.ok()) {
    return st;
  }
  return ms;
}

Result<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  void* p = nullptr;
  if (Status st = CudaCheck(cudaMalloc(&p, bytes), fmt::format("cudaMalloc({} bytes)", bytes));
      !st.ok()) {
    return st;
  }
  return DeviceBuffer(p, bytes);
}

Result<PinnedHostBuffer> PinnedHostBuffer::Allocate(size_t bytes) {
  void* p = nullptr;
  if (Status st =
          CudaCheck(cudaMallocHost(&p, bytes), fmt::format("cudaMallocHost({} bytes)", bytes));
      !st.ok()) {
    return st;
  }
  return PinnedHostBuffer(p, bytes);
}

Result<HostRegistration> HostRegistration::Register(void* data, size_t bytes) {
  if (data == nullptr || bytes == 0) {
    return Status::InvalidArgument(
        fmt::format("cannot register host range {} of {} bytes; give a non-empty mapped range",
                    data, bytes));
  }
  // Portable: pinned for every device's context, so one registration serves all the GPUs (a
  // second cudaHostRegister of the range fails with cudaErrorHostMemoryAlreadyRegistered).
  if (Status st = CudaCheck(cudaHostRegister(data, bytes, cudaHostRegisterPortable),
                            fmt::format("cudaHostRegister({}, {} bytes)", data, bytes));
      !st.ok()) {
    return st;
  }
  return HostRegistration(data, bytes);
}

// The allocation that holds `p` (base, bytes), from the driver's cuMemGetAddressRange, reached
// through the runtime so that nothing links libcuda at build time.
Result<std::pair<uintptr_t, size_t>> AllocationRange(const void* p) {
  using Fn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static Fn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      f = nullptr;
    }
    return reinterpret_cast<Fn>(f);
  }();
  if (fn == nullptr) {
    return Status::Unavailable("the CUDA driver has no cuMemGetAddressRange; update the driver");
  }
  CUdeviceptr base = 0;
  size_t bytes = 0;
  if (CUresult r = fn(&base, &bytes, reinterpret_cast<CUdeviceptr>(p)); r != CUDA_SUCCESS) {
    return Status::Internal(
        fmt::format("cuMemGetAddressRange failed with error {}", static_cast<int>(r)));
  }
  return std::pair<uintptr_t, size_t>(static_cast<uintptr_t>(base), bytes);
}

}  // namespace carpool::gpu
