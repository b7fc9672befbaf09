// Fault injection for tests: catalog ids whose preparation, batch assembly or GPU batch build
// throws inside its worker task, as a bad_alloc or a library's logic error would. The engine's
// fault barrier must then fail exactly the jobs that need those samples (docs/server.md
// "Failures"). And `repeat`: a CPU batch holding one of those ids delivers it twice, in place of
// its neighbour in the batch, as a sampling bug would: the negative control of the clients'
// exactly-once checks. Set by tests, or by CARPOOL_INJECT_FAULTS in a server started for a test;
// empty in production. Thread-compatible value type.
#ifndef CARPOOL_SERVER_FAULT_INJECTION_H_
#define CARPOOL_SERVER_FAULT_INJECTION_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>

#include "carpool/status.h"

namespace carpool {

struct FaultInjection {
  std::unordered_set<uint32_t> prepare, assemble, gpu_build, repeat;

  bool empty() const {
    return prepare.empty() && assemble.empty() && gpu_build.empty() && repeat.empty();
  }
  // Throws std::runtime_error naming the site and the sample when `id` is in `site`. O(1).
  static void MaybeThrow(const std::unordered_set<uint32_t>& site, std::string_view name,
                         uint32_t id);
  std::string ToString() const;  // the form Parse reads
  // "prepare=3,17;assemble=40;gpu_build=5;repeat=8", any subset, in any order. InvalidArgument
  // naming the bad part and the accepted form.
  static Result<FaultInjection> Parse(std::string_view text);
};

}  // namespace carpool

#endif  // CARPOOL_SERVER_FAULT_INJECTION_H_
