// The CUDA error discipline of server/gpu (after DALI's cuda_error.h): every runtime call goes
// through CudaCheck, which turns an error into a Status naming the call; destructors use
// CudaCheckNoThrow, which logs and never fails. Also RAII handles for streams, events, device
// buffers, pinned host buffers and host registrations (cudaHostRegister of an existing range).
// Handles are move-only, thread-compatible; a moved-from handle owns nothing.
#ifndef CARPOOL_SERVER_GPU_CUDA_CHECK_H_
#define CARPOOL_SERVER_GPU_CUDA_CHECK_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "carpool/status.h"

namespace carpool::gpu {

// OK for cudaSuccess; otherwise Unavailable for "no device / no driver" errors, ResourceExhausted
// for out-of-memory, InvalidArgument for bad values and Internal for the rest, with the message
// "<what>: <cudaErrorName> (<cudaErrorString>)". Clears the sticky last error of the thread.
Status CudaCheck(cudaError_t err, std::string_view what);

// For destructors and other places that cannot return: logs a failure on stderr and returns.
void CudaCheckNoThrow(cudaError_t err, std::string_view what) noexcept;

// Base of the handles below: owns one value and releases it with Traits::Release (no-throw).
template <typename T, typename Traits>
class CudaHandle {
 public:
  CudaHandle() = default;
  explicit CudaHandle(T value) : value_(value) {}
  CudaHandle(CudaHandle&& other) noexcept : value_(std::exchange(other.value_, T{})) {}
  CudaHandle& operator=(CudaHandle&& other) noexcept {
    if (this != &other) {
      Reset();
      value_ = std::exchange(other.value_, T{});
    }
    return *this;
  }
  CudaHandle(const CudaHandle&) = delete;
  CudaHandle& operator=(const CudaHandle&) = delete;
  ~CudaHandle() { Reset(); }

  T get() const { return value_; }
  explicit operator bool() const { return value_ != T{}; }
  void Reset() noexcept {
    if (value_ != T{}) Traits::Release(std::exchange(value_, T{}));
  }

 private:
  T value_{};
};

struct StreamTraits {
  static void Release(cudaStream_t s) noexcept;
};
struct EventTraits {
  static void Release(cudaEvent_t e) noexcept;
};

// A non-blocking stream (no implicit sync with the legacy default stream) on the current device.
class CudaStream : public CudaHandle<cudaStream_t, StreamTraits> {
 public:
  using CudaHandle::CudaHandle;
  static Result<CudaStream> Create();
  Status Synchronize() const;
};

// An event without timing unless `timing` is true.
class CudaEvent : public CudaHandle<cudaEvent_t, EventTraits> {
 public:
  using CudaHandle::CudaHandle;
  static Result<CudaEvent> Create(bool timing = false);
  Status Record(cudaStream_t stream) const;
  Status Synchronize() const;
  // Milliseconds from start to this event; both must have been created with timing.
  Result<float> ElapsedSince(const CudaEvent& start) const;
};

struct DeviceMemoryTraits {
  static void Release(void* p) noexcept;
};
struct PinnedMemoryTraits {
  static void Release(void* p) noexcept;
};
struct HostRegistrationTraits {
  static void Release(void* p) noexcept;
};

// A sized byte range released with Traits; the common shape of the three memory handles.
template <typename Traits>
class CudaMemory : public CudaHandle<void*, Traits> {
 public:
  CudaMemory() = default;
  CudaMemory(void* p, size_t bytes) : CudaHandle<void*, Traits>(p), bytes_(bytes) {}
  CudaMemory(CudaMemory&& other) noexcept
      : CudaHandle<void*, Traits>(std::move(other)), bytes_(std::exchange(other.bytes_, 0)) {}
  CudaMemory& operator=(CudaMemory&& other) noexcept {
    CudaHandle<void*, Traits>::operator=(std::move(other));
    bytes_ = std::exchange(other.bytes_, 0);
    return *this;
  }
  void* data() const { return this->get(); }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_ = 0;
};

// cudaMalloc'd memory on the current device.
class DeviceBuffer : public CudaMemory<DeviceMemoryTraits> {
 public:
  using CudaMemory::CudaMemory;
  static Result<DeviceBuffer> Allocate(size_t bytes);
};

// cudaMallocHost'd (page-locked) host memory.
class PinnedHostBuffer : public CudaMemory<PinnedMemoryTraits> {
 public:
  using CudaMemory::CudaMemory;
  static Result<PinnedHostBuffer> Allocate(size_t bytes);
};

// Page-locks an existing host range (e.g. the cache segment) so that copies from it are DMA.
// The range must outlive the registration; unregistered on destruction.
class HostRegistration : public CudaMemory<HostRegistrationTraits> {
 public:
  using CudaMemory::CudaMemory;
  // REQUIRES: [data, data + bytes) is mapped host memory not already registered.
  static Result<HostRegistration> Register(void* data, size_t bytes);
};

// The allocation that holds `p`: (its base, its bytes), from the driver's cuMemGetAddressRange
// (reached through the runtime: nothing links libcuda at build time). ~1 us.
Result<std::pair<uintptr_t, size_t>> AllocationRange(const void* p);

}  // namespace carpool::gpu

#endif  // CARPOOL_SERVER_GPU_CUDA_CHECK_H_
