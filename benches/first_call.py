"""First-call latency of the CUDA add in a fresh process, with an empty kernel cache: for each
dtype case, several new processes (CUDA and torch already initialised in each), each timing its
first `cubridge.add` (wall time until the kernel is queued, and until done), then the first add
with a transposed input in the same process, whose tiled kernel is a module of its own. Beside
them: a new process on a cache another one filled (warm), and CuPy's first `cupy.add` in a new
process with an empty `CUPY_CACHE_DIR`. Medians with min and max.

Goals: at most 5 ms to the launch for the common same-dtype cases and the float16/bfloat16 with
float32 promotions; at most 50 ms for any other case and for a first transposed add.

    python benches/first_call.py [--runs 5] [--out DIR]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from _common import save_json, start

# (case, common): the common cases are the ones whose goal is 5 ms.
CASES = [
    ("float32+float32", True),
    ("float16+float16", True),
    ("bfloat16+bfloat16", True),
    ("float16+float32", True),
    ("bfloat16+float32", True),
    ("int8+int8", True),
    ("int32+int32", True),
    ("int64+int64", True),
    ("uint8+uint8", True),
    ("bool+bool", True),
    ("float64+float64", True),
    ("int16+int16", False),
    ("complex64+complex64", False),
    ("float16+float64", False),
]

CHILD = r"""
import json, sys, time, torch, cubridge as cb
a_name, b_name = sys.argv[1].split("+")
def make(name):
    x = torch.ones(1 << 20, device="cuda", dtype=getattr(torch, name))
    return x
a, b = make(a_name), make(b_name)
at, bt = a.view(1024, 1024).T, b.view(1024, 1024)
torch.cuda.synchronize()
cb.cuda.synchronize()
t0 = time.perf_counter()
r = cb.add(a, b)
t1 = time.perf_counter()
torch.cuda.synchronize()
t2 = time.perf_counter()
rt = cb.add(at, bt)
t3 = time.perf_counter()
torch.cuda.synchronize()
t4 = time.perf_counter()
want = torch.full((1 << 20,), 2, dtype=torch.promote_types(a.dtype, b.dtype), device="cuda")
if a.dtype == torch.bool:
    want = torch.ones_like(a)
assert torch.equal(torch.from_dlpack(r), want)
assert torch.equal(torch.from_dlpack(rt), want.view(1024, 1024))
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
    return json.loads(out.stdout.strip().splitlines()[-1])


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
        f"\nfirst add in a new process, empty kernel cache, 2^20 elements; ms, median (min-max) "
        f"of {args.runs} processes"
    )
    print(f"{'case':22} {'to launch':>22} {'to done':>22} {'transposed, to launch':>24}  goal")
    results = {}
    chosen = args.cases.split(",") if args.cases else [c for c, _ in CASES]
    for case, common in CASES:
        if case not in chosen:
            continue
        runs = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as cache:
                runs.append(child(CHILD, case, {"CUBRIDGE_CACHE_DIR": cache}))
        results[case] = runs
        goal = 5.0 if common else 50.0
        launch = stats(runs, "launch")
        tl = stats(runs, "t_launch")
        verdict = "met" if launch[0] <= goal and tl[0] <= 50.0 else "MISSED"
        print(
            f"{case:22} {fmt(launch):>22} {fmt(stats(runs, 'done')):>22} {fmt(tl):>24}  "
            f"<= {goal:g} / 50 ms: {verdict}",
            flush=True,
        )
    warm = []
    with tempfile.TemporaryDirectory() as cache:
        if not args.no_warm:
            child(CHILD, "int16+int16", {"CUBRIDGE_CACHE_DIR": cache})
        for _ in range(0 if args.no_warm else args.runs):
            warm.append(child(CHILD, "int16+int16", {"CUBRIDGE_CACHE_DIR": cache}))
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
                    runs.append(child(CUPY_CHILD, case, {"CUPY_CACHE_DIR": cache}))
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
