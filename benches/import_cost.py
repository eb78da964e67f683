"""What importing a foreign array costs, against what its producer's own export costs, and small
calls on CuPy arrays and torch tensors against the producers' own calls, all in one run: the
rows of the issue "import a foreign array for what its producer's own export costs". 2^10
float32, wall time per call, best of 5 interleaved rounds of 20000 calls (each round ended by a
device synchronize); ratios are cubridge's time over the peer's in the same run. Then the first
calls of the compiled cases in fresh processes with an empty kernel cache (first_call.py, 5
processes a case: the worst one is the goal's).

Goals: from_dlpack(cupy) at most CuPy's own __dlpack__(stream=current) + 150 ns; add,
ElementwiseKernel and RawKernel on CuPy arrays at most 0.9x CuPy's, on its current stream and in
a side stream; on torch tensors at most 1.0x torch's; allocating calls in a torch side stream at
most 1.1x; first calls at most 50 ms in the worst of 5 processes.

    python3 benches/import_cost.py [--calls 20000] [--no-first-calls]
"""

import argparse
import os
import subprocess
import sys

import cubridge as cb
import cupy as cp
import numpy as np
import torch
from _common import caches_label, round_times, start

N = 1 << 10
RAW_SRC = (
    'extern "C" __global__ void raw_sum(const float* x, const float* y, float* z, int n)'
    "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) z[i] = x[i] + y[i]; }"
)


def best(fns, calls):
    """Best per-call time (ns) of each function, rounds interleaved."""
    times = round_times(fns, calls, rounds=5, warmup=2000, sync=torch.cuda.synchronize)
    return {k: min(loop for loop, _ in v) / calls * 1e9 for k, v in times.items()}


def table(title, rows, calls):
    """Times `rows` ([(label, fn, peer label or None, goal text)]) and prints them with the
    ratio to their peer's row."""
    t = best({label: fn for label, fn, _, _ in rows}, calls)
    print(f"\n{title}")
    for label, _, peer, goal in rows:
        ratio = f"{t[label] / t[peer]:6.2f}x {peer}" if peer else ""
        print(f"  {label:48s} {t[label]:8.0f} ns  {ratio:46s} {goal}")
    return t


def current_stream_arg():
    """CuPy's current stream as DLPack numbers it (its NULL stream is the legacy one, 1)."""
    return cp.cuda.get_current_stream().ptr or 1


