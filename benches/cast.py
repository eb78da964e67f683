"""Casts on the device: cubridge.asarray(x, dtype=...) of a float32 CUDA tensor against torch's
x.to(dtype) on the same tensor, in one run (wall time per call, median of 7 interleaved rounds,
each round ended by a synchronize so that queued GPU work counts), at 2^10, 2^20 and 2^24
elements, into float16, bfloat16, float64 and int32; and the copy of the same dtype
(cubridge.asarray(x, copy=True) against x.clone()).

The source is contiguous, or a transposed 2-D view (strides (1, rows)). cubridge's result is
C-contiguous, so its transposed rows are timed against x.to(dtype,
memory_format=torch.contiguous_format) (x.to(dtype) alone would keep the transposed layout).
From 2^20 each call is also timed on the device alone (CUDA events around it, queued behind a
spin kernel, L2 flushed before each; median of 20). Every result is checked against torch's
before it is timed. Goal: cubridge at most 1.1x torch at 2^24.

    python benches/cast.py [--out DIR]
"""

import argparse
import os

import cubridge as cb
import torch
from _common import GpuTimer, calls_for, interleaved, save_json, start

TARGETS = ["float16", "bfloat16", "float64", "int32", "float32"]


def source(k, layout):
    """A float32 CUDA tensor of 2^k values (scaled so that int32 keeps some of them apart)."""
    g = torch.Generator(device="cuda").manual_seed(k)
    if layout == "contiguous":
        return torch.randn(1 << k, device="cuda", generator=g) * 100
    rows = 1 << k // 2
    return (torch.randn((1 << k) // rows, rows, device="cuda", generator=g) * 100).t()


def calls(x, target, layout):
    """cubridge's call and torch's for one row (target "float32": a copy of the same dtype)."""
    fmt = torch.contiguous_format if layout == "transposed" else torch.preserve_format
    if target == "float32":
        return {
            "torch": lambda: x.clone(memory_format=fmt),
            "cubridge": lambda: cb.asarray(x, copy=True),
        }
    dtype = getattr(torch, target)
    return {
        "torch": lambda: x.to(dtype, memory_format=fmt),
        "cubridge": lambda: cb.asarray(x, dtype=target),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".")
    args, info = start(p)
    timer = GpuTimer(torch)
    rows = []
    print(
        f"\n{'source':10} {'n':>5} {'target':9} {'torch':>10} {'cubridge':>10} {'ratio':>7}"
        f"   {'device: torch':>13} {'cubridge':>10} {'ratio':>7}"
    )
    for layout in ["contiguous", "transposed"]:
        for k in (10, 20, 24):
            x = source(k, layout)
            for target in TARGETS:
                fns = calls(x, target, layout)
                want = fns["torch"]()
                got = torch.from_dlpack(fns["cubridge"]())
                if got.dtype != want.dtype or not torch.equal(got, want):
                    raise SystemExit(f"wrong result: {layout} 2^{k} into {target}")
                t = interleaved(fns, calls_for(1 << k))
                row = {"layout": layout, "log2n": k, "target": target, "wall": t}
                line = (
                    f"{layout:10} {'2^' + str(k):>5} {target:9} {t['torch'] * 1e6:8.1f}us "
                    f"{t['cubridge'] * 1e6:8.1f}us {t['cubridge'] / t['torch']:6.2f}x"
                )
                if k >= 20:
                    d = {name: timer.time(fn, 20) for name, fn in fns.items()}
                    row["device"] = d
                    line += (
                        f"   {d['torch'] * 1e6:11.1f}us {d['cubridge'] * 1e6:8.1f}us "
                        f"{d['cubridge'] / d['torch']:6.2f}x"
                    )
                rows.append(row)
                print(line, flush=True)
            del x
            torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    save_json(os.path.join(args.out, "cast.json"), {"info": info, "rows": rows})


if __name__ == "__main__":
    main()
