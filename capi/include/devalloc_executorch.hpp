/* devalloc behind ExecuTorch's DeviceAllocator (ExecuTorch 1.5.1's
 * executorch/runtime/core/device_allocator.h), over devalloc's C ABI (devalloc.h).
 *
 *   #include <devalloc_executorch.hpp>
 *   int n = devalloc::executorch::register_available();   // CPU, and CUDA where there is one
 *   auto buf = executorch::runtime::DeviceMemoryBuffer::create(1 << 20, DeviceType::CUDA);
 *
 * Build: the wheel's headers (-DC10_USING_CUSTOM_GENERATED_MACROS -I<wheel>/executorch/include
 * -I<wheel>/executorch/include/executorch/runtime/core/portable_type/c10), libexecutorch.so,
 * and `pkg-config --cflags --libs devalloc` (scripts/build-c). Header-only; C++17.
 *
 * What maps to what:
 *   allocate(nbytes, index, alignment)   devalloc_allocate; the void* is devalloc's 64-bit device
 *                                        address (CUDA: the driver's; CPU: devalloc's virtual
 *                                        host address, reached only through the copies, as
 *                                        DeviceMemoryBuffer::as_span's users do)
 *   deallocate(ptr, index)               devalloc_deallocate; a null, foreign or freed pointer is
 *                                        logged (ET_LOG) and counted, never a crash
 *   copy_host_to_device / device_to_host devalloc_copy_*; any address inside an allocation works
 *                                        (interior pointers, as a memory plan makes them)
 *   copy_device_to_device                devalloc_copy_device_to_device; it overrides ExecuTorch's
 *                                        where ExecuTorch's header declares it (not 1.5.1's)
 *   errors                               to_error(): OUT_OF_MEMORY, TOO_LARGE -> MemoryAllocationFailed;
 *                                        INVALID_ARGUMENT, INVALID_POINTER, OUT_OF_BOUNDS,
 *                                        NO_SUCH_DEVICE -> InvalidArgument; NOT_FOUND -> NotFound;
 *                                        NOT_SUPPORTED -> NotSupported; DEVICE_LOST, IO ->
 *                                        AccessFailed; BACKEND, INTERNAL -> Internal. The message
 *                                        is ET_LOG'd at Error level (devalloc_last_error()).
 */
#pragma once

#include <devalloc.h>

#include <executorch/runtime/core/device_allocator.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/result.h>
#include <executorch/runtime/platform/log.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <type_traits>

static_assert(sizeof(void*) == sizeof(uint64_t), "devalloc's device addresses are 64-bit: a 64-bit target is needed");

namespace devalloc {
namespace executorch {

namespace et = ::executorch::runtime;
using et::etensor::DeviceIndex;
using et::etensor::DeviceType;

/// ExecuTorch's error for a devalloc status (see the table at the top of this file).
inline et::Error to_error(DevallocStatus status) {
  switch (status) {
    case DEVALLOC_STATUS_OK:
      return et::Error::Ok;
    case DEVALLOC_STATUS_OUT_OF_MEMORY:
    case DEVALLOC_STATUS_TOO_LARGE:
      return et::Error::MemoryAllocationFailed;
    case DEVALLOC_STATUS_INVALID_ARGUMENT:
    case DEVALLOC_STATUS_INVALID_POINTER:
    case DEVALLOC_STATUS_OUT_OF_BOUNDS:
    case DEVALLOC_STATUS_NO_SUCH_DEVICE:
      return et::Error::InvalidArgument;
    case DEVALLOC_STATUS_NOT_FOUND:
      return et::Error::NotFound;
    case DEVALLOC_STATUS_NOT_SUPPORTED:
      return et::Error::NotSupported;
    case DEVALLOC_STATUS_DEVICE_LOST:
    case DEVALLOC_STATUS_IO:
      return et::Error::AccessFailed;
    case DEVALLOC_STATUS_BACKEND:
    case DEVALLOC_STATUS_INTERNAL:
    default:
      return et::Error::Internal;
  }
}

namespace detail {
/// Whether ExecuTorch's DeviceAllocator declares copy_device_to_device (its main branch does,
/// 1.5.1 does not).
template <typename T, typename = void>
struct has_device_to_device : std::false_type {};
template <typename T>
struct has_device_to_device<T, std::void_t<decltype(&T::copy_device_to_device)>> : std::true_type {};

/// The signature this adapter implements; ExecuTorch's must be the same where it has one.
using DeviceToDevice = et::Error (et::DeviceAllocator::*)(void*, DeviceIndex, const void*, DeviceIndex, size_t);
template <typename T, bool = has_device_to_device<T>::value>
struct device_to_device_matches : std::true_type {};
template <typename T>
struct device_to_device_matches<T, true>
    : std::is_same<decltype(&T::copy_device_to_device), DeviceToDevice> {};

/// The address as devalloc takes it.
inline uint64_t address(const void* ptr) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(ptr));
}
}  // namespace detail