def cupy_rows(x, y, z, cb_kernel, cp_kernel, cb_raw, cp_raw):
    n32 = np.int32(N)
    grid, block = ((N + 255) // 256,), (256,)
    return [
        ("cupy.add(x, y, out=z)", lambda: cp.add(x, y, out=z), None, ""),
        ("cb.add(x, y, out=z)", lambda: cb.add(x, y, out=z), "cupy.add(x, y, out=z)", "<= 0.9x"),
        ("cupy.add(x, y)", lambda: cp.add(x, y), None, ""),
        ("cb.add(x, y)", lambda: cb.add(x, y), "cupy.add(x, y)", "<= 0.9x"),
        ("cupy EK(x, y, z)", lambda: cp_kernel(x, y, z), None, ""),
        ("cb EK(x, y, out=z)", lambda: cb_kernel(x, y, out=z), "cupy EK(x, y, z)", "<= 0.9x"),
        ("cupy EK(x, y)", lambda: cp_kernel(x, y), None, ""),
        ("cb EK(x, y)", lambda: cb_kernel(x, y), "cupy EK(x, y)", "<= 0.9x"),
        ("cupy RawKernel", lambda: cp_raw(grid, block, (x, y, z, n32)), None, ""),
        ("cb RawKernel", lambda: cb_raw(grid, block, (x, y, z, n32)), "cupy RawKernel", "<= 0.9x"),
    ]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--no-first-calls", action="store_true")
    args, _ = start(p)
    calls = args.calls

    x, y, z = (cp.ones(N, dtype=cp.float32) for _ in range(3))
    t, u, v = (torch.ones(N, device="cuda") for _ in range(3))
    a, b, c = (cb.asarray(w) for w in (t, u, v))
    cb_kernel = cb.ElementwiseKernel("T x, T y", "T z", "z = x + y", "import_cost_sum")
    cp_kernel = cp.ElementwiseKernel("T x, T y", "T z", "z = x + y", "import_cost_sum")
    cb_raw = cb.RawKernel(RAW_SRC, "raw_sum")
    cp_raw = cp.RawKernel(RAW_SRC, "raw_sum")

    table(
        "Imports (CuPy's current stream)",
        [
            (
                "cupy x.__dlpack__(stream=current)",
                lambda: x.__dlpack__(stream=current_stream_arg()),
                None,
                "",
            ),
            ("cupy x.__cuda_array_interface__", lambda: x.__cuda_array_interface__, None, ""),
            (
                "cupy.cuda.get_current_stream().ptr",
                lambda: cp.cuda.get_current_stream().ptr,
                None,
                "",
            ),
            (
                "cb.from_dlpack(cupy_x)",
                lambda: cb.from_dlpack(x),
                "cupy x.__dlpack__(stream=current)",
                "<= +150 ns",
            ),
            ("torch t.__dlpack__()", lambda: t.__dlpack__(), None, ""),
            ("cb.from_dlpack(torch_t)", lambda: cb.from_dlpack(t), "torch t.__dlpack__()", ""),
            ("cb.add(a, b, out=c) on cubridge arrays", lambda: cb.add(a, b, out=c), None, ""),
        ],
        calls,
    )
    imports = best(
        {
            "dlpack": lambda: x.__dlpack__(stream=current_stream_arg()),
            "cubridge": lambda: cb.from_dlpack(x),
        },
        calls,
    )
    over = imports["cubridge"] - imports["dlpack"]
    print(f"  from_dlpack(cupy_x) over CuPy's own export: {over:.0f} ns (goal <= 150 ns)")

    rows = cupy_rows(x, y, z, cb_kernel, cp_kernel, cb_raw, cp_raw)
    table("Small calls on CuPy arrays, CuPy's current stream", rows, calls)
    with cp.cuda.Stream(non_blocking=True):
        table("Small calls on CuPy arrays, inside a CuPy side stream", rows, calls)

    n32 = np.int32(N)
    grid, block = ((N + 255) // 256,), (256,)
    torch_rows = [
        ("torch.add(t, u, out=v)", lambda: torch.add(t, u, out=v), None, ""),
        ("cb.add(t, u, out=v)", lambda: cb.add(t, u, out=v), "torch.add(t, u, out=v)", "<= 1.0x"),
        ("torch.add(t, u)", lambda: torch.add(t, u), None, ""),
        ("cb.add(t, u)", lambda: cb.add(t, u), "torch.add(t, u)", "<= 1.0x"),
        ("cb EK(t, u, out=v)", lambda: cb_kernel(t, u, out=v), "torch.add(t, u, out=v)", "<= 1.0x"),
        ("cb EK(t, u)", lambda: cb_kernel(t, u), "torch.add(t, u)", "<= 1.0x"),
        (
            "cb RawKernel(t, u, v)",
            lambda: cb_raw(grid, block, (t, u, v, n32)),
            "torch.add(t, u, out=v)",
            "<= 1.0x",
        ),
        ("torch t.is_neg() (asked per tensor)", lambda: t.is_neg(), None, ""),
        ("torch t.requires_grad (asked per output)", lambda: t.requires_grad, None, ""),
    ]
    table("Small calls on torch tensors, torch's current stream", torch_rows, calls)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        alloc = [
            r for r in torch_rows if "out=" not in r[0] and "Raw" not in r[0] and "t." not in r[0]
        ]
        alloc = [(label, fn, peer, "<= 1.1x" if peer else "") for label, fn, peer, _ in alloc]
        table("Allocating calls on torch tensors, inside a torch side stream", alloc, calls)
    torch.cuda.synchronize()

    if not args.no_first_calls:
        print(
            f"\nFirst calls of the compiled cases, 5 fresh processes each, {caches_label()}",
            flush=True,
        )
        here = os.path.dirname(os.path.abspath(__file__))
        cases = "int16+int32,int8+int16,float32+float64,kernel"
        cmd = [sys.executable, os.path.join(here, "first_call.py"), "--runs", "5", "--no-warm"]
        env = dict(os.environ, CUBRIDGE_TRACE_LOADS="1")
        out = os.environ.get("TMPDIR", "/tmp")
        subprocess.run([*cmd, "--cases", cases, "--out", out], check=False, env=env)


if __name__ == "__main__":
    main()
