"""What a call on CuPy arrays costs: CuPy's own DLPack export, cubridge's import of it, and
`add` against `cupy.add`, on CuPy's default stream and on a side stream. Wall time per call,
mean of 20000 calls after 1000 warm-up calls, 2^10 float32. Needs CUDA, CuPy and torch (for
the device synchronize and the torch rows).

    python3 benches/cupy_calls.py
"""

import time

import cubridge as cb
import cupy
import torch


def timed(label, call, n=20000):
    for _ in range(1000):
        call()
    torch.cuda.synchronize()
    start = time.perf_counter_ns()
    for _ in range(n):
        call()
    end = time.perf_counter_ns()
    torch.cuda.synchronize()
    print(f"{label:55s} {(end - start) / n:8.0f} ns")


def main():
    x = cupy.ones(1024, dtype=cupy.float32)
    z = cupy.empty(1024, dtype=cupy.float32)
    t = torch.ones(1024, device="cuda")
    print("cupy current stream ptr", cupy.cuda.get_current_stream().ptr)
    timed("x.__dlpack_device__()", lambda: x.__dlpack_device__())
    timed("x.__dlpack__(max_version=(1,3))", lambda: x.__dlpack__(max_version=(1, 3)))
    timed(
        "x.__dlpack__(stream=None, max_version=(1,3))",
        lambda: x.__dlpack__(stream=None, max_version=(1, 3)),
    )
    timed(
        "x.__dlpack__(stream=1, max_version=(1,3))",
        lambda: x.__dlpack__(stream=1, max_version=(1, 3)),
    )
    timed(
        "x.__dlpack__(stream=-1, max_version=(1,3))",
        lambda: x.__dlpack__(stream=-1, max_version=(1, 3)),
    )
    timed("x.__dlpack__(stream=1)", lambda: x.__dlpack__(stream=1))
    timed("x.__cuda_array_interface__", lambda: x.__cuda_array_interface__)
    timed("cb.from_dlpack(x)", lambda: cb.from_dlpack(x))
    timed("cb.asarray(x)", lambda: cb.asarray(x))
    timed("cupy.add(x,x)", lambda: cupy.add(x, x))
    timed("cupy.add(x,x,out=z)", lambda: cupy.add(x, x, out=z))
    timed("cb.add(x,x)", lambda: cb.add(x, x))
    timed("cb.add(x,x,out=z)", lambda: cb.add(x, x, out=z))
    timed("t.is_neg()", lambda: t.is_neg())
    timed("t.__dlpack__(stream=1)", lambda: t.__dlpack__(stream=1))
    timed("cb.asarray(t)", lambda: cb.asarray(t))
    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        print("on a cupy side stream")
        timed(
            "  x.__dlpack__(stream=1, max_version=(1,3))",
            lambda: x.__dlpack__(stream=1, max_version=(1, 3)),
        )
        timed("  cb.add(x,x)", lambda: cb.add(x, x))
        timed("  cupy.add(x,x)", lambda: cupy.add(x, x))


if __name__ == "__main__":
    main()
