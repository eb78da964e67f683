"""First-call latency of the CUDA add in a fresh process, with an empty kernel cache: for each
dtype case, several new processes (CUDA and torch already initialised in each), each timing its
first `cubridge.add` (wall time until the kernel is queued, and until done), then the first add
with a transposed input in the same process, whose tiled kernel is a module of its own. Beside
them: a new process on a cache another one filled (warm), and CuPy's first `cupy.add` in a new
process with an empty `CUPY_CACHE_DIR`. Medians with min and max.

Goals (median, to the launch, plain and transposed): at most 5 ms for every same-dtype add and
float16/bfloat16 with float32 and float64 (all shipped); at most 50 ms for other promotions and for a users'
ElementwiseKernel, which compile. With `CUBRIDGE_TRACE_LOADS=1` in the environment each child
also prints where its module loads spent their time (shown for the slowest child of a case).
"Empty" includes NVRTC's own cache (a fresh `CUDA_CACHE_PATH` a child): NVRTC 12.9 and later
serves a program that any process on the machine compiled before in about a tenth of its compile
time, which would otherwise make every child but the first look fast (`BENCH_NVRTC_CACHE=shared`
measures that case).

    python benches/first_call.py [--runs 5] [--out DIR]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from _common import caches_label, empty_caches, save_json, start

# (case, goal in ms): every same-dtype add ships (5 ms), as do float16 and bfloat16 with float32
# and float64; other promotions and a users' kernel compile (50 ms). "kernel" is a users' ElementwiseKernel
# (axpy on float32).
SAME = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
SAME += ["float16", "bfloat16", "float32", "float64", "complex64", "complex128"]
CASES = [(f"{d}+{d}", 5.0) for d in SAME]
CASES += [("float16+float32", 5.0), ("bfloat16+float32", 5.0), ("float16+float64", 5.0)]
CASES += [("int16+int32", 50.0), ("int8+int16", 50.0), ("float32+float64", 50.0)]
CASES += [("kernel", 50.0)]

CHILD = r"""
import json, sys, time, numpy as np, torch, cubridge as cb
case, n = sys.argv[1], 1 << 20
def make(name):
    if name == "bfloat16":
        return torch.ones(n, device="cuda", dtype=torch.bfloat16)
    return torch.from_numpy(np.ones(n, dtype=name)).cuda()
def host(r):
    t = torch.from_dlpack(r).cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()
if case == "kernel":
    k = cb.ElementwiseKernel("T x, T y, float32 a", "T z", "z = a * x + y", "first_axpy")
    a = b = make("float32")
    call = lambda x, y: k(x, y, 2.0)
    want = np.full(n, 3, np.float32)
else:
    a_name, b_name = case.split("+")
    a, b = make(a_name), make(b_name)
    call = cb.add
    pair = [np.float32 if d == "bfloat16" else np.dtype(d) for d in (a_name, b_name)]
    want = (np.ones(n, pair[0]) + np.ones(n, pair[1]))
