#!/usr/bin/env python3
"""The peer a CUDA user would pick, measured in the same run as devalloc's CUDA bench:
PyTorch's host<->device `copy_` from pinned and from pageable memory, and its caching
allocator's allocate + free cycle, at the bench's sizes; then devalloc / PyTorch, read from
the bench's own output.

Fair both ways:
- devalloc's API takes pageable memory, so its figure is set against PyTorch's pageable copy
  (the same job) and, apart, against PyTorch's pinned copy (the link's ceiling, a different
  job: the caller pinned first); devalloc given pinned memory ("dv pinned") is set against
  PyTorch's pinned copy.
- `copy_` with non_blocking=False already waits for its stream: nothing more is added.
- The four copies run interleaved, round by round, in a rotating order.
- The alloc + free cycle is timed from Python, whose call costs a few microseconds that a Rust
  call does not pay: loops of many cycles are timed, and the same loop around an empty call is
  subtracted. Timing it in C++ (torch.utils.cpp_extension) is not attempted: building an
  extension takes longer than this step's limit, and the machine may lack a compiler; the
  output says which.
Ratios read devalloc / PyTorch: above 1, devalloc is faster. It runs after the bench, in its
own process.

    python3 torch_peer.py BENCH_OUTPUT.txt
"""
import re
import shutil
import statistics
import sys
import time

try:
    import torch
except ImportError as e:  # a failed step in the bundle's summary, not a silent pass
    print(f"torch_peer: NOT RUN: PyTorch is not installed here: {e}")
    sys.exit(2)

KIB, MIB = 1 << 10, 1 << 20
SIZES = [4 * KIB, 64 * KIB, MIB, 8 * MIB, 64 * MIB, 256 * MIB]  # the bench's
CYCLE_SIZES = [64 * KIB, MIB, 16 * MIB, 256 * MIB]


def human(size):
    return f"{size // MIB}M" if size >= MIB else f"{size // KIB}K"


def reps(size):
    return max(9, min(300, (512 * MIB) // size))


def interleaved(methods, n):
    """Median seconds of each method, run round by round in a rotating order after one
    cold call each."""
    names = list(methods)
    for f in methods.values():
        f()
    times = {k: [] for k in names}
    for r in range(n):
        for i in range(len(names)):
            k = names[(i + r) % len(names)]
            t = time.perf_counter()
            methods[k]()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def per_call(f, calls=2000, samples=7):
    """Seconds per call of `f`, less the same loop around an empty call (Python's own cost)."""

    def loop(g):
        t = time.perf_counter()
        for _ in range(calls):
            g()
        return (time.perf_counter() - t) / calls

    def empty():
        pass

    ours, base = [], []
    for _ in range(samples):
        base.append(loop(empty))
        ours.append(loop(f))
    return max(statistics.median(ours) - statistics.median(base), 1e-9), statistics.median(base)


def main():
    if not torch.cuda.is_available():
        print("torch_peer: torch.cuda is not available")
        return 1
    dev = torch.device("cuda:0")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    results = {}
    print(f"{'size':>6} {'up pinned':>10} {'up pageable':>12} {'down pinned':>12} {'down pageable':>14}   GB/s (PyTorch copy_, interleaved)")
    for size in SIZES:
        host = torch.randint(0, 256, (size,), dtype=torch.uint8)
        pinned = host.pin_memory()
        back_pinned = torch.empty(size, dtype=torch.uint8).pin_memory()
        back = torch.empty(size, dtype=torch.uint8)
        d = torch.empty(size, dtype=torch.uint8, device=dev)
        # copy_ (non_blocking=False) returns once its stream is done with the copy.
        t = interleaved(
            {
                "up_pinned": lambda: d.copy_(pinned),
                "up_pageable": lambda: d.copy_(host),
                "down_pinned": lambda: back_pinned.copy_(d),
                "down_pageable": lambda: back.copy_(d),
            },
            reps(size),
        )
        assert torch.equal(back, host) and torch.equal(back_pinned, host), "PyTorch's copies differ"
        r = {k: size / v / 1e9 for k, v in t.items()}
        results[size] = r
        print(f"{human(size):>6} {r['up_pinned']:>10.2f} {r['up_pageable']:>12.2f} {r['down_pinned']:>12.2f} {r['down_pageable']:>14.2f}")
        del host, pinned, back_pinned, back, d
    print("\nalloc + free per second: PyTorch's caching allocator from Python, Python's own cost per call subtracted")
    cycles = {}
    for size in CYCLE_SIZES:
        def empty_del():
            t = torch.empty(size, dtype=torch.uint8, device=dev)
            del t

        def raw():
            torch.cuda.caching_allocator_delete(torch.cuda.caching_allocator_alloc(size, 0))

        tensor, base = per_call(empty_del)
        bare, _ = per_call(raw)
        cycles[size] = 1 / bare
        print(f"{human(size):>6} torch.empty+del {1 / tensor:>12.0f}/s  caching_allocator_alloc+delete {1 / bare:>12.0f}/s"
              f"  (Python's empty call: {base * 1e6:.2f} us, subtracted)")
    compiler = shutil.which("c++") or shutil.which("g++")
    print(f"\nC++ timing of the cycle: not attempted (a compiler: {compiler or 'none'}; ninja: "
          f"{shutil.which('ninja') or 'none'}; building a torch extension takes longer than this step's limit)")
    if len(sys.argv) > 1:
        compare(open(sys.argv[1]).read(), results, cycles)
    return 0


def parse_size(s):
    return int(s[:-1]) * (MIB if s.endswith("M") else KIB)


def compare(bench, results, cycles):
    """devalloc / PyTorch from the bench's tables (upload then download; columns pinned,
    pageable, devalloc, dv pinned)."""
    print("\ndevalloc / PyTorch, like for like: devalloc (pageable memory, its API) vs PyTorch pageable; "
          "devalloc given pinned memory vs PyTorch pinned; and devalloc vs PyTorch pinned (the ceiling)")
    section = None
    for line in bench.splitlines():
        if line.startswith("upload GB/s"):
            section = "up"
        elif line.startswith("download GB/s"):
            section = "down"
        elif line.startswith("alloc + free"):
            section = "alloc"
        elif line.startswith(("where staging wins", "## ")):
            section = None
        m = re.match(r"\s*(\d+[KM])\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s", line)
        if section in ("up", "down") and m:
            size = parse_size(m.group(1))
            if size in results:
                ours, ours_pinned = float(m.group(4)), float(m.group(5))
                pageable = results[size][f"{section}_pageable"]
                pinned = results[size][f"{section}_pinned"]
                print(f"  {section:>4} {m.group(1):>6}: devalloc {ours:.2f} vs pageable {pageable:.2f} GB/s: {ours / pageable:.2f}x;"
                      f"  dv pinned {ours_pinned:.2f} vs pinned {pinned:.2f}: {ours_pinned / pinned:.2f}x;"
                      f"  devalloc vs pinned: {ours / pinned:.2f}x")
        m = re.match(r"\s*(\d+[KM]) cuMemAlloc/Free\s+([\d.]+)/s\s+async pool\s+([\d.]+)/s\s+devalloc\s+([\d.]+)/s", line)
        if section == "alloc" and m:
            size = parse_size(m.group(1))
            if size in cycles:
                ours = float(m.group(4))
                print(f"  alloc {m.group(1):>6}: devalloc {ours:.0f}/s, PyTorch's allocator {cycles[size]:.0f}/s "
                      f"(Python's call cost subtracted): {ours / cycles[size]:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
