"""A user's elementwise kernel z = a * x + y beside its peers, in one run (wall time per call,
median of 7 interleaved rounds, each round ended by a synchronize so that queued GPU work counts):

- cubridge: cubridge.ElementwiseKernel("T x, T y, float32 a", "T z", ...) on torch tensors, with
  `out=` (a preallocated torch tensor) and allocating its result;
- torch: torch.add(y, x, alpha=a), the one fused op torch has for it, with `out=` and allocating;
- CuPy: cupy.ElementwiseKernel with the same operation on the same memory (cupy views of the
  torch tensors), with `out=` and allocating (bfloat16: no CuPy peer).

float32 and bfloat16 at 2^10 (call overhead) and 2^20 to 2^26 (bandwidth). From 2^22 each `out=`
call is also timed on the device alone (CUDA events around the call, queued behind a spin kernel
so that no host cost falls inside, L2 flushed before each; median of 30): the kernels' own
bandwidth. Last, x as a transposed view (2^12 x 2^12), device time: cubridge's tiled kernel
against the peers' strided loops. Goal: cubridge at least 1.0x both peers at 2^24 and above, and
a call overhead at most CuPy's.

    python benches/kernels.py [--out DIR]
"""

import argparse
import os

import cubridge as cb
import cupy as cp
import torch
from _common import GpuTimer, calls_for, interleaved, save_json, start

OP = "z = (T)(a * (float)x + (float)y)"
CB = cb.ElementwiseKernel("T x, T y, float32 a", "T z", OP, "bench_axpy")
CP = cp.ElementwiseKernel("T x, T y, float32 a", "T z", "z = a * x + y", "bench_axpy")


def peers(mode, a, x, y, out, cx, cy, cout):
    """The calls compared in one row: with `out=`, or allocating their result."""
    if mode == "out":
        fns = {
            "torch": lambda: torch.add(y, x, alpha=a, out=out),
            "cubridge": lambda: CB(x, y, a, out=out),
        }
        if cx is not None:
            fns["cupy"] = lambda: CP(cx, cy, cp.float32(a), cout)
        return fns
    fns = {"torch": lambda: torch.add(y, x, alpha=a), "cubridge": lambda: CB(x, y, a)}
    if cx is not None:
        fns["cupy"] = lambda: CP(cx, cy, cp.float32(a))
    return fns


def show(label, t):
    """Prints one row: `label`, then each peer's time per call and cubridge's ratios."""
    cupy_t = t.get("cupy")
    print(
        f"{label} {t['torch'] * 1e6:8.1f}us "
        + (f"{cupy_t * 1e6:8.1f}us " if cupy_t else f"{'-':>10} ")
        + f"{t['cubridge'] * 1e6:8.1f}us  {t['cubridge'] / t['torch']:7.2f}x  "
        + (f"{t['cubridge'] / cupy_t:6.2f}x" if cupy_t else "     -")
    )


def transposed(a, timer, rows):
    """The same kernel with x a transposed view (2^12 x 2^12), y and out contiguous: cubridge
    takes its tiled kernel (add's), torch and CuPy their strided loops. Device time per call."""
    print(f"\n{'dtype':9} {'x':>10} {'torch':>10} {'cupy':>10} {'cubridge':>10}  cb/torch  cb/cupy")
    side = 1 << 12
    for dtype in ("float32", "bfloat16"):
        td = getattr(torch, dtype)
        x = torch.randn(side, side, device="cuda").to(td).T
        y = torch.randn(side, side, device="cuda").to(td)
        out = torch.empty_like(y)
        cx, cy, cout = (
            (cp.from_dlpack(t) for t in (x, y, out)) if dtype != "bfloat16" else (None,) * 3
        )
        fns = peers("out", a, x, y, out, cx, cy, cout)
        want = torch.add(y.float(), x.float(), alpha=a).to(td)
        CB(x, y, a, out=out)
        torch.testing.assert_close(out.float(), want.float(), rtol=1e-2, atol=1e-2)
        d = {name: timer.time(fn, 30) for name, fn in fns.items()}
        rows.append({"dtype": dtype, "n": side * side, "mode": "transposed-device", **d})
        show(f"{dtype:9} {'2^12 x 2^12':>10}", d)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benches/results")
    args, info = start(p)
    a = 2.5
    rows = []
    timer = GpuTimer(torch)
    print(
        f"\n{'dtype':9} {'n':>5} {'mode':6} {'torch':>10} {'cupy':>10} {'cubridge':>10}  "
        "cb/torch  cb/cupy"
    )
    for dtype in ("float32", "bfloat16"):
        td = getattr(torch, dtype)
        for k in (10, 20, 22, 24, 26):
            n = 1 << k
            x = torch.randn(n, device="cuda").to(td)
            y = torch.randn(n, device="cuda").to(td)
            out = torch.empty_like(x)
            cx, cy, cout = (
                (cp.from_dlpack(t) for t in (x, y, out)) if dtype != "bfloat16" else (None,) * 3
            )
            for mode in ("out", "alloc"):
                fns = peers(mode, a, x, y, out, cx, cy, cout)
                t = interleaved(fns, calls_for(n))
                row = {"dtype": dtype, "n": n, "mode": mode, **{k2: v for k2, v in t.items()}}
                rows.append(row)
                show(f"{dtype:9} 2^{k:<3} {mode:6}", t)
                if mode == "out" and k >= 22:
                    d = {name: timer.time(fn, 30) for name, fn in fns.items()}
                    rows.append({"dtype": dtype, "n": n, "mode": "device", **d})
                    show(f"{dtype:9} 2^{k:<3} {'device':6}", d)
    transposed(a, timer, rows)
    os.makedirs(args.out, exist_ok=True)
    save_json(os.path.join(args.out, "kernels.json"), {"versions": info, "rows": rows})


if __name__ == "__main__":
    main()
