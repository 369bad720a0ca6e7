// Helpers of the ExecuTorch tests and bench: devalloc's stats and snapshot as ExecuTorch's
// caller sees them, and which device types this machine gives the test.
#pragma once

#include <devalloc.h>
#include <devalloc_executorch.hpp>

#include <executorch/runtime/core/device_allocator.h>
#include <executorch/runtime/core/device_memory_buffer.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

// gtest prints a test's device type by name.
namespace executorch::runtime::etensor {
inline void PrintTo(DeviceType t, std::ostream* os) { *os << (t == DeviceType::CUDA ? "cuda" : "cpu"); }
}  // namespace executorch::runtime::etensor

namespace devalloc_test {

using executorch::runtime::DeviceMemoryBuffer;
using executorch::runtime::Error;
using executorch::runtime::etensor::DeviceType;

inline const char* name(DeviceType t) { return t == DeviceType::CUDA ? "cuda" : "cpu"; }

/// devalloc's stats of `type:0`; zeros (and a failed check in the caller) if it has none.
inline DevallocStats stats(DeviceType t) {
  DevallocStats s{};
  if (devalloc_stats(static_cast<DevallocDeviceType>(t), 0, &s) != DEVALLOC_STATUS_OK) {
    std::fprintf(stderr, "devalloc_stats(%s): %s\n", name(t), devalloc_last_error());
  }
  return s;
}

/// Whether the run must have every device type (the GPU bundle sets DEVALLOC_REQUIRE_ALL=1).
inline bool require_all() {
  const char* v = std::getenv("DEVALLOC_REQUIRE_ALL");
  return v != nullptr && std::string(v) == "1";
}

/// The live allocations of `type` in a snapshot devalloc wrote: (address, size) pairs read
/// from its `"live":[...]` array (flat objects, so the first ']' ends it).
struct Live {
  uint64_t addr;
  uint64_t size;
};

inline std::vector<Live> snapshot_live(DeviceType t, const std::string& path) {
  std::vector<Live> live;
  if (devalloc_snapshot_to_file(static_cast<DevallocDeviceType>(t), path.c_str()) != DEVALLOC_STATUS_OK) {
    std::fprintf(stderr, "devalloc_snapshot_to_file: %s\n", devalloc_last_error());
    return live;
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string json = text.str();
  size_t start = json.find("\"live\":[");
  size_t end = start == std::string::npos ? start : json.find(']', start);
  for (size_t at = json.find("\"addr\":\"", start); start != std::string::npos && at < end;
       at = json.find("\"addr\":\"", at + 1)) {
    uint64_t addr = std::strtoull(json.c_str() + at + 8, nullptr, 16);
    size_t size_at = json.find("\"size\":", at);
    live.push_back({addr, std::strtoull(json.c_str() + size_at + 7, nullptr, 10)});
  }
  return live;
}

/// The address ExecuTorch holds, as devalloc names it.
inline uint64_t addr(const void* p) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); }

}  // namespace devalloc_test
