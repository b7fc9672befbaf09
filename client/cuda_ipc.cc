#include "client/cuda_ipc.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cctype>
#include <cstring>
#include <map>

#include "common/mutex.h"

namespace carpool {
namespace {

// The few driver API entry points used, declared here so that no CUDA header is needed. Types and
// values as in cuda.h (stable ABI since CUDA 4; the _v2 names since CUDA 11).
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUdeviceptr = unsigned long long;
struct CUipcMemHandle {
  char reserved[64];
};
constexpr unsigned kLazyEnablePeerAccess = 1;  // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS

struct Driver {
  CUresult (*Init)(unsigned) = nullptr;
  CUresult (*DeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*DeviceGetPCIBusId)(char*, int, CUdevice) = nullptr;
  CUresult (*PrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*PrimaryCtxRelease)(CUdevice) = nullptr;
  CUresult (*CtxPush)(CUcontext) = nullptr;
  CUresult (*CtxPop)(CUcontext*) = nullptr;
  CUresult (*IpcOpen)(CUdeviceptr*, CUipcMemHandle, unsigned) = nullptr;
  CUresult (*IpcClose)(CUdeviceptr) = nullptr;
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;
  Status status;

  std::string Error(CUresult r) const {
    const char* text = nullptr;
    if (GetErrorString != nullptr) GetErrorString(r, &text);
    return fmt::format("CUDA driver error {} ({})", r, text ? text : "unknown");
  }
};

template <typename F>
bool Load(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

const Driver& GetDriver() {
  static Driver* driver = [] {
    auto* d = new Driver();  // leaked on purpose: lives as long as the process
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      d->status = Status::Unavailable(fmt::format(
          "cannot load the CUDA driver (libcuda.so.1: {}); a GPU job needs an NVIDIA driver, or "
          "use device \"cpu\"",
          dlerror()));
      return d;
    }
    const bool ok = Load(lib, "cuInit", &d->Init) && Load(lib, "cuDeviceGet", &d->DeviceGet) &&
                    Load(lib, "cuDeviceGetPCIBusId", &d->DeviceGetPCIBusId) &&
                    Load(lib, "cuDevicePrimaryCtxRetain", &d->PrimaryCtxRetain) &&
                    Load(lib, "cuDevicePrimaryCtxRelease_v2", &d->PrimaryCtxRelease) &&
                    Load(lib, "cuCtxPushCurrent_v2", &d->CtxPush) &&
                    Load(lib, "cuCtxPopCurrent_v2", &d->CtxPop) &&
                    Load(lib, "cuIpcOpenMemHandle_v2", &d->IpcOpen) &&
                    Load(lib, "cuIpcCloseMemHandle", &d->IpcClose) &&
                    Load(lib, "cuGetErrorString", &d->GetErrorString);
    if (!ok) {
      d->status = Status::Unavailable(
          "the CUDA driver lacks an IPC entry point (driver too old?); update the NVIDIA driver");
      return d;
    }
    if (CUresult r = d->Init(0); r != 0) {
      d->status = Status::Unavailable(fmt::format("cuInit failed: {}", d->Error(r)));
    }
    return d;
  }();
  return *driver;
}

// Opened handles, shared by every job of this process that names the same allocation.
struct OpenMapping {
  CUdeviceptr base = 0;
  CUcontext context = nullptr;
  int device = -1;
  int refs = 0;
};
Mutex& MappingsMu() {
  static Mutex mu;
  return mu;
}
std::map<std::string, OpenMapping>& Mappings() REQUIRES(MappingsMu()) {
  static auto* m = new std::map<std::string, OpenMapping>();
  return *m;
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

Result<std::unique_ptr<DeviceSlotMapping>> DeviceSlotMapping::Open(const protocol::JobInfo& info) {
  const Driver& d = GetDriver();
  if (!d.status.ok()) return d.status;
  CUdevice dev = 0;
  if (CUresult r = d.DeviceGet(&dev, info.device); r != 0) {
    return Status::FailedPrecondition(fmt::format(
        "the server built this job's batches on CUDA device {}, which this process does not see "
        "({}); give the job and the server the same CUDA_VISIBLE_DEVICES",
        info.device, d.Error(r)));
  }
  char bus[32] = {0};
  if (CUresult r = d.DeviceGetPCIBusId(bus, sizeof(bus), dev); r != 0) {
    return Status::Unavailable(fmt::format("cuDeviceGetPCIBusId: {}", d.Error(r)));
  }
  if (Upper(bus) != Upper(info.device_pci_bus_id)) {
    return Status::FailedPrecondition(fmt::format(
        "CUDA device {} is {} in this process but {} in the server; give the job and the server "
        "the same CUDA_VISIBLE_DEVICES",
        info.device, bus, info.device_pci_bus_id));
  }
  std::unique_ptr<DeviceSlotMapping> m(new DeviceSlotMapping());
  m->device_ = info.device;
  m->stride_ = info.device_slot_stride;
  m->slot_bytes_ = info.device_slot_bytes;
  m->handle_ = info.device_handle;
  MutexLock lock(MappingsMu());
  OpenMapping& open = Mappings()[info.device_handle];
  if (open.refs == 0) {
    CUcontext ctx = nullptr;
    if (CUresult r = d.PrimaryCtxRetain(&ctx, dev); r != 0) {
      Mappings().erase(info.device_handle);
      return Status::Unavailable(fmt::format("cuDevicePrimaryCtxRetain: {}", d.Error(r)));
    }
    CUipcMemHandle handle{};
    std::memcpy(handle.reserved, info.device_handle.data(), sizeof(handle.reserved));
    CUdeviceptr ptr = 0;
    d.CtxPush(ctx);
    const CUresult opened = d.IpcOpen(&ptr, handle, kLazyEnablePeerAccess);
    CUcontext popped = nullptr;
    d.CtxPop(&popped);
    if (opened != 0) {
      d.PrimaryCtxRelease(dev);
      Mappings().erase(info.device_handle);
      return Status::Unavailable(fmt::format(
          "cannot open the server's device batch slots on CUDA device {} ({}); the server and "
          "the job must run on the same machine, and not in the same process",
          info.device, d.Error(opened)));
    }
    open = OpenMapping{ptr, ctx, info.device, 0};
  }
  ++open.refs;
  m->base_ = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(open.base)) + info.device_offset;
  return m;
}

DeviceSlotMapping::~DeviceSlotMapping() {
  const Driver& d = GetDriver();
  if (base_ == nullptr || !d.status.ok()) return;
  MutexLock lock(MappingsMu());
  auto it = Mappings().find(handle_);
  if (it == Mappings().end() || --it->second.refs > 0) return;
  d.CtxPush(it->second.context);
  d.IpcClose(it->second.base);
  CUcontext popped = nullptr;
  d.CtxPop(&popped);
  CUdevice dev = 0;
  if (d.DeviceGet(&dev, it->second.device) == 0) d.PrimaryCtxRelease(dev);
  Mappings().erase(it);
}

}  // namespace carpool
