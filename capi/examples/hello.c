/* devalloc from plain C: open the host allocator, allocate, copy in and out through an
 * interior address, read the stats, see errors as codes and messages, free.
 *
 *   scripts/build-c
 *   cc capi/examples/hello.c $(PKG_CONFIG_PATH=target/c pkg-config --cflags --libs devalloc) -o hello
 *   ./hello
 */
#include <devalloc.h>
#include <stdio.h>
#include <string.h>

/* Prints the failure and returns 1 unless `status` is DEVALLOC_STATUS_OK. */
static int check(DevallocStatus status, const char *what) {
  if (status == DEVALLOC_STATUS_OK) return 0;
  fprintf(stderr, "hello: %s: %s: %s\n", what, devalloc_status_name(status), devalloc_last_error());
  return 1;
}

int main(void) {
  const DevallocDeviceType cpu = DEVALLOC_DEVICE_TYPE_CPU;
  uint64_t ptr = 0;
  char back[6] = {0};
  DevallocStats stats;

  printf("devalloc %s\n", devalloc_version());
  if (check(devalloc_open(cpu), "open cpu")) return 1;
  if (check(devalloc_allocate(cpu, 0, 1024, 256, &ptr), "allocate")) return 1;
  /* Any address inside the allocation works in a copy (as a memory plan's tensors do). */
  if (check(devalloc_copy_host_to_device(cpu, 0, ptr + 16, "hello", 5), "copy in")) return 1;
  if (check(devalloc_copy_device_to_host(cpu, 0, back, ptr + 16, 5), "copy out")) return 1;
  if (strcmp(back, "hello") != 0) {
    fprintf(stderr, "hello: read back \"%s\"\n", back);
    return 1;
  }
  if (check(devalloc_stats(cpu, 0, &stats), "stats")) return 1;
  printf("copied \"%s\" through %#llx; %llu allocation(s) of %llu bytes live\n", back,
         (unsigned long long)ptr, (unsigned long long)stats.live_allocations,
         (unsigned long long)stats.allocated_bytes);

  /* Errors are codes with a message, never a crash. */
  DevallocStatus bad = devalloc_copy_host_to_device(cpu, 0, ptr + 1020, "hello", 5);
  printf("a copy past the end: %s (%s)\n", devalloc_status_name(bad), devalloc_last_error());
  if (bad != DEVALLOC_STATUS_OUT_OF_BOUNDS) return 1;

  if (check(devalloc_deallocate(cpu, 0, ptr), "free")) return 1;
  bad = devalloc_deallocate(cpu, 0, ptr);
  printf("a double free: %s (%s)\n", devalloc_status_name(bad), devalloc_last_error());
  if (bad != DEVALLOC_STATUS_INVALID_POINTER) return 1;

  /* CUDA where there is a driver and a device; otherwise the message says what is missing. */
  if (devalloc_open(DEVALLOC_DEVICE_TYPE_CUDA) == DEVALLOC_STATUS_OK) {
    uint32_t gpus = 0;
    if (check(devalloc_device_count(DEVALLOC_DEVICE_TYPE_CUDA, &gpus), "cuda devices")) return 1;
    printf("cuda: %u device(s)\n", gpus);
  } else {
    printf("cuda: not here (%s)\n", devalloc_last_error());
  }

  /* Shut down: everything devalloc holds is released, and its calls say so until it opens again. */
  if (check(devalloc_shutdown(), "shutdown")) return 1;
  bad = devalloc_stats(cpu, 0, &stats);
  printf("after shutdown: %s (%s)\n", devalloc_status_name(bad), devalloc_last_error());
  if (bad != DEVALLOC_STATUS_NOT_FOUND) return 1;
  printf("ok\n");
  return 0;
}