/// Whether this ExecuTorch's DeviceAllocator has copy_device_to_device, which the adapter then
/// overrides (with 1.5.1's headers: false; the adapter still has the method).
constexpr bool kExecuTorchHasDeviceToDevice = detail::has_device_to_device<et::DeviceAllocator>::value;
static_assert(detail::device_to_device_matches<et::DeviceAllocator>::value,
              "ExecuTorch's copy_device_to_device has another signature: update devalloc_executorch.hpp");

/// ExecuTorch's DeviceAllocator over devalloc's allocator for one device type (CPU or CUDA).
/// Stateless but for a count of refused frees, so thread-safe as devalloc is. Open the devalloc
/// allocator (devalloc_open) before use; register_available() does both.
class DeviceAllocator final : public et::DeviceAllocator {
 public:
  /// An adapter for ExecuTorch's `type` (CPU = devalloc's host allocator, CUDA = its CUDA one).
  explicit DeviceAllocator(DeviceType type) : type_(type) {}

  et::Result<void*> allocate(size_t nbytes, DeviceIndex index, size_t alignment = kDefaultAlignment) override {
    if (index < 0) return refuse("allocate", index);
    uint64_t ptr = 0;
    DevallocStatus s =
        devalloc_allocate(devalloc_type(), static_cast<uint32_t>(index), nbytes, alignment, &ptr);
    if (s != DEVALLOC_STATUS_OK) return fail("allocate", s);
    return reinterpret_cast<void*>(static_cast<uintptr_t>(ptr));
  }

  void deallocate(void* ptr, DeviceIndex index) override {
    DevallocStatus s = index < 0 ? DEVALLOC_STATUS_INVALID_ARGUMENT
                                 : devalloc_deallocate(devalloc_type(), static_cast<uint32_t>(index),
                                                       detail::address(ptr));
    if (s != DEVALLOC_STATUS_OK) {
      refused_frees_.fetch_add(1, std::memory_order_relaxed);
      ET_LOG(Error, "devalloc: deallocate(%p, %d) refused: %s", ptr, static_cast<int>(index),
             index < 0 ? "negative device index" : devalloc_last_error());
    }
  }

  et::Error copy_host_to_device(void* dst, const void* src, size_t nbytes, DeviceIndex index) override {
    if (index < 0) return refuse("copy_host_to_device", index);
    DevallocStatus s =
        devalloc_copy_host_to_device(devalloc_type(), static_cast<uint32_t>(index), detail::address(dst), src, nbytes);
    return s == DEVALLOC_STATUS_OK ? et::Error::Ok : fail("copy_host_to_device", s);
  }

  et::Error copy_device_to_host(void* dst, const void* src, size_t nbytes, DeviceIndex index) override {
    if (index < 0) return refuse("copy_device_to_host", index);
    DevallocStatus s =
        devalloc_copy_device_to_host(devalloc_type(), static_cast<uint32_t>(index), dst, detail::address(src), nbytes);
    return s == DEVALLOC_STATUS_OK ? et::Error::Ok : fail("copy_device_to_host", s);
  }

#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Winconsistent-missing-override"
#endif
  /// Copies between two allocations of this device type (on one device or two). It overrides
  /// ExecuTorch's virtual where ExecuTorch declares one (kExecuTorchHasDeviceToDevice), and is
  /// a plain member otherwise, so `override` cannot be written.
  et::Error copy_device_to_device(void* dst, DeviceIndex dst_index, const void* src, DeviceIndex src_index,
                                  size_t nbytes) {
    if (dst_index < 0) return refuse("copy_device_to_device", dst_index);
    if (src_index < 0) return refuse("copy_device_to_device", src_index);
    DevallocStatus s = devalloc_copy_device_to_device(devalloc_type(), static_cast<uint32_t>(dst_index),
                                                      detail::address(dst), devalloc_type(),
                                                      static_cast<uint32_t>(src_index), detail::address(src), nbytes);
    return s == DEVALLOC_STATUS_OK ? et::Error::Ok : fail("copy_device_to_device", s);
  }
#if defined(__clang__)
#pragma clang diagnostic pop
#endif

