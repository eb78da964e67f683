"""Where a small kernel call spends its time: wall time per call (median of 7 rounds of 2000
calls, each round ended by a synchronize) of 2^10-element float32 kernels, with operands from
torch, CuPy and cubridge, beside torch.add and CuPy's ElementwiseKernel in the same run (on CuPy
arrays, and on torch tensors through a `cupy.from_dlpack` view of each per call).

    python benches/kernel_calls.py
"""

import time

import cubridge as cb
import cupy as cp
import numpy as np
import torch

n = 1 << 10
SUM = cb.ElementwiseKernel("T x, T y", "T z", "z = x + y", "prof_sum")
CPS = cp.ElementwiseKernel("T x, T y", "T z", "z = x + y", "prof_sum")
RAW = cb.RawKernel(
    'extern "C" __global__ void r(const float* x, const float* y, float* z, int n)'
    "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) z[i] = x[i] + y[i]; }",
    "r",
)
tx, ty, tz = (torch.randn(n, device="cuda") for _ in range(3))
bx, by, bz = (cb.asarray(t) for t in (tx, ty, tz))
cx, cy, cz = (cp.from_dlpack(t) for t in (tx, ty, tz))
N32 = np.int32(n)
cases = {
    "torch.add(out=)": lambda: torch.add(tx, ty, out=tz),
    "cupy ElementwiseKernel": lambda: CPS(cx, cy, cz),
    # What a CuPy user pays to run CuPy's kernel on torch tensors: a view of each per call.
    "cupy EK torch (from_dlpack)": lambda: CPS(
        cp.from_dlpack(tx), cp.from_dlpack(ty), cp.from_dlpack(tz)
    ),
    "cb.add torch (out=)": lambda: cb.add(tx, ty, out=tz),
    "cb.add cubridge (out=)": lambda: cb.add(bx, by, out=bz),
    "EK torch (out=)": lambda: SUM(tx, ty, out=tz),
    "EK torch positional out": lambda: SUM(tx, ty, tz),
    "EK cubridge (out=)": lambda: SUM(bx, by, out=bz),
    "EK cubridge positional out": lambda: SUM(bx, by, bz),
    "EK cubridge alloc": lambda: SUM(bx, by),
    "EK cupy (out=)": lambda: SUM(cx, cy, out=cz),
    "Raw cubridge": lambda: RAW(4, 256, (bx, by, bz, N32)),
    "Raw torch": lambda: RAW(4, 256, (tx, ty, tz, N32)),
    "cb.asarray(torch)": lambda: cb.asarray(tx),
}
for f in cases.values():
    for _ in range(500):
        f()
torch.cuda.synchronize()
res = {k: [] for k in cases}
for _ in range(7):
    for k, f in cases.items():
        t0 = time.perf_counter()
        for _ in range(2000):
            f()
        torch.cuda.synchronize()
        res[k].append((time.perf_counter() - t0) / 2000 * 1e6)
for k, v in res.items():
    print(f"{k:28} {sorted(v)[3]:7.2f} us")
