#!/usr/bin/env python3
"""Writes tests/data/traces/corpus: allocation histories of real models, run on the CPU.

Each model is built from a public architecture's configuration, in code (transformers' config
classes, torchvision's and diffusers' constructors: nothing is downloaded from a model hub),
with random weights, and run (a forward pass, a decode loop, a training step...) under
`torch.profiler.profile(profile_memory=True)`. Every CPU allocation and free the run made is
in the profiler's event tree with its address; an allocation lives from the event that made it
to the event that freed it (or to the end of the run, if nothing did). The history is written as
MiniMalloc's CSV (`id,lower,upper,size`, one step per event), the way the replay example reads
it. Allocations made before the run (the weights) are not in it; their frees, if any, are left
out. `SOURCES.md` beside the CSVs names each file's model, configuration and run.

    python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch torchvision transformers diffusers
    /tmp/tv/bin/python scripts/traces/generate.py [NAME...]   # all of them without a name

(PyPI's Linux torch wheel brings NVIDIA's CUDA libraries, about 5 GB in the venv; installed with
--no-deps it does not import, as it loads cuBLAS at import. Nothing here uses a GPU. All 24
models took about 15 minutes on two cores.)

Seeded (torch.manual_seed(0)) and single-threaded, so a rerun writes the same histories up to the
allocator choices of a torch version (say which one in the commit).
"""
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

sys.dont_write_bytecode = True  # no __pycache__ in the tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import MODELS  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "traces", "corpus")


def allocations(prof):
    """(time, ptr, signed size) of every CPU allocation event, in the order they happened."""
    found = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    alloc_type = torch._C._profiler._EventType.Allocation
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        kind, fields = node.typed
        if kind == alloc_type and fields.device.type == "cpu":
            found.append((node.start_time_ns, fields.ptr, fields.alloc_size))
    # Ties (events at the same nanosecond) keep the tree walk's order, which may not be the
    # order they happened in: a free and an allocation of one address so reversed stops
    # `lifetimes` loudly ("allocated twice"); of two addresses, it moves one step's peak.
    found.sort(key=lambda e: e[0])
    return found


def lifetimes(events):
    """Buffers as (lower, upper, size): each allocation's step to its free's (or the end)."""
    live, out, step = {}, [], 0
    for _, ptr, size in events:
        if size > 0:
            if ptr in live:
                raise SystemExit(f"address {ptr:#x} allocated twice without a free")
            live[ptr] = (step, size)
            step += 1
        elif size < 0 and ptr in live:
            lower, nbytes = live.pop(ptr)
            if -size != nbytes:
                raise SystemExit(f"address {ptr:#x}: freed {-size} bytes, allocated {nbytes}")
            out.append((lower, step, nbytes))
            step += 1
    # What is still live at the end (outputs, optimizer state, a KV cache) lives to the end.
    out += [(lower, step + 1, nbytes) for lower, nbytes in live.values()]
    out.sort()
    return out


def write(name, buffers, source):
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, name + ".csv"), "w") as f:
        f.write("id,lower,upper,size\n")
        for i, (lower, upper, size) in enumerate(buffers):
            f.write(f"{i},{lower},{upper},{size}\n")
    peak, live, edges = 0, 0, []
    for lower, upper, size in buffers:
        edges += [(lower, 1, size), (upper, 0, -size)]
    for _, _, d in sorted(edges):
        live += d
        peak = max(peak, live)
    print(f"{name}: {len(buffers)} buffers, peak live {peak / 2**20:.1f} MiB, "
          f"largest {max(s for _, _, s in buffers) / 2**20:.1f} MiB ({source})")
    return peak


def main():
    torch.set_num_threads(1)
    wanted = sys.argv[1:]
    unknown = [w for w in wanted if w not in MODELS]
    if unknown:
        raise SystemExit(f"unknown: {unknown}; known: {', '.join(MODELS)}")
    rows = []
    for name, (source, build) in MODELS.items():
        if wanted and name not in wanted:
            continue
        torch.manual_seed(0)
        run = build()  # the model and its inputs, made (and warmed up) outside the profile
        torch.manual_seed(0)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            run()
        peak = write(name, lifetimes(allocations(prof)), source)
        rows.append((name, source, peak))
    if not wanted:
        with open(os.path.join(OUT, "SOURCES.md"), "w") as f:
            f.write("# Where each history comes from\n\n"
                    "Written by `scripts/traces/generate.py` (torch " + torch.__version__ + ", CPU, one thread): "
                    "the model built from the configuration named, random weights, the run named, under "
                    "`torch.profiler` with `profile_memory=True`. One step per allocation or free.\n\n"
                    "| file | model, configuration and run | peak live |\n|---|---|---|\n")
            for name, source, peak in rows:
                f.write(f"| `{name}.csv` | {source} | {peak / 2**20:.1f} MiB |\n")


if __name__ == "__main__":
    main()