  DeviceType device_type() const override { return type_; }

  /// devalloc's device type for ExecuTorch's (their values agree: CPU 0, CUDA 1).
  DevallocDeviceType devalloc_type() const { return static_cast<DevallocDeviceType>(type_); }

  /// How many deallocate() calls were refused (null, foreign, interior or freed pointers, bad
  /// indices): ExecuTorch's deallocate returns nothing, so they are logged and counted here.
  uint64_t refused_frees() const { return refused_frees_.load(std::memory_order_relaxed); }

 private:
  et::Error fail(const char* what, DevallocStatus status) const {
    ET_LOG(Error, "devalloc: %s on %s: %s (%s)", what, type_ == DeviceType::CUDA ? "cuda" : "cpu",
           devalloc_status_name(status), devalloc_last_error());
    return to_error(status);
  }

  et::Error refuse(const char* what, DeviceIndex index) const {
    ET_LOG(Error, "devalloc: %s: device index %d is negative", what, static_cast<int>(index));
    return et::Error::InvalidArgument;
  }

  DeviceType type_;
  std::atomic<uint64_t> refused_frees_{0};
};

/// The process's adapter for `type` (CPU or CUDA): one object for the life of the process,
/// as ExecuTorch's registry wants. Never destroyed (leaked on purpose): a `DeviceMemoryBuffer`
/// with static storage may free through it after `main` returns.
inline DeviceAllocator& adapter(DeviceType type) {
  static DeviceAllocator& cpu = *new DeviceAllocator(DeviceType::CPU);
  static DeviceAllocator& cuda = *new DeviceAllocator(DeviceType::CUDA);
  return type == DeviceType::CUDA ? cuda : cpu;
}

/// Opens devalloc's allocators and registers an adapter in ExecuTorch's registry (through
/// ExecuTorch's register_device_allocator) for each ExecuTorch device type devalloc can serve
/// here: CPU always, CUDA where a driver and a device are present. Returns how many it
/// registered now. Types that already have an allocator in ExecuTorch's registry (an earlier
/// call's, or another's) are left as they are, so a second call registers nothing and never
/// aborts. ExecuTorch has no way to unregister: after devalloc_shutdown() the adapters stay in
/// its registry and their calls fail (NotFound) until this is called again, which opens
/// devalloc's allocators again. Serialised against itself; call it before other threads use
/// ExecuTorch's registry.
inline int register_available() {
  static std::mutex lock;
  std::lock_guard<std::mutex> guard(lock);
  int registered = 0;
  for (DeviceType type : {DeviceType::CPU, DeviceType::CUDA}) {
    DeviceAllocator& a = adapter(type);
    et::DeviceAllocator* present = et::get_device_allocator(type);
    if (present == &a) {
      devalloc_open(a.devalloc_type());  // ours: open again after a devalloc_shutdown(), else a no-op
      continue;
    }
    if (present != nullptr) {
      ET_LOG(Info, "devalloc: ExecuTorch already has an allocator for device type %d",
             static_cast<int>(a.devalloc_type()));
      continue;
    }
    uint32_t devices = 0;
    if (devalloc_open(a.devalloc_type()) != DEVALLOC_STATUS_OK ||
        devalloc_device_count(a.devalloc_type(), &devices) != DEVALLOC_STATUS_OK || devices == 0) {
      ET_LOG(Info, "devalloc: device type %d not registered: %s", static_cast<int>(a.devalloc_type()),
             devalloc_last_error());
      continue;
    }
    et::register_device_allocator(&a);
    registered++;
  }
  return registered;
}

}  // namespace executorch
}  // namespace devalloc
