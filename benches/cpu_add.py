"""CPU add benchmark: cubridge.add(a, b, out=c) against numpy.add(a, b, out=c) on the same
preallocated float32 arrays, in one run. Prints the median time of each and the ratio.

    python benches/cpu_add.py [--log2n 24] [--repeat 30]
"""

import argparse
import os
import platform
import statistics
import time

import cubridge as cb
import numpy as np


def median_seconds(fn, repeat):
    fn()  # warm up (page faults, thread start-up)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log2n", type=int, default=24)
    p.add_argument("--repeat", type=int, default=30)
    args = p.parse_args()
    n = 1 << args.log2n
    rng = np.random.default_rng(0)
    a = rng.standard_normal(n, dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    c = np.empty_like(a)

    t_np = median_seconds(lambda: np.add(a, b, out=c), args.repeat)
    t_cb = median_seconds(lambda: cb.add(a, b, out=c), args.repeat)
    np.testing.assert_array_equal(c, a + b)

    gbs = lambda t: 3 * a.nbytes / t / 1e9  # noqa: E731 - two reads and a write
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; numpy {np.__version__}")
    print(f"elements: 2^{args.log2n} float32, median of {args.repeat}")
    print(f"numpy.add(out=)    {t_np * 1e3:8.3f} ms  {gbs(t_np):6.1f} GB/s")
    print(f"cubridge.add(out=) {t_cb * 1e3:8.3f} ms  {gbs(t_cb):6.1f} GB/s")
    print(f"speed ratio (numpy time / cubridge time): {t_np / t_cb:.2f}x")


if __name__ == "__main__":
    main()
