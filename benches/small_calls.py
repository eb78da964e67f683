"""Small calls on other libraries' arrays against those libraries' own calls (issue 28's table):
wall time per call of 2^10-element float32 operations, median of 7 rounds of 2000 calls, each
round ended by a device synchronize, every case's rounds interleaved with its peer's. Each row
prints cubridge's time, the peer's and the ratio (goal: at most 1.00x). The peer is the
producer's own call: `torch.add` (for the axpy, `torch.add(y, x, alpha=a)`), `cupy.add`, CuPy's
ElementwiseKernel; the RawKernel row's peer is cubridge's own ElementwiseKernel on the same
tensors.

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
    sides = {"torch": lambda: torch.cuda.stream(torch_side), "cupy": lambda: cupy_side}
    # Per library: its arrays, its add, and its one call for z = a * x + y (with and without z).
    libs = {
        "torch": ((tx, ty, tz), torch.add, lambda x, y, *z: torch.add(y, x, alpha=A, out=z[0])
                  if z else torch.add(y, x, alpha=A)),
        "cupy": ((cx, cy, cz), cp.add, lambda x, y, *z: CP_AXPY(x, y, a32, *z)),
    }  # fmt: skip
    out = []
    for lib, ((x, y, z), add, axpy) in libs.items():
        for where, context in (("", None), (", side stream", sides[lib])):
            out += [
                (f"add(a, b, out=c) {lib}{where}", lambda x=x, y=y, z=z: cb.add(x, y, out=z),
                 lambda x=x, y=y, z=z, add=add: add(x, y, out=z), context),
                (f"add(a, b) {lib}{where}", lambda x=x, y=y: cb.add(x, y),
                 lambda x=x, y=y, add=add: add(x, y), context),
                (f"EK axpy out= {lib}{where}", lambda x=x, y=y, z=z: CB_AXPY(x, y, A, z),
                 lambda x=x, y=y, z=z, axpy=axpy: axpy(x, y, z), context),
                (f"EK axpy {lib}{where}", lambda x=x, y=y: CB_AXPY(x, y, A),
                 lambda x=x, y=y, axpy=axpy: axpy(x, y), context),
            ]  # fmt: skip
    return out + [
        # cubridge's own arrays, and the raw kernel against the elementwise one
        ("EK axpy out= cubridge / CuPy's EK on cupy", lambda: CB_AXPY(bx, by, A, bz),
         lambda: CP_AXPY(cx, cy, a32, cz), None),
        ("RawKernel axpy torch / EK axpy torch", lambda: RAW_AXPY(4, 256, (tx, ty, tz, a32, n32)),
         lambda: CB_AXPY(tx, ty, A, tz), None),
    ]  # fmt: skip


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
