"""What a small call on torch tensors or CuPy arrays is made of, measured from Python in one
process: the peer's own call, cubridge's call on its own arrays (no import), the same call on
the producer's arrays, and the producer's calls that cubridge makes per operand (torch's
exchange-table export through ctypes, `is_neg()`, `requires_grad`; CuPy's current stream and
`__dlpack__`), with the driver's launch of an empty kernel through ctypes for scale. Mean wall
time per call over 20000 calls after 2000 warm-up calls, 2^10 float32, best of 3 repeats.

    python benches/call_parts.py
"""

import ctypes
import time

import cubridge as cb
import cupy as cp
import torch

N = 1 << 10


def timed(label, call, n=20000):
    best = float("inf")
    for _ in range(3):
        for _ in range(2000):
            call()
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        for _ in range(n):
            call()
        best = min(best, (time.perf_counter_ns() - start) / n)
        torch.cuda.synchronize()
    print(f"{label:60s} {best:8.0f} ns", flush=True)
    return best


def table_function(tensor_type, offset):
    """A function of torch's DLPack exchange table, callable through ctypes."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    api = get(tensor_type.__dlpack_c_exchange_api__, b"dlpack_exchange_api")
    return ctypes.c_void_p.from_address(api + offset).value


def main():
    tx, ty, tz = (torch.randn(N, device="cuda") for _ in range(3))
    bx, by, bz = (cb.asarray(t) for t in (tx, ty, tz))
    cx, cy, cz = (cp.asarray(t) for t in (tx, ty, tz))
    print(torch.cuda.get_device_name())
    print("-- torch tensors")
    timed("torch.add(a, b, out=c)", lambda: torch.add(tx, ty, out=tz))
    timed("cb.add(a, b, out=c) on cubridge arrays (no import)", lambda: cb.add(bx, by, out=bz))
    timed("cb.add(a, b, out=c) on torch tensors", lambda: cb.add(tx, ty, out=tz))
    timed("cb.asarray(t) (an owning export and a kept view)", lambda: cb.asarray(tx))
    side = torch.cuda.Stream()
    timed("cb.add(a, b) on cubridge arrays (no import)", lambda: cb.add(bx, by))
    timed(
        "cb.add(a, b, out=c, stream=side) on cubridge arrays",
        lambda: cb.add(bx, by, out=bz, stream=side),
    )
    timed("cb.add(a, b, stream=side) on cubridge arrays", lambda: cb.add(bx, by, stream=side))
    timed("cb.empty(n) then dropped, legacy stream", lambda: cb.empty(N, device="cuda"))
    with torch.cuda.stream(side):
        timed("torch.add(a, b, out=c) inside a side stream", lambda: torch.add(tx, ty, out=tz))
        timed("torch.add(a, b) inside a side stream", lambda: torch.add(tx, ty))
        timed("cb.add(a, b, out=c) inside a side stream", lambda: cb.add(tx, ty, out=tz))
        timed("cb.add(a, b) inside a side stream", lambda: cb.add(tx, ty))
    lend = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_void_p)(
        table_function(torch.Tensor, 40)
    )
    out = ctypes.create_string_buffer(48)
    where = ctypes.addressof(out)
    timed("  torch's dltensor_from_py_object_no_sync via ctypes", lambda: lend(tx, where))
    stream_of = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p)(
        table_function(torch.Tensor, 48)
    )
    slot = ctypes.c_void_p()
    timed(
        "  torch's current_work_stream via ctypes",
        lambda: stream_of(2, 0, ctypes.addressof(slot)),
    )
    nothing = ctypes.PYFUNCTYPE(ctypes.c_void_p)(ctypes.pythonapi.PyGILState_GetThisThreadState)
    timed("  a ctypes call of a C function that does nothing much", nothing)
    timed("  t.is_neg()", lambda: tx.is_neg())
    timed("  t.requires_grad", lambda: tx.requires_grad)
    print("-- CuPy arrays")
    timed("cupy.add(a, b, out=c)", lambda: cp.add(cx, cy, out=cz))
    timed("cb.add(a, b, out=c) on CuPy arrays", lambda: cb.add(cx, cy, out=cz))
    timed("  cupy.cuda.get_current_stream().ptr", lambda: cp.cuda.get_current_stream().ptr)
    timed("  x.__dlpack_device__()", lambda: cx.__dlpack_device__())
    timed(
        "  x.__dlpack__(stream=1, max_version=(1, 3))",
        lambda: cx.__dlpack__(stream=1, max_version=(1, 3)),
    )
    timed("  cb.from_dlpack(x)", lambda: cb.from_dlpack(cx))
    print("-- the driver")
    empty = cp.RawKernel('extern "C" __global__ void empty() {}', "empty")
    empty((1,), (32,), ())
    libcuda = ctypes.CDLL("libcuda.so.1")
    launch = libcuda.cuLaunchKernel
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    f = empty.kernel.ptr
    timed(
        "cuLaunchKernel of an empty kernel via ctypes",
        lambda: launch(f, 1, 1, 1, 32, 1, 1, 0, None, None, None),
    )


if __name__ == "__main__":
    main()
