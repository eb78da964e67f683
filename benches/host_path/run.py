"""cubridge's host path of a CUDA `add`, a `sum` and users' kernels, timed on a machine without a GPU
against the do-nothing driver in stub_driver.c (see there how to build it): what a call costs
the calling thread in cubridge, pyo3 and Python when the driver's calls cost nothing. It
separates cubridge's own per-call work from the driver's and the GPU's, which vary by 20%
between processes on the GPU machine. Best of 7 rounds of 20000 calls, 2^10 float32 cubridge
arrays. The users' kernels compile with NVRTC (set CUBRIDGE_NVRTC_DIR where the pip wheel of
NVRTC does not sit beside Python); their modules load into the stub. With --driver-calls, each
case instead prints the driver calls it makes per call (1000 calls counted, on every thread:
the releaser's and the free queue's too).

    LD_LIBRARY_PATH=DIR python benches/host_path/run.py [--driver-calls] [case ...]
"""

import ctypes
import sys
import time

import cubridge as cb
import numpy

RAW_AXPY = r"""
extern "C" __global__ void host_path_axpy(float a, const float* x, const float* y, float* z,
                                          int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) z[i] = a * x[i] + y[i];
}
"""


def time_call(call):
    best = float("inf")
    for _ in range(7):
        for _ in range(500):
            call()
        start = time.perf_counter_ns()
        for _ in range(20000):
            call()
        best = min(best, (time.perf_counter_ns() - start) / 20000)
    return f"{best:7.0f} ns"


def driver_calls(call):
    stub = ctypes.CDLL("libcuda.so.1")
    stub.stub_count.restype = ctypes.c_char_p
    for _ in range(500):
        call()
    cb.cuda.synchronize()
    stub.stub_reset()
    for _ in range(1000):
        call()
    counts, calls = [], ctypes.c_ulong()
    for i in range(64):
        name = stub.stub_count(i, ctypes.byref(calls))
        if name is None:
            break
        if calls.value:
            counts.append(f"{name.decode()} {calls.value / 1000:g}")
    return ", ".join(counts)


def main():
    assert cb.cuda.is_available(), "set LD_LIBRARY_PATH to the stub driver's folder"
    n = 1 << 10
    x, y, z = (cb.zeros((n,), device="cuda") for _ in range(3))
    side = cb.cuda.Stream()
    a = numpy.float32(2.0)
    axpy = cb.ElementwiseKernel("T a, T x, T y", "T z", "z = a * x + y", "host_path_axpy")
    raw = cb.RawKernel(RAW_AXPY, "host_path_axpy")
    raw_args = (a, x, y, z, numpy.int32(n))
    s = cb.zeros((), device="cuda")
    sumsq = cb.ReductionKernel("T x", "T y", "x * x", "a + b", "y = a", "0", "host_path_sumsq")
    cases = {
        "add(x, y, out=z)": lambda: cb.add(x, y, out=z),
        "add(x, y)": lambda: cb.add(x, y),
        "add(x, y, out=z, stream=side)": lambda: cb.add(x, y, out=z, stream=side),
        "add(x, y, stream=side)": lambda: cb.add(x, y, stream=side),
        "add(x, 1.0)": lambda: cb.add(x, 1.0),
        "ElementwiseKernel(a, x, y, z)": lambda: axpy(a, x, y, z),
        "ElementwiseKernel(a, x, y)": lambda: axpy(a, x, y),
        "RawKernel((4,), (256,), args)": lambda: raw((4,), (256,), raw_args),
        "sum(x)": lambda: cb.sum(x),
        "sum(x, out=s)": lambda: cb.sum(x, out=s),
        "ReductionKernel(x)": lambda: sumsq(x),
    }
    args = [a for a in sys.argv[1:] if a != "--driver-calls"]
    measure = driver_calls if "--driver-calls" in sys.argv else time_call
    for name, call in cases.items():
        if args and name not in args:
            continue
        print(f"{name:32} {measure(call)}", flush=True)


if __name__ == "__main__":
    main()
