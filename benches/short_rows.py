"""Where the time of a short-row sum goes: `(10^6, w).sum(-1)` for w = 2 and 4 (float32), the case
whose goal is at most 1.2x one elementwise pass over the same data (reductions.py). For the pass
(torch.mul by 1 into a preallocated output), cubridge.sum allocating and with `out=`, torch.sum,
and an empty launch: the time between CUDA events around the call as reductions.py measures it
(GpuTimer: L2 flushed, the call queued behind a spin kernel, median of 50) and the device time
of each kernel it ran (torch.profiler, mean of 10 calls), so that the kernels' share of a ratio
and the launch's are apart.

    python benches/short_rows.py
"""

import cubridge as cb
import torch
from _common import GpuTimer
from torch.profiler import ProfilerActivity, profile


def kernel_times(fn, flush, calls=10):
    """Device time per call of each kernel `fn` runs (the L2 flush's own kernel left out)."""
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(calls):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    times = {}
    for e in p.events():
        name = e.name.lower()
        if e.device_type.name == "CUDA" and "fill" not in name and "zero" not in name:
            times[e.name[:40]] = times.get(e.name[:40], 0.0) + e.device_time / calls
    return times


def main():
    timer = GpuTimer(torch)
    print(torch.cuda.get_device_name(), "cubridge", cb.__version__, "torch", torch.__version__)
    for w in (2, 4):
        x = torch.randn(10**6, w, device="cuda")
        y, o = torch.empty_like(x), torch.empty(10**6, device="cuda")
        fns = {
            "pass": lambda x=x, y=y: torch.mul(x, 1, out=y),
            "cb.sum": lambda x=x: cb.sum(x, axis=-1),
            "cb.sum(out=)": lambda x=x, o=o: cb.sum(x, axis=-1, out=o),
            "torch.sum": lambda x=x: torch.sum(x, -1),
            "empty launch": lambda: torch.cuda._sleep(0),
        }
        for name, fn in fns.items():
            event_us = timer.time(fn, 50) * 1e6
            kernels = ", ".join(f"{k}={t:.2f}" for k, t in kernel_times(fn, timer.flush).items())
            print(f"(10^6, {w}) {name:14} event {event_us:6.2f} us | kernels (us) {kernels}")


if __name__ == "__main__":
    main()
