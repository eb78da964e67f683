"""alloc.py's allocating-add rows taken apart: for each size, every round's time per call in the
loop and the synchronize that ends the round, for torch, CuPy and cubridge in one process (the
rounds interleaved as in alloc.py), with cubridge's pool figures after the row. It shows whether
a slow row is one library's calls or something that every library in the process waits for.

    python benches/alloc_rounds.py [log2 sizes ...]    (default: 16 18 20 22)
"""

import gc
import statistics
import sys
import time

import cubridge as cb
import cupy as cp
import torch


def rounds(fns, calls, n_rounds=7):
    for f in fns.values():
        for _ in range(min(calls, 200)):
            f()
    torch.cuda.synchronize()
    out = {k: [] for k in fns}
    for _ in range(n_rounds):
        for k, f in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            out[k].append(((t1 - t0) / calls * 1e6, (t2 - t1) * 1e6))
    return out


def row(k):
    n = 1 << k
    a = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda")
    ca, cb_ = cp.from_dlpack(a), cp.from_dlpack(b)
    calls = max(20, min(5000, (1 << 28) // n // 8))  # alloc.py's calls_for
    fns = {
        "torch": lambda: torch.add(a, b),
        "cupy": lambda: cp.add(ca, cb_),
        "cubridge": lambda: cb.add(a, b),
    }
    times = rounds(fns, calls)
    s = cb.cuda.memory_stats()
    print(
        f"2^{k}, {calls} calls a round; cubridge's pool: reserved {s['reserved_bytes'] >> 20} "
        f"MiB, used {s['pool_used_bytes'] >> 20} MiB"
    )
    for name, v in times.items():
        med = statistics.median(loop + sync / calls for loop, sync in v)
        loops = " ".join(f"{loop:5.1f}" for loop, _ in v)
        syncs = " ".join(f"{sync:5.0f}" for _, sync in v)
        print(f"  {name:8} {med:6.1f} us/call; loop us/call {loops}; synchronize us {syncs}")


def main():
    for k in [int(a) for a in sys.argv[1:]] or [16, 18, 20, 22]:
        row(k)
        gc.collect()


if __name__ == "__main__":
    main()
