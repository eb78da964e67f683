"""Per-call host cost of cubridge beside its peers, in one run (wall time, median of 7 rounds,
the rounds of the functions compared interleaved):

1. small-call overhead: cubridge.add(a, b, out=c) against torch.add(a, b, out=c) (and
   cupy.add on the same memory) on 1024-element float32 CUDA tensors, 20 000 calls a round;
   then the same with a Python scalar for b (cubridge passes it to the kernel by value);
2. exchange, each against its peer:
   torch.from_dlpack(cubridge array)   vs  torch.from_dlpack(cupy array)
   cupy.asarray(cubridge array) (CAI)  vs  cupy.asarray(torch tensor) (CAI)
   cubridge.from_dlpack(torch tensor)  vs  torch.utils.dlpack.from_dlpack(t.__dlpack__())

    python benches/overhead.py [--calls 20000] [--out DIR]
"""

import argparse
import ctypes
import os

import cubridge as cb
import cupy as cp
import torch
import torch.utils.dlpack
from _common import interleaved, plot, save_json, start


def per_call(fn, calls):
    return interleaved({"fn": fn}, calls)["fn"]


# An empty kernel, for the driver's own launch cost.
NOOP_PTX = b""".version 7.0
.target sm_50
.address_size 64
.visible .entry noop() { ret; }
"""


