"""CPU add benchmark (`make bench`): cubridge.add(a, b, out=c) against numpy.add(a, b, out=c) on
the same preallocated arrays, for float32, float64, int32 and float16 at 2^10 to 2^26 elements, and
cubridge's call on its own views of those arrays (`cubridge.asarray` of each, made once), which
imports nothing: the difference is what importing three numpy arrays costs a call.
Each size runs the calls in interleaved rounds (the median of 7 rounds of many calls each), so
that load from elsewhere on the machine falls on both alike; the ratio is numpy's time over
cubridge's (above 1: cubridge is faster).

    python benches/cpu_add.py [--dtypes float32,float64,int32,float16] [--max-log2n 26]
"""

import argparse
import os
import platform

import cubridge as cb
import numpy as np
from _common import interleaved


def calls_on(a, b, c):
    own = [cb.asarray(x) for x in (a, b, c)]
    return {
        "numpy": lambda: np.add(a, b, out=c),
        "cubridge": lambda: cb.add(a, b, out=c),
        "own": lambda: cb.add(own[0], own[1], out=own[2]),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", default="float32,float64,int32,float16")
    p.add_argument("--max-log2n", type=int, default=26)
    args = p.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; numpy {np.__version__}")
    print("add(a, b, out=c), interleaved medians; ratio = numpy time / cubridge time")
    print("own: cubridge's call on cubridge views of the same arrays (no import)\n")
    print(
        f"{'dtype':8} {'n':>5} {'numpy':>11} {'cubridge':>11} {'ratio':>7} {'own':>11} {'ratio':>7}"
    )
    for dtype in args.dtypes.split(","):
        for k in range(10, args.max_log2n + 1, 2):
            n = 1 << k
            a = (np.arange(n) % 101).astype(dtype)
            b = (np.arange(n) % 7).astype(dtype)
            c = np.empty_like(a)
            calls = max(3, min(20000, (1 << 27) // n))
            t = interleaved(calls_on(a, b, c), calls, warmup=50, sync=lambda: None)
            np.testing.assert_array_equal(c, a + b)
            print(
                f"{dtype:8} 2^{k:<3} {t['numpy'] * 1e6:9.2f}us {t['cubridge'] * 1e6:9.2f}us "
                f"{t['numpy'] / t['cubridge']:6.2f}x {t['own'] * 1e6:9.2f}us "
                f"{t['numpy'] / t['own']:6.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
