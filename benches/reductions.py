"""Reductions: cubridge.sum beside torch.sum on the very same memory, and cubridge's
ReductionKernel beside CuPy's, in one run, with a table of ratios against the speed goals.

1. Throughput of `sum` over all elements, over the last axis (rows) and over the first axis
   (columns) of float32 and bfloat16 arrays of 2^20 ... 2^30 elements (2-D ones square-ish):
   GB/s read, ratio to torch.sum (goal >= 0.95) and to the peak (goal >= 0.9 from 2^26; the
   peak is --peak-gbps, else the device's nominal HBM bandwidth for H100/H200).
2. `(10^6, 2).sum(-1)` and `(10^6, 4).sum(-1)` against one elementwise pass over the same data
   (torch.mul by 1 into a preallocated output; goal <= 1.2x its time).
3. Wall time of a small call (2^10 elements of a torch tensor): cubridge.sum against torch.sum
   (goal <= 1.0x), and a users' ReductionKernel against CuPy's (goal <= 0.5x).
4. First calls in a fresh process with an empty kernel cache: a ReductionKernel (goal <= 50 ms)
   and `sum` of float32 (shipped: goal <= 5 ms), and CuPy's ReductionKernel with its cache
   empty as the peer; medians of --runs processes.

Device times come from CUDA events with the host's launch cost hidden (L2 flushed before each
call); every cubridge result is checked against torch's before its time is kept.

    python benches/reductions.py [--min-log2n 20] [--max-log2n 30] [--runs 5] [--out DIR]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import cubridge as cb
import torch
from _common import (
    GpuTimer,
    caches_label,
    calls_for,
    empty_caches,
    interleaved,
    save_json,
    start,
)

try:
    import cupy as cp
except ImportError:
    cp = None

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
NOMINAL_GBPS = {"H100": 3350.0, "H200": 4800.0}
ARGS = ("T x", "T y", "x", "a + b", "y = a", "0", "bench_sum")


def peak_gbps(given):
    if given:
        return given
    name = torch.cuda.get_device_name()
    return next((v for k, v in NOMINAL_GBPS.items() if k in name), None)


def cases(n):
    rows = 1 << (n.bit_length() - 1) // 2
    return {"all": ((n,), None), "rows": ((n // rows, rows), -1), "columns": ((rows, n // rows), 0)}


def close(got, x, dim):
    """Whether `got`, the sum of `x` over `dim` in x's dtype (accumulated in float32, rounded
    once), is the exact sum rounded to that dtype: within one of its ulps, plus the float32
    accumulation error, for any order of adding, of zero-mean data such as the bench's
    (rounding errors of random sign: eps * sqrt(n) * |x|_2, four times over)."""
    got, one_ulp = torch.from_dlpack(got).double(), torch.finfo(x.dtype).eps
    x = x.double()
    exact = x.sum(dim=dim)
    n = x.numel() // max(1, exact.numel())
    eps = torch.finfo(torch.float32).eps
    accumulation = 4 * eps * n**0.5 * x.square().sum(dim=dim).sqrt()
    return bool(((got - exact).abs() <= one_ulp * exact.abs() + accumulation).all())


def throughput(args, timer, peak, rows):
    print(
        f"\n{'dtype':9} {'case':8} {'n':>6} {'torch GB/s':>10} {'cubridge GB/s':>13} "
        f"{'vs torch':>8} {'of peak':>8}"
    )
    for dname in args.dtypes.split(","):
        for k in range(args.min_log2n, args.max_log2n + 1, args.step):
            n = 1 << k
            g = torch.Generator(device="cuda").manual_seed(k)
            x = torch.randn(n, device="cuda", generator=g).to(DTYPES[dname])
            for case, (shape, axis) in cases(n).items():
                v = x.view(shape)
                dim = tuple(range(v.ndim)) if axis is None else axis
                if not close(cb.sum(v, axis=axis), v, dim):
                    raise SystemExit(f"cubridge gave a wrong sum: {dname} {case} 2^{k}")
                r = 50 if n <= 1 << 24 else 10
                t = {
                    "torch": timer.time(lambda v=v, d=dim: torch.sum(v, dim=d), r),
                    "cubridge": timer.time(lambda v=v, a=axis: cb.sum(v, axis=a), r),
                }
                gbs = {name: n * x.element_size() / s / 1e9 for name, s in t.items()}
                row = {
                    "dtype": dname,
                    "case": case,
                    "log2n": k,
                    "seconds": t,
                    "GBps": gbs,
                    "vs_torch": t["torch"] / t["cubridge"],
                    "of_peak": gbs["cubridge"] / peak if peak else None,
                }
                rows.append(row)
                of_peak = f"{row['of_peak']:8.2f}" if peak else f"{'-':>8}"
                print(
                    f"{dname:9} {case:8} {'2^' + str(k):>6} {gbs['torch']:10.0f} "
                    f"{gbs['cubridge']:13.0f} {row['vs_torch']:8.2f} {of_peak}",
                    flush=True,
                )
            del x
            torch.cuda.empty_cache()


def tiny_rows(timer, rows):
    print(f"\n{'shape':12} {'pass ms':>8} {'sum ms':>8} {'sum / pass':>10}  (goal <= 1.2)")
    for width in (2, 4):
        x = torch.randn(10**6, width, device="cuda")
        y = torch.empty_like(x)
        if not close(cb.sum(x, axis=-1), x, -1):
            raise SystemExit(f"cubridge gave a wrong sum of (10^6, {width})")
        one_pass = timer.time(lambda x=x, y=y: torch.mul(x, 1, out=y), 50)
        ours = timer.time(lambda x=x: cb.sum(x, axis=-1), 50)
        rows.append({"case": f"(10^6, {width}).sum(-1)", "pass": one_pass, "sum": ours})
        print(f"(10^6, {width})  {one_pass * 1e3:8.3f} {ours * 1e3:8.3f} {ours / one_pass:10.2f}")


def small_calls(rows):
    x = torch.randn(1 << 10, device="cuda")
    fns = {"torch.sum": lambda: torch.sum(x), "cubridge.sum": lambda: cb.sum(x)}
    ours_k = cb.ReductionKernel(*ARGS)
    fns["cubridge ReductionKernel"] = lambda: ours_k(x)
    if cp is not None:
        theirs_k, cx = cp.ReductionKernel(*ARGS), cp.from_dlpack(x)
        fns["cupy ReductionKernel"] = lambda: theirs_k(cx)
    t = interleaved(fns, calls_for(1 << 10))
    print("\nsmall calls (2^10 float32, wall time per call):")
    for name, s in t.items():
        print(f"  {name:26} {s * 1e6:8.2f} us")
    print(f"  cubridge.sum / torch.sum {t['cubridge.sum'] / t['torch.sum']:.2f} (goal <= 1.0)")
    if cp is not None:
        ratio = t["cubridge ReductionKernel"] / t["cupy ReductionKernel"]
        print(f"  ReductionKernel cubridge / cupy {ratio:.2f} (goal <= 0.5)")
    rows.append({"small_calls_seconds": t})


FIRST = r"""
import json, sys, time, torch
x = torch.ones(1 << 20, device="cuda")
if sys.argv[1] == "cupy kernel":
    import cupy as cp
