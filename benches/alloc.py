"""Calls that allocate, as users write them, beside torch and CuPy in one run (wall time per call,
median of 7 interleaved rounds, each round ended by a synchronize so that queued GPU work counts):

1. allocating add: cubridge.add(a, b) vs torch.add(a, b) vs cupy.add(a, b), 2^10 to 2^26 float32
   elements, and float16 / bfloat16 at 2^20 and 2^24 (bfloat16: no CuPy peer);
2. eight chained additions, y = y + x, on 2^20 float32 (cubridge arrays use `+`);
3. zeros and empty of 2^10, 2^20 and 2^24 float32 on the GPU;
4. host blocking: with 0.1 s of work queued on an unrelated torch side stream, how long each
   call holds the calling thread (goal: under 1 ms); pinned and managed memory included.

    python benches/alloc.py [--out DIR]
"""

import argparse
import gc
import os
import time

import cubridge as cb
import cupy as cp
import torch
from _common import calls_for, interleaved, save_json, start


def allocating_add(results):
    print("\n1. allocating add c = add(a, b), per call (wall, queued work included)")
    print(
        f"  {'dtype':9} {'n':>6} {'torch':>10} {'cupy':>10} {'cubridge':>10}  "
        "cubridge/torch  cubridge/cupy"
    )
    cases = [("float32", k) for k in range(10, 27, 2)]
    cases += [(d, k) for d in ("float16", "bfloat16") for k in (20, 24)]
    for dtype, k in cases:
        n = 1 << k
        a = torch.randn(n, device="cuda").to(getattr(torch, dtype))
        b = torch.randn(n, device="cuda").to(getattr(torch, dtype))
        torch.testing.assert_close(torch.from_dlpack(cb.add(a, b)), a + b)
        fns = {"torch": lambda a=a, b=b: torch.add(a, b), "cubridge": lambda a=a, b=b: cb.add(a, b)}
        if dtype != "bfloat16":
            ca, cb_ = cp.from_dlpack(a), cp.from_dlpack(b)
            fns["cupy"] = lambda ca=ca, cb_=cb_: cp.add(ca, cb_)
        t = interleaved(fns, calls_for(n))
        row = {"dtype": dtype, "n": n, **t, "vs_torch": t["cubridge"] / t["torch"]}
        if "cupy" in t:
            row["vs_cupy"] = t["cubridge"] / t["cupy"]
        results.append(row)
        cupy_s = f"{t['cupy'] * 1e6:8.1f}us" if "cupy" in t else f"{'-':>10}"
        vs_cupy = f"{row['vs_cupy']:.2f}x" if "vs_cupy" in row else "-"
        print(
            f"  {dtype:9} 2^{k:<4} {t['torch'] * 1e6:8.1f}us {cupy_s} "
            f"{t['cubridge'] * 1e6:8.1f}us  {row['vs_torch']:13.2f}x  {vs_cupy:>12}"
        )
        del a, b
        gc.collect()


def chain(results):
    n = 1 << 20
    xt = torch.randn(n, device="cuda")
    xc = cp.from_dlpack(xt)
    xb = cb.from_dlpack(xt)

    def run(x):
        y = x
        for _ in range(8):
            y = y + x
        return y

    torch.testing.assert_close(torch.from_dlpack(run(xb)), run(xt))
    t = interleaved(
        {"torch": lambda: run(xt), "cupy": lambda: run(xc), "cubridge": lambda: run(xb)}, 500
    )
    row = {
        "case": "8 chained + on 2^20 float32",
        **t,
        "vs_torch": t["cubridge"] / t["torch"],
        "vs_cupy": t["cubridge"] / t["cupy"],
    }
    results.append(row)
    print("\n2. eight chained y = y + x, 2^20 float32, per chain")
    print(
        f"  torch {t['torch'] * 1e6:.1f} us, cupy {t['cupy'] * 1e6:.1f} us, cubridge "
        f"{t['cubridge'] * 1e6:.1f} us: {row['vs_torch']:.2f}x torch, "
        f"{row['vs_cupy']:.2f}x cupy (goal <= 1.0x torch)"
    )


def creation(results):
    print("\n3. creation on the GPU, per call")
    print(
        f"  {'call':6} {'n':>6} {'torch':>10} {'cupy':>10} {'cubridge':>10}  "
        "cubridge/torch  cubridge/cupy"
    )
    for name in ("zeros", "empty"):
        for k in (10, 20, 24):
            n = 1 << k
            f_torch, f_cupy, f_cb = (getattr(m, name) for m in (torch, cp, cb))
            fns = {
                "torch": lambda f=f_torch, n=n: f(n, device="cuda"),
                "cupy": lambda f=f_cupy, n=n: f(n, dtype=cp.float32),
                "cubridge": lambda f=f_cb, n=n: f((n,), device="cuda"),
            }
            t = interleaved(fns, calls_for(n))
            row = {
                "call": name,
                "n": n,
                **t,
                "vs_torch": t["cubridge"] / t["torch"],
                "vs_cupy": t["cubridge"] / t["cupy"],
            }
            results.append(row)
            print(
                f"  {name:6} 2^{k:<4} {t['torch'] * 1e6:8.1f}us {t['cupy'] * 1e6:8.1f}us "
                f"{t['cubridge'] * 1e6:8.1f}us  {row['vs_torch']:13.2f}x  "
                f"{row['vs_cupy']:12.2f}x"
            )
    z = torch.from_dlpack(cb.zeros((1 << 20,), device="cuda"))
    assert not z.any()


