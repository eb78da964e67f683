"""Where a small call's host time goes, phase by phase, beside its peer's call in the same run:
the breakdowns of the goals on small calls (CPU add on numpy arrays, imports of CuPy arrays,
add and users' kernels on CuPy arrays and torch tensors, current and side streams).

It needs cubridge built with the feature `phase-times`, a wheel of its own that reads the clock
at each phase of a call (`maturin build --release --features py312,phase-times`); the wheels
users install read none. Each row times the peer's call and cubridge's in interleaved rounds
(best of 5 rounds of `--calls` calls, each round ended by a device synchronize) and shows the
phases of cubridge's best round, in ns a call:

- `measured`: cubridge's call as timed here, with the clock readings; `est`: the same less the
  readings' cost (readings a call x one reading's cost, the least of several measurements made
  after each round), what the call costs without them; the ratio is `est` over the peer's
  time.
- each phase less its readings; `producer ...` phases are the producer's own code that
  cubridge calls (its export, its stream query, torch's `is_neg()` and `requires_grad`, the
  DLPack deleter or the reference dropped when an imported view goes);
- `outside`: the rest of the measured time, outside cubridge's function body: Python's call
  and pyo3's argument parsing, the result's conversion, the previous result's deallocation,
  and the benchmark's own loop.

The rows under "producers' own calls" are the producers' per-operand calls timed from Python
(each with a Python call's cost around it), for scale.

    python benches/call_phases.py [--calls 20000] [--only cpu,cupy,torch]
"""

import argparse
import time

import cubridge as cb
import numpy as np
from _common import start

N = 1 << 10
RAW_SRC = (
    'extern "C" __global__ void raw_sum(const float* x, const float* y, float* z, int n)'
    "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) z[i] = x[i] + y[i]; }"
)


def phase_times():
    """The phase times since the last call (the `phase-times` wheel's function), reset."""
    return cb._cubridge._phase_times()


def timed_round(fn, calls, sync):
    """(ns a call, the phase table of those calls) of one round of `calls` calls."""
    phase_times()
    begin = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    elapsed = (time.perf_counter_ns() - begin) / calls
    table = phase_times()
    sync()
    return elapsed, table


def best_rounds(peer, ours, calls, sync, rounds=5):
    """The peer's best time and cubridge's best round (time, phases), rounds interleaved."""
    for fn in (peer, ours):
        for _ in range(min(calls, 2000)):
            fn()
        sync()
    best_peer, best_ours = float("inf"), (float("inf"), None)
    for _ in range(rounds):
        best_peer = min(best_peer, timed_round(peer, calls, sync)[0])
        t = timed_round(ours, calls, sync)
        if t[0] < best_ours[0]:
            best_ours = t
    return best_peer, best_ours


def show(label, peer_label, peer, ours, calls, sync):
    t_peer, (measured, table) = best_rounds(peer, ours, calls, sync)
    n, reading = table["calls"], table["reading_ns"]
    if n != calls:
        raise SystemExit(f"{label}: {n} calls timed for {calls} made (is this the phase wheel?)")
    rows = [(name, ns / n, k / n) for name, ns, k in table["phases"] if k]
    inside = sum(ns for _, ns, _ in rows)
    # The phases' closing readings, and the one that opens the call.
    readings = sum(k for _, _, k in rows) + 1
    est = measured - readings * reading
    print(f"\n{label}  (peer: {peer_label})")
    print(
        f"  peer {t_peer:7.0f} ns | cubridge measured {measured:7.0f}, est {est:7.0f}: "
        f"{est / t_peer:5.2f}x, gap {est - t_peer:+6.0f} ns"
    )
    print(f"  {'outside':24s} {measured - inside:7.0f}")
    for name, ns, k in rows:
        print(f"  {name:24s} {ns - k * reading:7.0f}   ({k:.1f} readings)")
    print(f"  (one clock reading {reading:.1f} ns; {readings:.1f} readings a call)")


def python_calls(rows, calls, sync):
    print("\nproducers' own calls, timed from Python (best of 5 rounds)")
    for label, fn in rows:
        best = float("inf")
        for _ in range(5):
            best = min(best, timed_round(fn, calls, sync)[0])
        print(f"  {label:52s} {best:7.0f} ns")


def cpu_rows(calls):
    a, b, c = (np.ones(N, dtype=np.float32) for _ in range(3))
    own = [cb.asarray(x) for x in (a, b, c)]
    print("\n== CPU, numpy float32 2^10")
    pairs = [
        (
            "cb.add(a, b, out=c), numpy",
            "np.add(a, b, out=c)",
            lambda: np.add(a, b, out=c),
            lambda: cb.add(a, b, out=c),
        ),
        ("cb.add(a, b), numpy", "np.add(a, b)", lambda: np.add(a, b), lambda: cb.add(a, b)),
        (
            "cb.add on cubridge's views of them, out=",
            "np.add(a, b, out=c)",
            lambda: np.add(a, b, out=c),
            lambda: cb.add(own[0], own[1], out=own[2]),
        ),
    ]
    for label, peer_label, peer, ours in pairs:
        show(label, peer_label, peer, ours, calls, lambda: None)