else:
    import cubridge as cb
torch.cuda.synchronize()
t0 = time.perf_counter()
if sys.argv[1] == "sum":
    r = cb.sum(x)
elif sys.argv[1] == "cupy kernel":
    # CuPy's first use of the GPU and its import of the tensor are in the time, as cubridge's.
    r = cp.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "first_sum")(cp.from_dlpack(x))
else:
    r = cb.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "first_sum")(x)
t1 = time.perf_counter()
assert torch.from_dlpack(r).item() == 1 << 20
print(json.dumps({"launch": t1 - t0}))
"""


def first_calls(runs, rows):
    """Each case in `runs` fresh processes with empty caches: cubridge's ReductionKernel and
    shipped sum against their goals, and CuPy's ReductionKernel (its own cache, CUPY_CACHE_DIR,
    empty too) as the peer, where CuPy is installed."""
    print(f"\nfirst call in a fresh process, {caches_label()} (ms to the launch: median, min-max):")
    cases = [("kernel", "CUBRIDGE_CACHE_DIR", 50.0), ("sum", "CUBRIDGE_CACHE_DIR", 5.0)]
    if cp is not None:
        cases.append(("cupy kernel", "CUPY_CACHE_DIR", None))
    for case, cache_variable, goal in cases:
        times = []
        for _ in range(runs):
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, **empty_caches(cache_variable, cache))
                out = subprocess.run(
                    [sys.executable, "-c", FIRST, case],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                times.append(json.loads(out.stdout.strip().splitlines()[-1])["launch"] * 1e3)
        med = statistics.median(times)
        target = f"goal <= {goal}" if goal else "peer"
        print(f"  {case:12} {med:8.2f} ({min(times):.2f}-{max(times):.2f}) {target}")
        rows.append({"first_call": case, "ms": times})


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min-log2n", type=int, default=20)
    p.add_argument("--max-log2n", type=int, default=30)
    p.add_argument("--step", type=int, default=2)
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--peak-gbps", type=float)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--out", default=".")
    args, info = start(p)
    timer, rows = GpuTimer(torch), []
    peak = peak_gbps(args.peak_gbps)
    throughput(args, timer, peak, rows)
    tiny_rows(timer, rows)
    small_calls(rows)
    first_calls(args.runs, rows)
    os.makedirs(args.out, exist_ok=True)
    save_json(os.path.join(args.out, "reductions.json"), {"info": info, "rows": rows})


if __name__ == "__main__":
    main()