def attribution(a, b, c, calls):
    """The pieces of a cubridge.add call, timed apart: the same add on cubridge views of the
    tensors (no import), and single CUDA driver calls made through ctypes (each includes the
    ctypes call itself, measured alone on the first line)."""
    parts = {}
    va, vb, vc = cb.from_dlpack(a), cb.from_dlpack(b), cb.from_dlpack(c)
    parts["cubridge.add on cubridge views (no import)"] = per_call(
        lambda: cb.add(va, vb, out=vc), calls
    )
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    parts["ctypes: cuCtxGetCurrent (the ctypes cost itself)"] = per_call(
        lambda: cuda.cuCtxGetCurrent(ctypes.byref(ctx)), calls
    )
    module, fn, ev = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    assert cuda.cuModuleLoadData(ctypes.byref(module), NOOP_PTX) == 0
    assert cuda.cuModuleGetFunction(ctypes.byref(fn), module, b"noop") == 0
    assert cuda.cuEventCreate(ctypes.byref(ev), 2) == 0  # CU_EVENT_DISABLE_TIMING
    null = ctypes.c_void_p()
    legacy = ctypes.c_void_p(1)  # CU_STREAM_LEGACY
    parts["ctypes: cuLaunchKernel, empty kernel, stream CU_STREAM_LEGACY"] = per_call(
        lambda: cuda.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, legacy, null, null), calls
    )
    parts["ctypes: cuLaunchKernel, empty kernel, stream NULL"] = per_call(
        lambda: cuda.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, null, null, null), calls
    )
    parts["ctypes: cuEventRecord"] = per_call(lambda: cuda.cuEventRecord(ev, legacy), calls)
    parts["ctypes: cuEventQuery"] = per_call(lambda: cuda.cuEventQuery(ev), calls)
    side = torch.cuda.Stream()
    parts["ctypes: cuStreamWaitEvent"] = per_call(
        lambda: cuda.cuStreamWaitEvent(ctypes.c_void_p(side.cuda_stream), ev, 0), calls
    )
    parts["cubridge.from_dlpack(torch tensor)"] = per_call(lambda: cb.from_dlpack(a), calls)
    return parts


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20_000)
    p.add_argument("--out", default=".")
    args, info = start(p)
    n = args.calls

    a = torch.randn(1024, device="cuda")
    b = torch.randn(1024, device="cuda")
    c = torch.empty(1024, device="cuda")
    ca, cb_, cc = cp.from_dlpack(a), cp.from_dlpack(b), cp.from_dlpack(c)
    cb.add(a, b, out=c)
    torch.cuda.synchronize()
    assert torch.equal(c, a + b)
    add = interleaved(
        {
            "torch.add(a, b, out=c)": lambda: torch.add(a, b, out=c),
            "cupy.add(a, b, out=c)": lambda: cp.add(ca, cb_, out=cc),
            "cubridge.add(a, b, out=c)": lambda: cb.add(a, b, out=c),
        },
        n,
    )
    print(f"\nsmall-call overhead, 1024 float32 elements, {n} calls a round")
    for k, v in add.items():
        print(f"  {k:28} {v * 1e6:7.2f} us")
    t_torch = add["torch.add(a, b, out=c)"]
    print(
        f"  cubridge / torch time: {add['cubridge.add(a, b, out=c)'] / t_torch:.2f}x "
        "(goal <= 1.0, target 0.5)"
    )

    scalar = interleaved(
        {
            "torch.add(a, 1.5, out=c)": lambda: torch.add(a, 1.5, out=c),
            "cubridge.add(a, 1.5, out=c)": lambda: cb.add(a, 1.5, out=c),
        },
        n,
    )
    torch.cuda.synchronize()
    assert torch.equal(c, a + 1.5)
    print("\nwith a Python scalar operand")
    for k, v in scalar.items():
        print(f"  {k:28} {v * 1e6:7.2f} us")
    ratio = scalar["cubridge.add(a, 1.5, out=c)"] / scalar["torch.add(a, 1.5, out=c)"]
    print(f"  cubridge / torch time: {ratio:.2f}x")

    parts = attribution(a, b, c, n)
    print("\nwhere a call's time goes (per call)")
    for k, v in parts.items():
        print(f"  {k:58} {v * 1e6:7.2f} us")

    x = cb.arange(1024, device="cuda")
    y = cp.arange(1024, dtype=cp.float32)
    t = torch.arange(1024, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    assert torch.from_dlpack(x).data_ptr() == x.__cuda_array_interface__["data"][0]
    assert cp.asarray(x).data.ptr == x.__cuda_array_interface__["data"][0]
    assert cb.from_dlpack(t).__cuda_array_interface__["data"][0] == t.data_ptr()
    pairs = [
        (
            "torch.from_dlpack(cubridge)",
            lambda: torch.from_dlpack(x),
            "torch.from_dlpack(cupy)",
            lambda: torch.from_dlpack(y),
        ),
        (
            "cupy.asarray(cubridge)",
            lambda: cp.asarray(x),
            "cupy.asarray(torch)",
            lambda: cp.asarray(t),
        ),
        (
            "cubridge.from_dlpack(torch)",
            lambda: cb.from_dlpack(t),
            "torch.utils.dlpack.from_dlpack(t.__dlpack__())",
            lambda: torch.utils.dlpack.from_dlpack(t.__dlpack__()),
        ),
    ]
    exchange = []
    print(f"\nexchange, per call ({n} calls a round)")
    for ours, f_ours, peer, f_peer in pairs:
        timing = interleaved({"ours": f_ours, "peer": f_peer}, n)
        t_ours, t_peer = timing["ours"], timing["peer"]
        exchange.append(
            {
                "ours": ours,
                "peer": peer,
                "ours_s": t_ours,
                "peer_s": t_peer,
                "ratio": t_ours / t_peer,
            }
        )
        print(
            f"  {ours:30} {t_ours * 1e6:7.2f} us   {peer:48} {t_peer * 1e6:7.2f} us   "
            f"ratio {t_ours / t_peer:.2f}x (goal <= 1.0)"
        )
    os.makedirs(args.out, exist_ok=True)
    save_json(
        os.path.join(args.out, "overhead.json"),
        {"info": info, "add": add, "scalar": scalar, "exchange": exchange, "attribution": parts},
    )
    series = {k: [(1, v * 1e6), (2, v * 1e6)] for k, v in add.items()}
    plot(
        os.path.join(args.out, "overhead.png"),
        "per-call time, 1024 elements",
        "",
        "us",
        series,
        logx=False,
    )


if __name__ == "__main__":
    main()
