// The cost of the boundary: an allocate + free of a cached size through ExecuTorch's interface
// (its DeviceAllocator, and its DeviceMemoryBuffer::create + destructor) beside the same cycle
// called from Rust on the same allocator (devalloc_selftest_cycle). Rounds alternate between
// the ways and the medians are printed, with the ratio: a figure, reported, not judged (a
// cycle is tens of nanoseconds, and a shared or throttled machine moves it by more than the
// boundary costs). It fails only when an allocation fails.
//
//   executorch_bench [iterations per round, default 100000]
#include "support.hpp"

#include <executorch/runtime/platform/runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

using namespace devalloc_test;
using executorch::runtime::get_device_allocator;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename F>
double ns_per_cycle(uint64_t iterations, F cycle) {
  auto start = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < iterations; i++) cycle();
  std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
  return took.count() / static_cast<double>(iterations);
}

int bench(DeviceType type, uint64_t iterations) {
  constexpr size_t kSize = 4096;
  constexpr int kRounds = 15;
  const size_t align = executorch::runtime::DeviceAllocator::kDefaultAlignment;
  auto* a = get_device_allocator(type);
  int failures = 0;
  // Warm the cache: the size's block is made once, then every cycle reuses it.
  a->deallocate(a->allocate(kSize, 0).get(), 0);
  std::vector<double> rust, raw, buffer;
  for (int round = 0; round < kRounds; round++) {
    uint64_t total_ns = 0;
    if (devalloc_selftest_cycle(static_cast<DevallocDeviceType>(type), 0, kSize, align, iterations, &total_ns) != DEVALLOC_STATUS_OK) {
      std::fprintf(stderr, "devalloc_selftest_cycle: %s\n", devalloc_last_error());
      return 1;
    }
    rust.push_back(static_cast<double>(total_ns) / static_cast<double>(iterations));
    raw.push_back(ns_per_cycle(iterations, [&] {
      auto r = a->allocate(kSize, 0);
      if (!r.ok()) failures++;
      a->deallocate(r.get(), 0);
    }));
    buffer.push_back(ns_per_cycle(iterations, [&] {
      auto r = DeviceMemoryBuffer::create(kSize, type);
      if (!r.ok()) failures++;
    }));
  }
  DevallocStats s = stats(type);
  double r = median(rust), et = median(raw), buf = median(buffer);
  std::printf("bench %s: allocate+free of %zu bytes (cached), medians of %d rounds of %llu:\n", name(type), kSize,
              kRounds, (unsigned long long)iterations);
  std::printf("  from Rust (devalloc_selftest_cycle)                      %7.1f ns\n", r);
  std::printf("  through ExecuTorch's DeviceAllocator (adapter + C ABI)   %7.1f ns  (%.2fx Rust)\n", et, et / r);
  std::printf("  through ExecuTorch's DeviceMemoryBuffer::create + free   %7.1f ns  (%.2fx Rust)\n", buf, buf / r);
  std::printf("  (ratios are figures, not pass/fail); cache hits %llu of %llu allocations; failures %d\n",
              (unsigned long long)s.cache_hits, (unsigned long long)s.allocations, failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  executorch::runtime::runtime_init();
  uint64_t iterations = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 100000;
  if (iterations == 0) iterations = 1;
  devalloc::executorch::register_available();
  int status = bench(DeviceType::CPU, iterations);
  if (get_device_allocator(DeviceType::CUDA) != nullptr) status |= bench(DeviceType::CUDA, iterations);
  return status;
}
