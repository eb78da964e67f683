"""CUDA add throughput: cubridge.add(a, b, out=c) on torch tensors against torch.add(out=) and
cupy.add(out=) on the very same memory, in one run, over 2^10 ... 2^30 elements, for float32,
float16 and bfloat16, with contiguous inputs and with one 2-D input transposed.

Device time per call from CUDA events (host launch cost hidden behind a spin kernel), median of
several calls, L2 flushed before each call. Bandwidth counts two reads and one write. Every
cubridge result is checked against torch's before its time is kept.

    python benches/cuda_add.py [--min-log2n 10] [--max-log2n 30] [--out DIR]
"""

import argparse
import os

import cubridge as cb
import cupy as cp
import torch
from _common import GpuTimer, plot, save_json, start

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def repeats(n):
    return 50 if n <= 1 << 20 else 20 if n <= 1 << 26 else 7


def operands(n, dtype, layout):
    """a, b, c of n elements; with layout "transposed" a is the transpose of a contiguous 2-D
    tensor (strides (1, rows)), b and c are contiguous of the same 2-D shape."""
    g = torch.Generator(device="cuda").manual_seed(n)
    if layout == "contiguous":
        shape = (n,)
        a = torch.randn(shape, device="cuda", generator=g).to(dtype)
    else:
        rows = 1 << (n.bit_length() - 1) // 2
        shape = (rows, n // rows)
        a = torch.randn(shape[::-1], device="cuda", generator=g).to(dtype).t()
    b = torch.randn(shape, device="cuda", generator=g).to(dtype)
    c = torch.empty(shape, device="cuda", dtype=dtype)
    return a, b, c


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min-log2n", type=int, default=10)
    p.add_argument("--max-log2n", type=int, default=30)
    p.add_argument("--step", type=int, default=2)
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--out", default=".")
    args, info = start(p)
    timer = GpuTimer(torch)
    rows, series = [], {}
    print(
        f"\n{'dtype':9} {'layout':10} {'n':>6} {'torch GB/s':>10} {'cupy GB/s':>10} "
        f"{'cubridge GB/s':>13} {'vs torch':>8} {'vs cupy':>8}"
    )
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        for layout in ["contiguous", "transposed"]:
            for k in range(args.min_log2n, args.max_log2n + 1, args.step):
                n = 1 << k
                a, b, c = operands(n, dtype, layout)
                reference = torch.add(a, b)
                ca, cb_, cc = cp.from_dlpack(a), cp.from_dlpack(b), cp.from_dlpack(c)
                impls = {
                    "torch": lambda a=a, b=b, c=c: torch.add(a, b, out=c),
                    "cupy": lambda ca=ca, cb_=cb_, cc=cc: cp.add(ca, cb_, out=cc),
                    "cubridge": lambda a=a, b=b, c=c: cb.add(a, b, out=c),
                }
                if dtype == torch.bfloat16:
                    impls.pop("cupy")  # CuPy has no bfloat16
                r = repeats(n)
                t = {}
                for name, fn in impls.items():
                    c.zero_()
                    fn()
                    torch.cuda.synchronize()
                    if not torch.equal(c, reference):
                        raise SystemExit(f"{name} gave a wrong result: {dname} {layout} 2^{k}")
                    t[name] = timer.time(fn, r)
                gbs = {name: 3 * n * a.element_size() / s / 1e9 for name, s in t.items()}
                row = {
                    "dtype": dname,
                    "layout": layout,
                    "log2n": k,
                    "seconds": t,
                    "GBps": gbs,
                    "vs_torch": t["torch"] / t["cubridge"],
                    "vs_cupy": t["cupy"] / t["cubridge"] if "cupy" in t else None,
                }
                rows.append(row)
                vs_cupy = f"{row['vs_cupy']:8.2f}" if row["vs_cupy"] else f"{'-':>8}"
                print(
                    f"{dname:9} {layout:10} {'2^' + str(k):>6} {gbs['torch']:10.0f} "
                    f"{gbs.get('cupy', 0):10.0f} {gbs['cubridge']:13.0f} "
                    f"{row['vs_torch']:8.2f} {vs_cupy}",
                    flush=True,
                )
                for name, v in gbs.items():
                    series.setdefault(f"{name} {dname} {layout}", []).append((n, v))
                del a, b, c, ca, cb_, cc, reference
                torch.cuda.empty_cache()
    print("\ncubridge transposed / contiguous throughput (goal >= 0.9):")
    for dname in args.dtypes.split(","):
        for k in range(args.min_log2n, args.max_log2n + 1, args.step):
            pick = {r["layout"]: r for r in rows if r["dtype"] == dname and r["log2n"] == k}
            ratio = (
                pick["contiguous"]["seconds"]["cubridge"]
                / pick["transposed"]["seconds"]["cubridge"]
            )
            print(f"  {dname:9} 2^{k:<3} {ratio:.2f}")
    os.makedirs(args.out, exist_ok=True)
    save_json(os.path.join(args.out, "cuda_add.json"), {"info": info, "rows": rows})
    plot(
        os.path.join(args.out, "cuda_add.png"),
        "add throughput (two reads + one write)",
        "elements",
        "GB/s",
        series,
    )


if __name__ == "__main__":
    main()