def cupy_rows(calls):
    import cupy as cp

    sync = cp.cuda.Device().synchronize
    x, y, z = (cp.ones(N, dtype=cp.float32) for _ in range(3))
    ek = cb.ElementwiseKernel("T x, T y", "T z", "z = x + y", "phases_sum")
    cp_ek = cp.ElementwiseKernel("T x, T y", "T z", "z = x + y", "phases_sum")
    raw, cp_raw = cb.RawKernel(RAW_SRC, "raw_sum"), cp.RawKernel(RAW_SRC, "raw_sum")
    n32, grid, block = np.int32(N), ((N + 255) // 256,), (256,)
    print("\n== CuPy float32 2^10")
    show(
        "cb.from_dlpack(x)",
        "x.__dlpack__(stream=1)",
        lambda: x.__dlpack__(stream=1),
        lambda: cb.from_dlpack(x),
        calls,
        sync,
    )
    kept = [cb.from_dlpack(x) for _ in range(calls)]
    begin = time.perf_counter_ns()
    del kept[:]
    print(
        f"  (one imported array deallocated, CuPy's deleter included: "
        f"{(time.perf_counter_ns() - begin) / calls:.0f} ns)"
    )
    for where in ("current stream", "side stream"):
        stream = cp.cuda.Stream(non_blocking=True) if where == "side stream" else None
        with stream or cp.cuda.Stream.null:
            print(f"\n-- CuPy's {where}")
            show(
                "cb.add(x, y, out=z)",
                "cupy.add(x, y, out=z)",
                lambda: cp.add(x, y, out=z),
                lambda: cb.add(x, y, out=z),
                calls,
                sync,
            )
            show(
                "cb.add(x, y)",
                "cupy.add(x, y)",
                lambda: cp.add(x, y),
                lambda: cb.add(x, y),
                calls,
                sync,
            )
            show(
                "cb EK(x, y, out=z)",
                "cupy EK(x, y, z)",
                lambda: cp_ek(x, y, z),
                lambda: ek(x, y, out=z),
                calls,
                sync,
            )
            show("cb EK(x, y)", "cupy EK(x, y)", lambda: cp_ek(x, y), lambda: ek(x, y), calls, sync)
            show(
                "cb RawKernel",
                "cupy RawKernel",
                lambda: cp_raw(grid, block, (x, y, z, n32)),
                lambda: raw(grid, block, (x, y, z, n32)),
                calls,
                sync,
            )
    python_calls(
        [
            ("x.__dlpack__(stream=1)", lambda: x.__dlpack__(stream=1)),
            ("x.__dlpack_device__()", lambda: x.__dlpack_device__()),
            ("cupy.cuda.get_current_stream().ptr", lambda: cp.cuda.get_current_stream().ptr),
            ("a Python function that returns None", lambda: None),
        ],
        calls,
        sync,
    )


def torch_rows(calls):
    import torch

    sync = torch.cuda.synchronize
    t, u, v = (torch.ones(N, device="cuda") for _ in range(3))
    ek = cb.ElementwiseKernel("T x, T y", "T z", "z = x + y", "phases_sum")
    raw = cb.RawKernel(RAW_SRC, "raw_sum")
    n32, grid, block = np.int32(N), ((N + 255) // 256,), (256,)
    print("\n== torch float32 2^10")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    for where in ("current stream", "side stream"):
        with torch.cuda.stream(side if where == "side stream" else torch.cuda.current_stream()):
            print(f"\n-- torch's {where}")
            if where == "current stream":
                show(
                    "cb.add(t, u, out=v)",
                    "torch.add(t, u, out=v)",
                    lambda: torch.add(t, u, out=v),
                    lambda: cb.add(t, u, out=v),
                    calls,
                    sync,
                )
            show(
                "cb.add(t, u)",
                "torch.add(t, u)",
                lambda: torch.add(t, u),
                lambda: cb.add(t, u),
                calls,
                sync,
            )
            if where == "current stream":
                show(
                    "cb EK(t, u, out=v)",
                    "torch.add(t, u, out=v)",
                    lambda: torch.add(t, u, out=v),
                    lambda: ek(t, u, out=v),
                    calls,
                    sync,
                )
            show(
                "cb EK(t, u)",
                "torch.add(t, u)",
                lambda: torch.add(t, u),
                lambda: ek(t, u),
                calls,
                sync,
            )
            if where == "current stream":
                show(
                    "cb RawKernel(t, u, v)",
                    "torch.add(t, u, out=v)",
                    lambda: torch.add(t, u, out=v),
                    lambda: raw(grid, block, (t, u, v, n32)),
                    calls,
                    sync,
                )
    sync()
    python_calls(
        [
            ("t.is_neg()", lambda: t.is_neg()),
            ("t.requires_grad", lambda: t.requires_grad),
            ("torch.cuda.current_stream()", lambda: torch.cuda.current_stream()),
            ("a Python function that returns None", lambda: None),
        ],
        calls,
        sync,
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--only", default="cpu,cupy,torch")
    args, _ = start(p)
    if not hasattr(cb._cubridge, "_phase_times"):
        raise SystemExit("this cubridge was built without the feature phase-times")
    only = args.only.split(",")
    for name, rows in (("cpu", cpu_rows), ("cupy", cupy_rows), ("torch", torch_rows)):
        if name in only:
            rows(args.calls)


if __name__ == "__main__":
    main()