at, bt = a.view(1024, 1024).T, b.view(1024, 1024)
torch.cuda.synchronize()
cb.cuda.synchronize()
t0 = time.perf_counter()
r = call(a, b)
t1 = time.perf_counter()
torch.cuda.synchronize()
t2 = time.perf_counter()
rt = call(at, bt)
t3 = time.perf_counter()
torch.cuda.synchronize()
t4 = time.perf_counter()
np.testing.assert_array_equal(host(r), want)
np.testing.assert_array_equal(host(rt).reshape(-1), want)
print(json.dumps({"launch": t1 - t0, "done": t2 - t0, "t_launch": t3 - t2, "t_done": t4 - t2}))
"""

CUPY_CHILD = r"""
import json, sys, time, torch, cupy
a_name, b_name = sys.argv[1].split("+")
a = cupy.from_dlpack(torch.ones(1 << 20, device="cuda", dtype=getattr(torch, a_name)))
b = cupy.from_dlpack(torch.ones(1 << 20, device="cuda", dtype=getattr(torch, b_name)))
torch.cuda.synchronize()
t0 = time.perf_counter()
r = cupy.add(a, b)
t1 = time.perf_counter()
cupy.cuda.get_current_stream().synchronize()
t2 = time.perf_counter()
print(json.dumps({"launch": t1 - t0, "done": t2 - t0}))
"""


def child(code, case, env):
    out = subprocess.run(
        [sys.executable, "-c", code, case],
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{case}: {out.stderr.strip().splitlines()[-1:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["trace"] = [x for x in out.stderr.splitlines() if x.startswith("cubridge: ")]
    return result


def stats(runs, key):
    xs = [r[key] * 1e3 for r in runs]
    return statistics.median(xs), min(xs), max(xs)


def fmt(s):
    return f"{s[0]:8.2f} ({s[1]:.2f}-{s[2]:.2f})"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--out", default=".")
    p.add_argument("--no-cupy", action="store_true")
    p.add_argument("--no-warm", action="store_true")
    p.add_argument("--cases", help="comma-separated subset of the cases, e.g. int16+int16")
    args, info = start(p)
    try:
        import cubridge as cb

        shipped = len(cb.cuda.shipped_kernels())
    except Exception:  # noqa: BLE001 - reported, not fatal
        shipped = "?"
    print(f"kernels shipped in this build: {shipped}", flush=True)
    print(
        f"\nfirst add in a new process, {caches_label()}, 2^20 elements; ms, median (min-max) "
        f"of {args.runs} processes"
    )
    print(f"{'case':22} {'to launch':>22} {'to done':>22} {'transposed, to launch':>24}  goal")
    results = {}
    chosen = args.cases.split(",") if args.cases else [c for c, _ in CASES]
    for case, goal in CASES:
        if case not in chosen:
            continue
        runs = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as cache:
                runs.append(child(CHILD, case, empty_caches("CUBRIDGE_CACHE_DIR", cache)))
        results[case] = runs
        launch = stats(runs, "launch")
        tl = stats(runs, "t_launch")
        # The goal holds for the worst process, its transposed call included.
        verdict = "met" if max(launch[2], tl[2]) <= goal else "MISSED"
        print(
            f"{case:22} {fmt(launch):>22} {fmt(stats(runs, 'done')):>22} {fmt(tl):>24}  "
            f"worst <= {goal:g} ms: {verdict}",
            flush=True,
        )
        slowest = max(runs, key=lambda r: r["launch"] + r["t_launch"])
        for line in slowest["trace"]:
            print(f"    slowest child: {line}", flush=True)
    warm = []
    with tempfile.TemporaryDirectory() as cache:
        if not args.no_warm:
            child(CHILD, "int16+int16", empty_caches("CUBRIDGE_CACHE_DIR", cache))
        for _ in range(0 if args.no_warm else args.runs):
            warm.append(child(CHILD, "int16+int16", empty_caches("CUBRIDGE_CACHE_DIR", cache)))
    if warm:
        print(
            f"{'int16+int16, warm':22} {fmt(stats(warm, 'launch')):>22} "
            f"{fmt(stats(warm, 'done')):>22} {fmt(stats(warm, 't_launch')):>24}  "
            "(a cache another process filled)",
            flush=True,
        )
    cupy_runs = {}
    if not args.no_cupy:
        for case in ("float32+float32", "float16+float32", "int16+int16"):
            runs = []
            for _ in range(args.runs):
                with tempfile.TemporaryDirectory() as cache:
                    runs.append(child(CUPY_CHILD, case, empty_caches("CUPY_CACHE_DIR", cache)))
            cupy_runs[case] = runs
            print(
                f"{'cupy.add ' + case:22} {fmt(stats(runs, 'launch')):>22} "
                f"{fmt(stats(runs, 'done')):>22}  (empty CUPY_CACHE_DIR)",
                flush=True,
            )
    os.makedirs(args.out, exist_ok=True)
    save_json(
        os.path.join(args.out, "first_call.json"),
        {"info": info, "cases": results, "warm_int16": warm, "cupy": cupy_runs},
    )


if __name__ == "__main__":
    main()
