// The client's mapping of a GPU job's device batch slots: the server's cudaMalloc, opened in this
// process from its legacy CUDA IPC handle. The CUDA driver (libcuda.so.1) is loaded with dlopen at
// the first GPU job, so libcarpool needs no CUDA at build or load time and a CPU-only machine
// never touches it. A process opens each IPC handle once (the driver refuses a second open of the
// same allocation), so mappings are shared and counted process-wide; the last one closes it.
// Thread-safe after Open; the destructor drops this job's reference (RAII).
#ifndef CARPOOL_CLIENT_CUDA_IPC_H_
#define CARPOOL_CLIENT_CUDA_IPC_H_

#include <cstdint>
#include <memory>
#include <string>

#include "carpool/status.h"
#include "protocol/protocol.h"

namespace carpool {

class DeviceSlotMapping {
 public:
  // Opens info.device_handle on CUDA device info.device of this process, after checking that the
  // device has the server's PCI bus id (the two processes must agree on CUDA_VISIBLE_DEVICES).
  // Unavailable without a driver; FailedPrecondition naming both bus ids on a mismatch. ~1 ms.
  static Result<std::unique_ptr<DeviceSlotMapping>> Open(const protocol::JobInfo& info);
  ~DeviceSlotMapping();
  DeviceSlotMapping(const DeviceSlotMapping&) = delete;
  DeviceSlotMapping& operator=(const DeviceSlotMapping&) = delete;

  int device() const { return device_; }
  uint8_t* base() const { return base_; }  // device address of slot 0
  uint64_t slot_stride() const { return stride_; }
  uint64_t slot_bytes() const { return slot_bytes_; }

 private:
  DeviceSlotMapping() = default;
  int device_ = -1;
  uint8_t* base_ = nullptr;  // slot 0: the mapping's base plus the job's offset
  uint64_t stride_ = 0, slot_bytes_ = 0;
  std::string handle_;  // key of the shared mapping
};

}  // namespace carpool

#endif  // CARPOOL_CLIENT_CUDA_IPC_H_
