"""First call of a template instance of a RawModule in a new process: `RawModule(code=...,
name_expressions=["axpb<float>"])`, `get_function("axpb<float>")` and its launch on torch
tensors, timed to the launch and until done, with an empty kernel cache and with a cache that
another process filled (warm). Beside it CuPy's RawModule, with an empty and a warm
`CUPY_CACHE_DIR`. Medians with min and max over several processes.

cubridge keeps the module's image and the lowered names of its name expressions in its disk
cache, so a warm process compiles nothing (`CUBRIDGE_TRACE_LOADS=1` shows "disk cache").

    python benches/modules.py [--runs 5] [--out DIR] [--no-cupy]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from _common import empty_caches, save_json, start

SOURCE = r"""
template <typename T> __global__ void axpb(const T* x, T* y, T a, T b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
"""

CHILD = r"""
import json, sys, time, numpy as np, torch
lib, source, n = sys.argv[1], sys.argv[2], 1 << 20
x = torch.ones(n, device="cuda")
y = torch.zeros(n, device="cuda")
if lib == "cubridge":
    import cubridge as cb
    cb.cuda.synchronize()
else:
    import cupy
    cupy.cuda.Device().synchronize()
torch.cuda.synchronize()
t0 = time.perf_counter()
if lib == "cubridge":
    m = cb.RawModule(code=source, name_expressions=["axpb<float>"])
    k = m.get_function("axpb<float>")
    k((n + 255) // 256, 256, (x, y, np.float32(2), np.float32(1), np.int32(n)))
else:
    m = cupy.RawModule(code=source, name_expressions=["axpb<float>"])
    k = m.get_function("axpb<float>")
    args = (cupy.from_dlpack(x), cupy.from_dlpack(y), np.float32(2), np.float32(1), np.int32(n))
    k(((n + 255) // 256,), (256,), args)
t1 = time.perf_counter()
torch.cuda.synchronize()
t2 = time.perf_counter()
assert (y == 3).all().item()
print(json.dumps({"launch": t1 - t0, "done": t2 - t0}))
"""


def child(lib, env):
    out = subprocess.run(
        [sys.executable, "-c", CHILD, lib, SOURCE],
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{lib}: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def runs_of(lib, variable, runs, warm):
    """`runs` new processes of `lib`, each on an empty cache, or all on one cache a first
    process filled (`warm`); the cache folder is given by the environment `variable`."""
    out = []
    if warm:
        with tempfile.TemporaryDirectory() as cache:
            child(lib, empty_caches(variable, cache))
            out = [child(lib, empty_caches(variable, cache)) for _ in range(runs)]
    else:
        for _ in range(runs):
            with tempfile.TemporaryDirectory() as cache:
                out.append(child(lib, empty_caches(variable, cache)))
    return out


def fmt(runs, key):
    xs = [r[key] * 1e3 for r in runs]
    return f"{statistics.median(xs):8.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--out", default=".")
    p.add_argument("--no-cupy", action="store_true")
    args, info = start(p)
    libs = [("cubridge", "CUBRIDGE_CACHE_DIR")]
    if not args.no_cupy:
        libs.append(("cupy", "CUPY_CACHE_DIR"))
    print(
        f"\nfirst call of a RawModule template instance in a new process, 2^20 floats; ms, "
        f"median (min-max) of {args.runs} processes"
    )
    print(f"{'case':24} {'to launch':>24} {'to done':>24}")
    results = {}
    for lib, variable in libs:
        for warm in (False, True):
            case = f"{lib}, {'warm' if warm else 'empty'} cache"
            runs = runs_of(lib, variable, args.runs, warm)
            results[case] = runs
            print(f"{case:24} {fmt(runs, 'launch'):>24} {fmt(runs, 'done'):>24}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    save_json(os.path.join(args.out, "modules.json"), {"info": info, "cases": results})


if __name__ == "__main__":
    main()
