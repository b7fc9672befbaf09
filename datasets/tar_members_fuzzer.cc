// libFuzzer target for the tar member listing (CARPOOL_BUILD_FUZZERS, clang only; docs/fuzzing.md).
// Whatever the input, the listing must not crash, over-read or hit undefined behaviour; every
// member it lists, even before an error, must lie inside the shard, block-aligned, after the one
// before it and its header; and the shard cut just after the last member's data must list the
// same members without an error.
#include <algorithm>
#include <cstdlib>
#include <span>
#include <vector>

#include "datasets/tar_shards.h"

using carpool::kTarBlock;
using carpool::TarMember;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<TarMember> members;
  (void)carpool::ListTarMembersInMemory("fuzz.tar", std::span<const uint8_t>(data, size), &members);
  uint64_t end = 0;  // of the previous member's data
  for (const TarMember& m : members) {
    if (m.offset % kTarBlock != 0 || m.offset < end + kTarBlock || m.size > size ||
        m.offset > size - m.size) {
      std::abort();
    }
    end = m.offset + m.size;
  }
  if (members.empty()) return 0;
  const size_t cut = std::min<uint64_t>(size, (end + kTarBlock - 1) / kTarBlock * kTarBlock);
  std::vector<TarMember> again;
  carpool::Status s =
      carpool::ListTarMembersInMemory("fuzz.tar", std::span<const uint8_t>(data, cut), &again);
  if (!s.ok() || again.size() != members.size()) std::abort();
  for (size_t i = 0; i < again.size(); ++i) {
    if (again[i].name != members[i].name || again[i].offset != members[i].offset ||
        again[i].size != members[i].size) {
      std::abort();
    }
  }
  return 0;
}
