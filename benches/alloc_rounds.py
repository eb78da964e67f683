"""alloc.py's allocating-add rows taken apart: for each size, every round's time per call in the
loop and the synchronize that ends the round, for torch, CuPy and cubridge in one process (the
rounds interleaved as in alloc.py), with cubridge's pool figures after the row. It shows whether
a slow row is one library's calls or something that every library in the process waits for.

    python benches/alloc_rounds.py [log2 sizes ...]    (default: 16 18 20 22)
"""

import gc
import statistics
import sys

import cubridge as cb
import cupy as cp
import torch
from _common import calls_for, round_times


def row(k):
    n = 1 << k
    a = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda")
    ca, cb_ = cp.from_dlpack(a), cp.from_dlpack(b)
    calls = calls_for(n)
    fns = {
        "torch": lambda: torch.add(a, b),
        "cupy": lambda: cp.add(ca, cb_),
        "cubridge": lambda: cb.add(a, b),
    }
    times = round_times(fns, calls)
    s = cb.cuda.memory_stats()
    print(
        f"2^{k}, {calls} calls a round; cubridge's pool: reserved {s['reserved_bytes'] >> 20} "
        f"MiB, used {s['pool_used_bytes'] >> 20} MiB"
    )
    for name, v in times.items():
        med = statistics.median((loop + sync) / calls * 1e6 for loop, sync in v)
        loops = " ".join(f"{loop / calls * 1e6:5.1f}" for loop, _ in v)
        syncs = " ".join(f"{sync * 1e6:5.0f}" for _, sync in v)
        print(f"  {name:8} {med:6.1f} us/call; loop us/call {loops}; synchronize us {syncs}")


def main():
    for k in [int(a) for a in sys.argv[1:]] or [16, 18, 20, 22]:
        row(k)
        gc.collect()


if __name__ == "__main__":
    main()
