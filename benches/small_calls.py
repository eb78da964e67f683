"""Small calls on other libraries' arrays against those libraries' own calls (issue 28's table):
wall time per call of 2^10-element float32 operations, median of 7 rounds of 2000 calls, each
round ended by a device synchronize, every case's rounds interleaved with its peer's. Each row
prints cubridge's time, the peer's and the ratio (goal: at most 1.00x; the RawKernel row's peer
is cubridge's own ElementwiseKernel on the same tensors).

    python benches/small_calls.py [--rounds 7] [--calls 2000] [--out DIR]
"""

import argparse
import json
import os
import statistics
import time

import cubridge as cb
import cupy as cp
import numpy as np
import torch

N = 1 << 10
AXPY = "z = a * x + y"
CB_AXPY = cb.ElementwiseKernel("T x, T y, float32 a", "T z", AXPY, "small_axpy")
CP_AXPY = cp.ElementwiseKernel("T x, T y, float32 a", "T z", AXPY, "small_axpy")
RAW_AXPY = cb.RawKernel(
    'extern "C" __global__ void raw_axpy(const float* x, const float* y, float* z, float a, '
    "int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) z[i] = a * x[i] + y[i]; }",
    "raw_axpy",
)
A = 2.0


def rows():
    """(label, cubridge's call, the peer's call, optional context manager factory)."""
    tx, ty, tz = (torch.randn(N, device="cuda") for _ in range(3))
    cx, cy, cz = (cp.asarray(np.random.randn(N).astype(np.float32)) for _ in range(3))
    bx, by, bz = (cb.asarray(t) for t in (tx, ty, tz))
    a32, n32 = np.float32(A), np.int32(N)
    torch_side = torch.cuda.Stream()
    cupy_side = cp.cuda.Stream(non_blocking=True)
    in_torch_side = lambda: torch.cuda.stream(torch_side)  # noqa: E731
    in_cupy_side = lambda: cupy_side  # noqa: E731
    return [
        # torch tensors against torch's own calls
        (
            "add(a, b, out=c) torch",
            lambda: cb.add(tx, ty, out=tz),
            lambda: torch.add(tx, ty, out=tz),
            None,
        ),
        ("add(a, b) torch", lambda: cb.add(tx, ty), lambda: torch.add(tx, ty), None),
        (
            "add(a, b, out=c) torch, side stream",
            lambda: cb.add(tx, ty, out=tz),
            lambda: torch.add(tx, ty, out=tz),
            in_torch_side,
        ),
        (
            "add(a, b) torch, side stream",
            lambda: cb.add(tx, ty),
            lambda: torch.add(tx, ty),
            in_torch_side,
        ),
        (
            "EK axpy out= torch / torch.add(alpha=, out=)",
            lambda: CB_AXPY(tx, ty, A, tz),
            lambda: torch.add(ty, tx, alpha=A, out=tz),
            None,
        ),
        (
            "EK axpy torch / torch.add(alpha=)",
            lambda: CB_AXPY(tx, ty, A),
            lambda: torch.add(ty, tx, alpha=A),
            None,
        ),
        (
            "EK axpy out= torch, side stream",
            lambda: CB_AXPY(tx, ty, A, tz),
            lambda: torch.add(ty, tx, alpha=A, out=tz),
            in_torch_side,
        ),
        (
            "EK axpy torch, side stream",
            lambda: CB_AXPY(tx, ty, A),
            lambda: torch.add(ty, tx, alpha=A),
            in_torch_side,
        ),
        # CuPy arrays against CuPy's own calls
        (
            "add(a, b, out=c) cupy",
            lambda: cb.add(cx, cy, out=cz),
            lambda: cp.add(cx, cy, out=cz),
            None,
        ),
        ("add(a, b) cupy", lambda: cb.add(cx, cy), lambda: cp.add(cx, cy), None),
        (
            "add(a, b, out=c) cupy, side stream",
            lambda: cb.add(cx, cy, out=cz),
            lambda: cp.add(cx, cy, out=cz),
            in_cupy_side,
        ),
        (
            "add(a, b) cupy, side stream",
            lambda: cb.add(cx, cy),
            lambda: cp.add(cx, cy),
            in_cupy_side,
        ),
        (
            "EK axpy out= cupy / CuPy's EK",
            lambda: CB_AXPY(cx, cy, A, cz),
            lambda: CP_AXPY(cx, cy, a32, cz),
            None,
        ),
        (
            "EK axpy cupy / CuPy's EK",
            lambda: CB_AXPY(cx, cy, A),
            lambda: CP_AXPY(cx, cy, a32),
            None,
        ),
        (
            "EK axpy out= cupy, side stream",
            lambda: CB_AXPY(cx, cy, A, cz),
            lambda: CP_AXPY(cx, cy, a32, cz),
            in_cupy_side,
        ),
        # cubridge's own arrays, and the raw kernel against the elementwise one
        (
            "EK axpy out= cubridge / CuPy's EK on cupy",
            lambda: CB_AXPY(bx, by, A, bz),
            lambda: CP_AXPY(cx, cy, a32, cz),
            None,
        ),
        (
            "RawKernel axpy torch / EK axpy torch",
            lambda: RAW_AXPY(4, 256, (tx, ty, tz, a32, n32)),
            lambda: CB_AXPY(tx, ty, A, tz),
            None,
        ),
    ]


def timed(call, calls, context):
    with context() if context else _Null():
        start = time.perf_counter()
        for _ in range(calls):
            call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--out")
    args = p.parse_args()
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}, cupy {cp.__version__}")
    print(f"{'call':48} {'cubridge':>10} {'peer':>10} {'ratio':>7}  goal <= 1.00x")
    results = {}
    for label, ours, peer, context in rows():
        for f in (ours, peer):
            timed(f, 300, context)
        t = {"cubridge": [], "peer": []}
        for _ in range(args.rounds):
            t["cubridge"].append(timed(ours, args.calls, context))
            t["peer"].append(timed(peer, args.calls, context))
        m = {k: statistics.median(v) for k, v in t.items()}
        ratio = m["cubridge"] / m["peer"]
        results[label] = {**t, "ratio": ratio}
        verdict = "met" if ratio <= 1.0 else "MISSED"
        print(
            f"{label:48} {m['cubridge'] * 1e6:8.2f}us {m['peer'] * 1e6:8.2f}us "
            f"{ratio:6.2f}x  {verdict}",
            flush=True,
        )
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "small_calls.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
