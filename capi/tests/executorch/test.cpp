// ExecuTorch 1.5.1's own runtime (libexecutorch.so, the wheel's headers) allocating through
// devalloc: the adapter is registered with ExecuTorch's register_device_allocator, memory comes
// from ExecuTorch's DeviceMemoryBuffer::create and get_device_allocator, and devalloc's stats and
// snapshot must show exactly what ExecuTorch asked for. Every test runs on CPU and, where
// register_available found one, CUDA (DEVALLOC_REQUIRE_ALL=1: CUDA must be there).
#include "support.hpp"

#include <executorch/runtime/platform/runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <unistd.h>

using namespace devalloc_test;
using devalloc::executorch::adapter;
using executorch::runtime::get_device_allocator;

namespace {

int g_registered = 0;

/// A copy between buffers through ExecuTorch's own virtual where its header declares one (its
/// main branch), else through the adapter's method (1.5.1): a template, so that the branch not
/// taken is never compiled.
template <typename Base>
Error device_to_device(Base* et, void* dst, const void* src, size_t nbytes) {
  if constexpr (devalloc::executorch::detail::has_device_to_device<Base>::value) {
    return et->copy_device_to_device(dst, 0, src, 0, nbytes);
  } else {
    return adapter(et->device_type()).copy_device_to_device(dst, 0, src, 0, nbytes);
  }
}

class OnDevice : public ::testing::TestWithParam<DeviceType> {
 protected:
  void SetUp() override {
    if (get_device_allocator(GetParam()) == nullptr) {
      if (require_all()) FAIL() << name(GetParam()) << " is not registered and DEVALLOC_REQUIRE_ALL=1";
      GTEST_SKIP() << "SKIPPED on " << name(GetParam()) << ": devalloc has no such device here";
    }
    ASSERT_EQ(devalloc_empty_cache(static_cast<DevallocDeviceType>(GetParam()), nullptr), DEVALLOC_STATUS_OK);
    before_ = stats(GetParam());
    refused_ = adapter(GetParam()).refused_frees();
  }
  // Every test leaves devalloc as it found it: nothing ExecuTorch asked for is still held.
  void TearDown() override {
    if (IsSkipped()) return;
    DevallocStats after = stats(GetParam());
    EXPECT_EQ(after.live_allocations, before_.live_allocations) << "a buffer was leaked";
    EXPECT_EQ(after.allocated_bytes, before_.allocated_bytes);
  }
  executorch::runtime::DeviceAllocator* et() { return get_device_allocator(GetParam()); }
  DeviceMemoryBuffer create(size_t n, size_t alignment = executorch::runtime::DeviceAllocator::kDefaultAlignment) {
    auto r = DeviceMemoryBuffer::create(n, GetParam(), 0, alignment);
    EXPECT_TRUE(r.ok()) << "create(" << n << ") = " << static_cast<int>(r.error());
    return r.ok() ? std::move(r.get()) : DeviceMemoryBuffer();
  }
  DevallocStats before_{};
  uint64_t refused_ = 0;
};

TEST(Registration, ThroughExecuTorchsOwnRegistry) {
  ASSERT_GE(g_registered, 1) << "CPU at least";
  EXPECT_EQ(get_device_allocator(DeviceType::CPU), &adapter(DeviceType::CPU));
  EXPECT_EQ(get_device_allocator(DeviceType::CPU)->device_type(), DeviceType::CPU);
  if (get_device_allocator(DeviceType::CUDA) != nullptr) {
    EXPECT_EQ(get_device_allocator(DeviceType::CUDA), &adapter(DeviceType::CUDA));
    EXPECT_EQ(g_registered, 2);
  } else {
    // ExecuTorch's own answer for a type nobody registered.
    EXPECT_EQ(DeviceMemoryBuffer::create(64, DeviceType::CUDA).error(), Error::NotFound);
  }
  // A second call registers nothing, and ExecuTorch's registry does not abort.
  EXPECT_EQ(devalloc::executorch::register_available(), 0);
  std::printf("registered through ExecuTorch's register_device_allocator: %d (cpu%s)\n", g_registered,
              g_registered == 2 ? ", cuda" : "");
}

TEST(Registration, ErrorsMapToExecuTorchs) {
  using devalloc::executorch::to_error;
  EXPECT_EQ(to_error(DEVALLOC_STATUS_OK), Error::Ok);
  EXPECT_EQ(to_error(DEVALLOC_STATUS_OUT_OF_MEMORY), Error::MemoryAllocationFailed);
  EXPECT_EQ(to_error(DEVALLOC_STATUS_TOO_LARGE), Error::MemoryAllocationFailed);
  EXPECT_EQ(to_error(DEVALLOC_STATUS_INVALID_ARGUMENT), Error::InvalidArgument);
  EXPECT_EQ(to_error(DEVALLOC_STATUS_INVALID_POINTER), Error::InvalidArgument);
  EXPECT_EQ(to_error(DEVALLOC_STATUS_OUT_OF_BOUNDS), Error::InvalidArgument);
  EXPECT_EQ(to_error(DEVALLOC_STATUS_NO_SUCH_DEVICE), Error::InvalidArgument);
  EXPECT_EQ(to_error(DEVALLOC_STATUS_NOT_FOUND), Error::NotFound);
  EXPECT_EQ(to_error(DEVALLOC_STATUS_NOT_SUPPORTED), Error::NotSupported);
  EXPECT_EQ(to_error(DEVALLOC_STATUS_DEVICE_LOST), Error::AccessFailed);
  EXPECT_EQ(to_error(DEVALLOC_STATUS_IO), Error::AccessFailed);
  EXPECT_EQ(to_error(DEVALLOC_STATUS_BACKEND), Error::Internal);
  EXPECT_EQ(to_error(DEVALLOC_STATUS_INTERNAL), Error::Internal);
  EXPECT_EQ(to_error(static_cast<DevallocStatus>(99)), Error::Internal);
}

/// The statuses a call really returns, mapped: IO (a snapshot that cannot be written) is
/// AccessFailed, INTERNAL (a panic caught at the boundary) is Internal. BACKEND is a driver's or
/// wgpu's own failure, which no call on CPU memory can be made to return: its mapping is
/// checked above.
TEST(Registration, StatusesThatCallsReturnMapToExecuTorchs) {
  using devalloc::executorch::to_error;
  DevallocStatus io = devalloc_snapshot_to_file(DEVALLOC_DEVICE_TYPE_ALL, "/nonexistent-devalloc-dir/snap.json");
  ASSERT_EQ(io, DEVALLOC_STATUS_IO) << devalloc_last_error();
  EXPECT_NE(std::strstr(devalloc_last_error(), "nonexistent-devalloc-dir"), nullptr) << devalloc_last_error();
  EXPECT_EQ(to_error(io), Error::AccessFailed);
  DevallocStatus internal = devalloc_selftest_panic();
  ASSERT_EQ(internal, DEVALLOC_STATUS_INTERNAL);
  EXPECT_EQ(to_error(internal), Error::Internal);
}

/// Freed by its destructor after main returns: the adapter must still be there then (a
/// static adapter destroyed first made this a "pure virtual method called" abort).
DeviceMemoryBuffer g_outlives_main;

TEST(Registration, AStaticBufferFreesAfterMain) {
  auto made = DeviceMemoryBuffer::create(4096, DeviceType::CPU);
  ASSERT_TRUE(made.ok());
  g_outlives_main = std::move(made.get());
  EXPECT_EQ(g_outlives_main.size(), 4096u);
}

/// devalloc_shutdown() under ExecuTorch: its calls then fail with NotFound, a buffer made before
/// it is refused when freed (counted, never a crash), and register_available() opens devalloc
/// again without registering anything twice.
TEST(Registration, ShutdownThenRegisterAvailableAgain) {
  auto made = DeviceMemoryBuffer::create(4096, DeviceType::CPU);
  ASSERT_TRUE(made.ok());
  DeviceMemoryBuffer before = std::move(made.get());
  uint64_t refused = adapter(DeviceType::CPU).refused_frees();
  ASSERT_EQ(devalloc_shutdown(), DEVALLOC_STATUS_OK);
  EXPECT_EQ(DeviceMemoryBuffer::create(64, DeviceType::CPU).error(), Error::NotFound);
  { DeviceMemoryBuffer gone = std::move(before); }  // its destructor's free: refused
  EXPECT_EQ(adapter(DeviceType::CPU).refused_frees(), refused + 1);
  EXPECT_EQ(devalloc::executorch::register_available(), 0);
  auto again = DeviceMemoryBuffer::create(64, DeviceType::CPU);
  EXPECT_TRUE(again.ok());
  EXPECT_EQ(stats(DeviceType::CPU).live_allocations, 1u);
}

TEST(Registration, NoPanicReachesCpp) {
  EXPECT_EQ(devalloc_selftest_panic(), DEVALLOC_STATUS_INTERNAL);
  EXPECT_NE(std::strstr(devalloc_last_error(), "on purpose"), nullptr) << devalloc_last_error();
}

TEST_P(OnDevice, CopiesBothWaysAndBetweenBuffersThroughInteriorPointers) {
  DeviceMemoryBuffer a = create(4096);
  DeviceMemoryBuffer b = create(4096, 256);
  ASSERT_NE(a.data(), nullptr);
  EXPECT_EQ(a.size(), 4096u);
  EXPECT_EQ(addr(a.data()) % executorch::runtime::DeviceAllocator::kDefaultAlignment, 0u);
  EXPECT_EQ(addr(b.data()) % 256, 0u);
  std::vector<uint8_t> data(1000), back(1000, 0);
  for (size_t i = 0; i < data.size(); i++) data[i] = static_cast<uint8_t>(i * 7 + 3);
  // A tensor at an offset into the buffer, as a memory plan places it (as_span's arithmetic).
  uint8_t* tensor = a.as_span().data() + 512;
  ASSERT_EQ(et()->copy_host_to_device(tensor, data.data(), data.size(), 0), Error::Ok);
  ASSERT_EQ(et()->copy_device_to_host(back.data(), tensor, back.size(), 0), Error::Ok);
  EXPECT_EQ(back, data);
  // Between buffers: ExecuTorch's virtual where its header has one, else the adapter's (1.5.1).
  uint8_t* b_mid = static_cast<uint8_t*>(b.data()) + 100;
  ASSERT_EQ(device_to_device(et(), b_mid, tensor + 10, 500), Error::Ok);
  std::vector<uint8_t> moved(500, 0);
  ASSERT_EQ(et()->copy_device_to_host(moved.data(), b_mid, moved.size(), 0), Error::Ok);
  EXPECT_TRUE(std::equal(moved.begin(), moved.end(), data.begin() + 10));
  std::printf("copy_device_to_device through %s\n", devalloc::executorch::kExecuTorchHasDeviceToDevice
                                                        ? "ExecuTorch's virtual"
                                                        : "the adapter (ExecuTorch 1.5.1's header has none)");
  // 0 bytes: Ok, whatever the pointers.
  EXPECT_EQ(et()->copy_host_to_device(nullptr, nullptr, 0, 0), Error::Ok);
}

TEST_P(OnDevice, ErrorCodesAreExecuTorchs) {
  auto* a = et();
  DeviceMemoryBuffer buf = create(1024);
  uint8_t host[64] = {0};
  EXPECT_EQ(a->allocate(0, 0).error(), Error::InvalidArgument) << "0 bytes";
  EXPECT_EQ(a->allocate(64, 0, 3).error(), Error::InvalidArgument) << "alignment 3";
  EXPECT_EQ(a->allocate(64, -1).error(), Error::InvalidArgument) << "index -1";
  EXPECT_EQ(a->allocate(64, 100).error(), Error::InvalidArgument) << "no device 100";
  EXPECT_EQ(a->allocate(size_t(1) << 62, 0).error(), Error::MemoryAllocationFailed) << "4 EiB";
  // A size no address space holds: devalloc calls it an overflow (InvalidArgument) or too large.
  Error huge = a->allocate(SIZE_MAX, 0).error();
  EXPECT_TRUE(huge == Error::InvalidArgument || huge == Error::MemoryAllocationFailed) << "SIZE_MAX";
  EXPECT_EQ(DeviceMemoryBuffer::create(0, GetParam()).error(), Error::InvalidArgument);
  // Under a memory limit: out of memory is MemoryAllocationFailed, and the limit lifts.
  DevallocDeviceType t = static_cast<DevallocDeviceType>(GetParam());
  ASSERT_EQ(devalloc_set_memory_limit(t, 0, stats(GetParam()).reserved_bytes + 4096), DEVALLOC_STATUS_OK);
  EXPECT_EQ(DeviceMemoryBuffer::create(64 << 20, GetParam()).error(), Error::MemoryAllocationFailed);
  ASSERT_EQ(devalloc_set_memory_limit(t, 0, DEVALLOC_NO_LIMIT), DEVALLOC_STATUS_OK);
  // Copies: past the end, a foreign or null address, a freed one, a bad index.
  uint8_t* p = static_cast<uint8_t*>(buf.data());
  EXPECT_EQ(a->copy_host_to_device(p + 1000, host, 64, 0), Error::InvalidArgument);
  EXPECT_EQ(a->copy_device_to_host(host, p + 1000, 64, 0), Error::InvalidArgument);
  EXPECT_EQ(a->copy_host_to_device(reinterpret_cast<void*>(0x1234), host, 8, 0), Error::InvalidArgument);
  EXPECT_EQ(a->copy_device_to_host(host, nullptr, 8, 0), Error::InvalidArgument);
  EXPECT_EQ(a->copy_device_to_host(nullptr, p, 8, 0), Error::InvalidArgument) << "null host buffer";
  EXPECT_EQ(a->copy_host_to_device(p, host, 8, -3), Error::InvalidArgument);
  EXPECT_EQ(a->copy_host_to_device(p, host, 8, 7), Error::InvalidArgument);
  void* gone = a->allocate(128, 0).get();
  a->deallocate(gone, 0);
  EXPECT_EQ(a->copy_host_to_device(gone, host, 8, 0), Error::InvalidArgument) << "use after free";
  EXPECT_EQ(adapter(GetParam()).copy_device_to_device(p, 0, gone, 0, 8), Error::InvalidArgument);
  // Nothing above was allocated or freed but `buf` and `gone`.
  EXPECT_EQ(stats(GetParam()).allocations - before_.allocations, 2u);
  EXPECT_EQ(adapter(GetParam()).refused_frees(), refused_);
}

TEST_P(OnDevice, BadFreesAreRefusedNotCrashes) {
  auto* a = et();
  void* p = a->allocate(256, 0).get();
  DevallocStats held = stats(GetParam());
  a->deallocate(nullptr, 0);
  a->deallocate(reinterpret_cast<void*>(0xdead0000), 0);
  a->deallocate(static_cast<uint8_t*>(p) + 16, 0);  // interior
  a->deallocate(p, -1);
  a->deallocate(p, 9);
  DevallocStats still = stats(GetParam());
  EXPECT_EQ(still.live_allocations, held.live_allocations);
  EXPECT_EQ(still.deallocations, held.deallocations);
  a->deallocate(p, 0);
  a->deallocate(p, 0);  // double free
  EXPECT_EQ(adapter(GetParam()).refused_frees() - refused_, 6u);
  EXPECT_EQ(stats(GetParam()).deallocations - held.deallocations, 1u);
}

TEST_P(OnDevice, FreesThroughTheDestructorAndMoveAssignment) {
  {
    DeviceMemoryBuffer a = create(1000);
    DeviceMemoryBuffer b = create(3000);
    EXPECT_EQ(stats(GetParam()).live_allocations - before_.live_allocations, 2u);
    EXPECT_EQ(stats(GetParam()).allocated_bytes - before_.allocated_bytes, 4000u);
    a = std::move(b);  // frees a's 1000 bytes, takes b's
    EXPECT_EQ(b.data(), nullptr);
    EXPECT_EQ(a.size(), 3000u);
    EXPECT_EQ(stats(GetParam()).live_allocations - before_.live_allocations, 1u);
    EXPECT_EQ(stats(GetParam()).allocated_bytes - before_.allocated_bytes, 3000u);
    DeviceMemoryBuffer c(std::move(a));  // move construction frees nothing
    EXPECT_EQ(stats(GetParam()).live_allocations - before_.live_allocations, 1u);
  }
  DevallocStats after = stats(GetParam());
  EXPECT_EQ(after.allocations - before_.allocations, 2u);
  EXPECT_EQ(after.deallocations - before_.deallocations, 2u);
  EXPECT_EQ(adapter(GetParam()).refused_frees(), refused_) << "a moved-from buffer freed again";
}

TEST_P(OnDevice, EightThreadsAllocateAndCopyAtOnce) {
  constexpr int kThreads = 8, kRounds = 200;
  std::atomic<uint64_t> asked_count{0}, asked_bytes{0}, bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&, t] {
      std::vector<DeviceMemoryBuffer> held;
      for (int i = 0; i < kRounds; i++) {
        size_t n = 64 + static_cast<size_t>((t * 131 + i * 977) % 8000);
        auto r = DeviceMemoryBuffer::create(n, GetParam());
        if (!r.ok()) { bad++; continue; }
        asked_count++;
        asked_bytes += n;
        DeviceMemoryBuffer buf = std::move(r.get());
        std::vector<uint8_t> in(n), out(n);
        for (size_t k = 0; k < n; k++) in[k] = static_cast<uint8_t>(k ^ (t * 31 + i));
        auto* a = get_device_allocator(GetParam());
        if (a->copy_host_to_device(buf.data(), in.data(), n, 0) != Error::Ok ||
            a->copy_device_to_host(out.data(), buf.data(), n, 0) != Error::Ok || in != out) {
          bad++;
        }
        if (i % 3 == 0) held.push_back(std::move(buf));  // some live on, freed at the end
        if (held.size() > 8) held.erase(held.begin());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0u);
  DevallocStats after = stats(GetParam());
  EXPECT_EQ(after.allocations - before_.allocations, asked_count.load()) << "devalloc saw another count";
  EXPECT_EQ(after.deallocations - before_.deallocations, asked_count.load());
  EXPECT_GE(after.peak_allocated_bytes, before_.allocated_bytes);
  std::printf("%s: 8 threads: ExecuTorch asked for %llu buffers (%llu bytes); devalloc allocated %llu and freed %llu\n",
              name(GetParam()), (unsigned long long)asked_count.load(), (unsigned long long)asked_bytes.load(),
              (unsigned long long)(after.allocations - before_.allocations),
              (unsigned long long)(after.deallocations - before_.deallocations));
}

TEST_P(OnDevice, StatsAndSnapshotShowExactlyWhatExecuTorchAskedFor) {
  const size_t sizes[] = {1, 777, 4096, 12345, 65536, 1 << 20, 3000001};
  std::vector<DeviceMemoryBuffer> buffers;
  std::vector<void*> raw;
  uint64_t bytes = 0;
  for (size_t n : sizes) {
    buffers.push_back(create(n));
    raw.push_back(et()->allocate(n + 1, 0, 64).get());  // the raw interface too
    bytes += 2 * n + 1;
  }
  const uint64_t count = 2 * (sizeof(sizes) / sizeof(sizes[0]));
  DevallocStats held = stats(GetParam());
  EXPECT_EQ(held.live_allocations - before_.live_allocations, count);
  EXPECT_EQ(held.allocated_bytes - before_.allocated_bytes, bytes);
  EXPECT_EQ(held.allocations - before_.allocations, count);
  std::string path = "/tmp/devalloc-executorch-" + std::to_string(getpid()) + ".json";
  std::vector<Live> live = snapshot_live(GetParam(), path);
  std::remove(path.c_str());
  EXPECT_EQ(live.size(), held.live_allocations);
  size_t found = 0;
  for (size_t i = 0; i < buffers.size(); i++) {
    for (const Live& l : live) {
      if (l.addr == addr(buffers[i].data()) && l.size == sizes[i]) found++;
      if (l.addr == addr(raw[i]) && l.size == sizes[i] + 1) found++;
    }
  }
  EXPECT_EQ(found, count) << "the snapshot does not list every buffer ExecuTorch holds at its size";
  std::printf("%s: ExecuTorch holds %llu allocations of %llu bytes; devalloc's stats: %llu live, %llu bytes; its "
              "snapshot lists %zu of them at their sizes\n",
              name(GetParam()), (unsigned long long)count, (unsigned long long)bytes,
              (unsigned long long)(held.live_allocations - before_.live_allocations),
              (unsigned long long)(held.allocated_bytes - before_.allocated_bytes), found);
  for (void* p : raw) et()->deallocate(p, 0);
}

INSTANTIATE_TEST_SUITE_P(ExecuTorch, OnDevice, ::testing::Values(DeviceType::CPU, DeviceType::CUDA),
                         [](const auto& info) { return std::string(name(info.param)); });

}  // namespace

int main(int argc, char** argv) {
  executorch::runtime::runtime_init();
  g_registered = devalloc::executorch::register_available();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
