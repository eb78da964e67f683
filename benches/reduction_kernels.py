"""Where a reduction's device time goes, kernel by kernel: cubridge.sum's kernels (the pass and,
where outputs are split into chunks, the fold of their partial results) beside torch.sum's, on
the very same tensors, from torch.profiler's CUDA activity (CUPTI), with L2 flushed before each
call. Cases: float32 and bfloat16 summed whole, over rows and over columns from 2^20 to 2^28
elements, the short rows (10^6, 2) and (10^6, 4), and a small sum of 2^10 elements. One line per
case: each kernel's name, its mean device time and how often it ran.

    python benches/reduction_kernels.py
"""

import cubridge as cb
import torch
from torch.profiler import ProfilerActivity, profile

FLUSH = None


def cases():
    for dtype in (torch.float32, torch.bfloat16):
        for k in (20, 22, 24, 26, 28):
            n, rows = 1 << k, 1 << (k // 2)
            x = torch.randn(n, device="cuda").to(dtype)
            name = str(dtype).removeprefix("torch.")
            yield f"{name} all 2^{k}", x, None
            yield f"{name} rows 2^{k}", x.view(n // rows, rows), -1
            yield f"{name} columns 2^{k}", x.view(rows, n // rows), 0
    for width in (2, 4):
        yield f"(10^6, {width}) rows", torch.randn(10**6, width, device="cuda"), -1
    yield "small 2^10", torch.randn(1024, device="cuda"), None


def kernel_times(x, axis, calls=10):
    dim = tuple(range(x.ndim)) if axis is None else axis
    ours, theirs = (lambda: cb.sum(x, axis=axis)), (lambda: torch.sum(x, dim=dim))
    for f in (ours, theirs, ours, theirs):
        f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            FLUSH.zero_()
            theirs()
            FLUSH.zero_()
            ours()
        torch.cuda.synchronize()
    for e in prof.key_averages():
        if e.device_type.name != "CUDA" or "fill" in e.key.lower() or "memset" in e.key.lower():
            continue
        name = e.key
        if "at::" in name:
            name = "torch:" + name.split("<")[0].split("(")[0].rsplit("::", 1)[-1]
        yield f"{name[:40]}={e.device_time_total / max(1, e.count):.2f}us/x{e.count}"


def main():
    global FLUSH
    FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print(f"{torch.cuda.get_device_name()}, cubridge {cb.__version__}, torch {torch.__version__}")
    for label, x, axis in cases():
        print(f"{label:22} " + "  ".join(kernel_times(x, axis)), flush=True)


if __name__ == "__main__":
    main()
