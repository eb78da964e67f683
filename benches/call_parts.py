"""What a small call on torch tensors or CuPy arrays is made of, measured from Python in one
process: the peer's own call, cubridge's call on its own arrays (no import), the same call on
the producer's arrays, and the producer's calls that cubridge makes per operand (torch's
exchange-table export through ctypes, `is_neg()`, `requires_grad`; CuPy's current stream and
`__dlpack__`), with the driver's launch of an empty kernel through ctypes for scale, and the
driver calls that a call on a side stream adds (capture query, event record and wait, an
allocation freed on another stream after an event), with the device pool's reuse of completed
frees switched off for comparison (the pool then stops reusing the results' blocks and grows:
see pool_reuse.py). Mean wall
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


LIBCUDA = ctypes.CDLL("libcuda.so.1")


def driver(name, *argtypes):
    function = getattr(LIBCUDA, name)
    function.argtypes, function.restype = list(argtypes), ctypes.c_int
    return function


def device_pool():
    pool = ctypes.c_void_p()
    get = driver("cuDeviceGetMemPool", ctypes.POINTER(ctypes.c_void_p), ctypes.c_int)
    assert get(ctypes.byref(pool), torch.cuda.current_device()) == 0
    return pool


class pool_reuse_of_completed_frees:
    """Switches the device pool's CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC (the pool cubridge
    allocates from) for a block of rows, and back to the driver's default (on) after."""

    def __init__(self, on):
        self.on = on
        self.set = driver("cuMemPoolSetAttribute", ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)

    def _apply(self, on):
        value = ctypes.c_int(int(on))
        assert self.set(device_pool(), 2, ctypes.byref(value)) == 0

    def __enter__(self):
        self._apply(self.on)

    def __exit__(self, *_):
        self._apply(True)


def driver_calls(side):
    """The driver calls a side-stream call adds, each through ctypes (less the trivial ctypes
    call timed above)."""
    stream = ctypes.c_void_p(side.cuda_stream)
    other = ctypes.c_void_p(torch.cuda.Stream().cuda_stream)
    event = ctypes.c_void_p()
    driver("cuEventCreate", ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint)(ctypes.byref(event), 2)
    capturing = driver("cuStreamIsCapturing", ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))
    record = driver("cuEventRecord", ctypes.c_void_p, ctypes.c_void_p)
    wait = driver("cuStreamWaitEvent", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)
    query = driver("cuEventQuery", ctypes.c_void_p)
    alloc = driver(
        "cuMemAllocFromPoolAsync",
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_size_t,
        ctypes.c_void_p,
        ctypes.c_void_p,
    )
    free = driver("cuMemFreeAsync", ctypes.c_void_p, ctypes.c_void_p)
    pool, ptr, status = device_pool(), ctypes.c_void_p(), ctypes.c_int()
    timed("  cuStreamIsCapturing(side)", lambda: capturing(stream, ctypes.byref(status)))
    timed("  cuEventRecord(e, side)", lambda: record(event, stream))
    torch.cuda.synchronize()
    timed("  cuStreamWaitEvent(side, e), e done", lambda: wait(stream, event, 0))
    timed("  cuEventQuery(e), e done", lambda: query(event))

    def same_stream():
        alloc(ctypes.byref(ptr), N * 4, pool, stream)
        free(ptr, stream)

    def across():
        alloc(ctypes.byref(ptr), N * 4, pool, stream)
        record(event, stream)
        wait(other, event, 0)
        free(ptr, other)

    timed("  alloc + free on side (2 calls)", same_stream)
    timed("  alloc on side, record, wait, free on another stream (4 calls)", across)
    with pool_reuse_of_completed_frees(False):
        timed("  the same, the pool's opportunistic reuse off", across)


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
    with pool_reuse_of_completed_frees(False):
        timed(
            "cb.add(a, b, stream=side), opportunistic reuse off (the pool grows)",
            lambda: cb.add(bx, by, stream=side),
        )
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
    driver_calls(side)
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
