"""Shared pieces of the GPU benchmarks: the machine and library versions for the report,
CUDA-event timing that keeps host launch cost out of device timings, an L2 flush, JSON
results, and a PNG plot (matplotlib when installed, else a small built-in line plot)."""

import datetime
import json
import os
import platform
import struct
import subprocess
import zlib


def empty_caches(variable, path):
    """The environment of a child process whose kernel caches are all at `path`, which starts
    empty: the library's own (`variable` names it: CUBRIDGE_CACHE_DIR, CUPY_CACHE_DIR) and
    NVRTC's. NVRTC 12.9 and later keeps every compile in the CUDA compute cache
    (~/.nv/ComputeCache) and serves it to any later process, library caches empty or not, so a
    child left with the machine's compute cache compiles a program that any process on the
    machine compiled before in about a tenth of the time. Set BENCH_NVRTC_CACHE=shared to
    measure that case instead (the machine's compute cache, as it is)."""
    env = {variable: path}
    if os.environ.get("BENCH_NVRTC_CACHE") != "shared":
        env["CUDA_CACHE_PATH"] = os.path.join(path, "cuda-compute-cache")
    return env


def caches_label():
    """What [`empty_caches`] leaves a child, for the reports."""
    if os.environ.get("BENCH_NVRTC_CACHE") == "shared":
        return "empty library cache, the machine's NVRTC cache as it is"
    return "empty caches (the library's and NVRTC's)"


def versions():
    """Machine, GPU, driver and library versions, for the header of every result."""
    info = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
    }
    try:
        q = "--query-gpu=name,driver_version,memory.total"
        out = (
            subprocess.run(
                ["nvidia-smi", q, "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            .stdout.strip()
            .splitlines()
        )
        info["gpu"] = out[0] if out else "none"
    except (OSError, subprocess.SubprocessError):
        info["gpu"] = "none"
    for name in ["cubridge", "numpy", "torch", "cupy", "jax"]:
        try:
            module = __import__(name)
            info[name] = getattr(module, "__version__", "?")
        except ImportError:
            info[name] = "not installed"
    return info


def interleaved(fns, calls, rounds=7, warmup=200, sync=None):
    """Median wall time per call of each function in `fns` (a dict), with the rounds of all of
    them interleaved, so that the machine's drift over a run (about 30% here) falls on each
    alike rather than on whichever was measured last. Each round ends with `sync` (by default a
    CUDA device synchronize, so the GPU work the calls queued counts; host-only benchmarks pass
    a no-op)."""
    import statistics

    times = round_times(fns, calls, rounds, warmup, sync)
    return {k: statistics.median((loop + end) / calls for loop, end in v) for k, v in times.items()}


def wait_for_compiles(fns):
    """Waits for cubridge's background compiles (the tiled kernel of a transposed layout, which
    the first calls run without), then calls each of `fns` once more, so that what is timed
    next runs the kernels that a program's later calls run."""
    import cubridge

    cubridge.cuda.wait_for_compiles()
    for fn in fns.values():
        fn()


def round_times(fns, calls, rounds=7, warmup=200, sync=None):
    """[`interleaved`]'s rounds, each kept: per function, a list of (seconds in the loop of
    `calls` calls, seconds in the `sync` that ends the round)."""
    import time

    if sync is None:
        import torch

        sync = torch.cuda.synchronize
    for fn in fns.values():
        for _ in range(min(calls, warmup)):
            fn()
    wait_for_compiles(fns)
    sync()
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            sync()
            times[k].append((t1 - t0, time.perf_counter() - t1))
    return times


def calls_for(n):
    """Calls per round for `n` elements: about 2^25 elements' worth, between 20 and 5000."""
    return max(20, min(5000, (1 << 28) // max(n, 1) // 8))


def header(info):
    return "\n".join(f"{k}: {v}" for k, v in info.items())


def start(parser):
    """Parses a benchmark's arguments and prints the machine and library versions it runs
    with; returns (args, versions)."""
    args = parser.parse_args()
    info = versions()
    print(header(info))
    return args, info


class GpuTimer:
    """Times one call on the current torch stream with CUDA events. Before the start event the
    stream is kept busy by a spin kernel, so the host queues the call while the GPU is still
    busy and the event interval holds device time only (not the Python/launch cost)."""

    def __init__(self, torch, flush_bytes=256 << 20):
        self.torch = torch
        self.flush = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda")

    def time(self, fn, repeat, flush=True, spin_cycles=200_000):
        torch = self.torch
        wait_for_compiles({"fn": fn})
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
        for s, e in zip(starts, ends, strict=True):
            if flush:
                self.flush.zero_()  # evicts the operands from L2
            torch.cuda._sleep(spin_cycles)
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        times = sorted(s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True))
        return times[len(times) // 2]


def save_json(path, data):
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def plot(path, title, xlabel, ylabel, series, logx=True):
    """Writes a line plot of `series` ({label: [(x, y), ...]}) to the PNG `path`."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _plot_builtin(path, series, logx)
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, points in series.items():
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker="o", markersize=3, label=label)
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


_COLORS = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
]


def _plot_builtin(path, series, logx, width=800, height=500):
    """A minimal line plot (axes box, lines, a colour key down the left edge) for machines
    without matplotlib; the labels and numbers are in the printed table and the JSON."""
    import math

    pad = 40
    img = [[(255, 255, 255)] * width for _ in range(height)]
    pts = [(math.log2(x) if logx else x, y) for s in series.values() for x, y in s]
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y1 = max(p[1] for p in pts) * 1.05 or 1.0

    def to_px(x, y):
        x = math.log2(x) if logx else x
        px = pad + (x - x0) / ((x1 - x0) or 1) * (width - 2 * pad)
        py = height - pad - y / y1 * (height - 2 * pad)
        return int(px), int(py)

    def line(p, q, color):
        steps = max(abs(q[0] - p[0]), abs(q[1] - p[1]), 1)
        for i in range(steps + 1):
            x = p[0] + (q[0] - p[0]) * i // steps
            y = p[1] + (q[1] - p[1]) * i // steps
            for dx in (0, 1):
                if 0 <= x + dx < width and 0 <= y < height:
                    img[y][x + dx] = color

    black = (0, 0, 0)
    line((pad, pad), (pad, height - pad), black)
    line((pad, height - pad), (width - pad, height - pad), black)
    for k, points in enumerate(series.values()):
        color = _COLORS[k % len(_COLORS)]
        line((4, pad + 12 * k), (pad - 8, pad + 12 * k), color)
        pix = [to_px(x, y) for x, y in points]
        for p, q in zip(pix, pix[1:], strict=False):
            line(p, q, color)
    raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in img)

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    png = b"\x89PNG\r\n\x1a\n" + chunk(
        b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    )
    png += chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(png)
