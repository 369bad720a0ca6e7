#!/usr/bin/env python3
"""The peer a CUDA user would pick, measured in the same run as devalloc's CUDA bench:
PyTorch's caching allocator (allocate + free cycles) and its host<->device `copy_` from
pinned and from pageable memory, at the bench's sizes; then devalloc / PyTorch per size,
read from the bench's own output. It runs after the bench, in its own process (not
interleaved with it), and its figures are taken from Python: each call carries the
interpreter's few microseconds, which matter at 4 KiB and in the alloc + free rate.
Ratios read devalloc / PyTorch: above 1, devalloc is faster.

    python3 torch_peer.py BENCH_OUTPUT.txt
"""
import re
import statistics
import sys
import time

try:
    import torch
except ImportError as e:  # a failed step in the bundle's summary, not a silent pass
    print(f"torch_peer: NOT RUN: PyTorch is not installed here: {e}")
    sys.exit(2)

KIB, MIB = 1 << 10, 1 << 20
SIZES = [4 * KIB, 64 * KIB, MIB, 8 * MIB, 64 * MIB, 256 * MIB, 1024 * MIB]


def reps(size):
    return max(9, min(300, (512 * MIB) // size))


def median_time(f, n):
    f()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main():
    if not torch.cuda.is_available():
        print("torch_peer: torch.cuda is not available")
        return 1
    dev = torch.device("cuda:0")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    results = {}
    print(f"{'size':>6} {'up pinned':>10} {'up pageable':>12} {'down pinned':>12} {'down pageable':>14}   GB/s (PyTorch copy_)")
    for size in SIZES:
        host = torch.randint(0, 256, (size,), dtype=torch.uint8)
        pinned = host.pin_memory()
        back_pinned = torch.empty(size, dtype=torch.uint8).pin_memory()
        back = torch.empty(size, dtype=torch.uint8)
        d = torch.empty(size, dtype=torch.uint8, device=dev)

        def up(src):
            d.copy_(src)
            torch.cuda.synchronize()

        def down(dst):
            dst.copy_(d)
            torch.cuda.synchronize()

        n = reps(size)
        g = lambda t: size / t / 1e9
        r = {
            "up_pinned": g(median_time(lambda: up(pinned), n)),
            "up_pageable": g(median_time(lambda: up(host), n)),
            "down_pinned": g(median_time(lambda: down(back_pinned), n)),
            "down_pageable": g(median_time(lambda: down(back), n)),
        }
        assert torch.equal(back, host) and torch.equal(back_pinned, host), "PyTorch's copies differ"
        results[size] = r
        print(f"{size // MIB if size >= MIB else size // KIB:>5}{'M' if size >= MIB else 'K'} {r['up_pinned']:>10.2f} {r['up_pageable']:>12.2f} {r['down_pinned']:>12.2f} {r['down_pageable']:>14.2f}")
    print("\nalloc + free per second: PyTorch's caching allocator")
    cycles = {}
    for size in [64 * KIB, MIB, 16 * MIB, 256 * MIB]:
        def cycle():
            t = torch.empty(size, dtype=torch.uint8, device=dev)
            del t
        cycles[size] = 1 / median_time(cycle, 300)
        print(f"{size // MIB if size >= MIB else size // KIB:>5}{'M' if size >= MIB else 'K'} {cycles[size]:>12.0f}/s")
    if len(sys.argv) > 1:
        compare(open(sys.argv[1]).read(), results, cycles)
    return 0


def parse_size(s):
    return int(s[:-1]) * (MIB if s.endswith("M") else KIB)


def compare(bench, results, cycles):
    """devalloc / PyTorch from the bench's tables (upload then download; columns pinned,
    pageable, devalloc)."""
    print("\ndevalloc / PyTorch (the best of its pinned and pageable copy_, and its caching allocator)")
    section = None
    for line in bench.splitlines():
        if line.startswith("upload GB/s"):
            section = "up"
        elif line.startswith("download GB/s"):
            section = "down"
        elif line.startswith("alloc + free"):
            section = "alloc"
        m = re.match(r"\s*(\d+[KM])\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s", line)
        if section in ("up", "down") and m:
            size = parse_size(m.group(1))
            if size in results:
                ours = float(m.group(4))
                best = max(results[size][f"{section}_pinned"], results[size][f"{section}_pageable"])
                print(f"  {section:>4} {m.group(1):>6}: devalloc {ours:.2f} GB/s, PyTorch {best:.2f} GB/s: {ours / best:.2f}x")
        m = re.match(r"\s*(\d+[KM]) cuMemAlloc/Free\s+([\d.]+)/s\s+async pool\s+([\d.]+)/s\s+devalloc\s+([\d.]+)/s", line)
        if section == "alloc" and m:
            size = parse_size(m.group(1))
            if size in cycles:
                ours = float(m.group(4))
                print(f"  alloc {m.group(1):>6}: devalloc {ours:.0f}/s, PyTorch from Python {cycles[size]:.0f}/s: {ours / cycles[size]:.2f}x"
                      " (PyTorch's figure includes the interpreter's few microseconds a call)")


if __name__ == "__main__":
    sys.exit(main())