def host_blocking(results):
    """Each call once, with 0.1 s queued on an unrelated torch side stream (after an
    empty_cache on every side, so that allocations must grow their pools)."""
    n = 1 << 22
    side = torch.cuda.Stream()
    t, u = torch.ones(n, device="cuda"), torch.ones(n, device="cuda")
    ct = cp.from_dlpack(t)
    cycles = int(0.1 * torch.cuda.get_device_properties(0).clock_rate * 1000)

    def drop(make):
        def fn():
            x = make()
            del x

        return fn

    def in_stream(fn):
        def run():
            with torch.cuda.stream(torch.cuda.Stream()):
                return fn()

        return run

    rows = [
        (
            "empty(2^22)",
            lambda: torch.empty(n, device="cuda"),
            lambda: cp.empty(n, dtype=cp.float32),
            lambda: cb.empty((n,), device="cuda"),
        ),
        (
            "zeros(2^22)",
            lambda: torch.zeros(n, device="cuda"),
            lambda: cp.zeros(n, dtype=cp.float32),
            lambda: cb.zeros((n,), device="cuda"),
        ),
        (
            "add(a, b) allocating",
            lambda: torch.add(t, u),
            lambda: cp.add(ct, ct),
            lambda: cb.add(t, u),
        ),
        (
            "add(a, b) in torch.cuda.stream",
            in_stream(lambda: torch.add(t, u)),
            None,
            in_stream(lambda: cb.add(t, u)),
        ),
        (
            "drop a new array",
            drop(lambda: torch.empty(n, device="cuda")),
            drop(lambda: cp.empty(n, dtype=cp.float32)),
            drop(lambda: cb.empty((n,), device="cuda")),
        ),
        (
            "empty(2^20) pinned",
            lambda: torch.empty(1 << 20, pin_memory=True),
            lambda: cp.cuda.alloc_pinned_memory(4 << 20),
            lambda: cb.empty((1 << 20,), device="cuda_host"),
        ),
        (
            "drop a pinned array",
            drop(lambda: torch.empty(1 << 20, pin_memory=True)),
            drop(lambda: cp.cuda.alloc_pinned_memory(4 << 20)),
            drop(lambda: cb.empty((1 << 20,), device="cuda_host")),
        ),
        (
            "empty(2^20) managed",
            None,
            lambda: cp.cuda.malloc_managed(4 << 20),
            lambda: cb.empty((1 << 20,), device="cuda_managed"),
        ),
        (
            "drop a managed array",
            None,
            drop(lambda: cp.cuda.malloc_managed(4 << 20)),
            drop(lambda: cb.empty((1 << 20,), device="cuda_managed")),
        ),
        (
            "drop an exported array",
            drop(lambda: torch.utils.dlpack.to_dlpack(torch.empty(n, device="cuda"))),
            drop(lambda: cp.empty(n, dtype=cp.float32).toDlpack()),
            drop(lambda: torch.from_dlpack(cb.empty((n,), device="cuda"))),
        ),
    ]
    for _, *fns in rows:
        for fn in fns:
            if fn is not None:
                fn()
    print("\n4. host blocking: ms the call held the thread with 0.1 s queued on a side stream")
    print(f"  {'call':34} {'torch':>8} {'cupy':>8} {'cubridge':>9}")
    for name, *fns in rows:
        got = []
        for fn in fns:
            if fn is None:
                got.append(None)
                continue
            torch.cuda.synchronize()
            gc.collect()
            torch.cuda.empty_cache()
            cp.get_default_memory_pool().free_all_blocks()
            cp.get_default_pinned_memory_pool().free_all_blocks()
            cb.cuda.empty_cache()
            with torch.cuda.stream(side):
                torch.cuda._sleep(cycles)
            t0 = time.perf_counter()
            keep = fn()
            got.append(time.perf_counter() - t0)
            del keep
            side.synchronize()
        results.append({"call": name, "torch": got[0], "cupy": got[1], "cubridge": got[2]})
        show = [f"{g * 1e3:8.3f}" if g is not None else f"{'-':>8}" for g in got]
        print(f"  {name:34} {show[0]} {show[1]} {show[2]:>9}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benches/results")
    args, info = start(p)
    results = {"add": [], "chain": [], "creation": [], "blocking": []}
    allocating_add(results["add"])
    chain(results["chain"])
    creation(results["creation"])
    host_blocking(results["blocking"])
    os.makedirs(args.out, exist_ok=True)
    save_json(os.path.join(args.out, "alloc.json"), {"info": info, **results})


if __name__ == "__main__":
    main()
