"""Copies between two GPUs: cubridge's `to_device` against torch's `x.to("cuda:1")`, in one run,
over 2^20 ... 2^28 float32 elements, both directions. cubridge copies a torch tensor it imported
(torch's memory into cubridge's pool) and an array of its own (pool to pool).

Wall time of several copies between two synchronizes of both devices (the copies are queued
back to back; at these sizes launch cost is a small part), median of interleaved rounds.
GB/s counts the bytes copied once. Every cubridge copy is checked against torch's first.

    python benches/peer_copy.py [--min-log2n 20] [--max-log2n 28] [--out DIR]
"""

import argparse
import os
import statistics
import time

import cubridge as cb
import torch
from _common import plot, save_json, start


def reps(n):
    return 50 if n <= 1 << 22 else 10 if n <= 1 << 26 else 4


def seconds_per_copy(copy, n, rounds=7):
    """Median over `rounds` of the wall time per copy of `reps(n)` copies queued back to back."""

    def sync():
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)

    copy()
    sync()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps(n)):
            copy()
        sync()
        times.append((time.perf_counter() - t0) / reps(n))
    return statistics.median(times)


def candidates(x, dst):
    """The copies to time, by name, each checked against torch's."""
    own = cb.asarray(x, copy=True)
    fns = {
        "torch": lambda: x.to(f"cuda:{dst}"),
        "cubridge (torch source)": lambda: cb.asarray(x).to_device(dst),
        "cubridge (own source)": lambda: own.to_device(dst),
    }
    expected = x.to(f"cuda:{dst}")
    for name, fn in fns.items():
        got = fn()
        got = got if isinstance(got, torch.Tensor) else torch.from_dlpack(got)
        assert got.device == expected.device and torch.equal(got, expected), name
    return fns


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min-log2n", type=int, default=20)
    p.add_argument("--max-log2n", type=int, default=28)
    p.add_argument("--step", type=int, default=2)
    p.add_argument("--out", default=".")
    args, info = start(p)
    assert cb.cuda.device_count() >= 2 and torch.cuda.device_count() >= 2, "needs two GPUs"
    info["peer access"] = [
        torch.cuda.can_device_access_peer(0, 1),
        torch.cuda.can_device_access_peer(1, 0),
    ]
    rows, series = [], {}
    print(
        f"\n{'copy':7} {'n':>6} {'torch GB/s':>10} {'cb (torch src)':>14} {'cb (own)':>9} {'ratio':>6}"
    )
    for src, dst in [(0, 1), (1, 0)]:
        for k in range(args.min_log2n, args.max_log2n + 1, args.step):
            n = 1 << k
            x = torch.arange(n, dtype=torch.float32, device=f"cuda:{src}")
            fns = candidates(x, dst)
            gbs = {name: 4 * n / seconds_per_copy(fn, n) / 1e9 for name, fn in fns.items()}
            worst = min(gbs["cubridge (torch source)"], gbs["cubridge (own source)"])
            ratio = worst / gbs["torch"]
            print(
                f"{src}->{dst}   2^{k:<4} {gbs['torch']:10.1f} {gbs['cubridge (torch source)']:14.1f} "
                f"{gbs['cubridge (own source)']:9.1f} {ratio:6.2f}"
            )
            rows.append({"src": src, "dst": dst, "n": n, "gb_per_s": gbs, "ratio": ratio})
            for name, v in gbs.items():
                series.setdefault(f"{name} {src}->{dst}", []).append((n, v))
            del x, fns
    os.makedirs(args.out, exist_ok=True)
    save_json(os.path.join(args.out, "peer_copy.json"), {"versions": info, "rows": rows})
    plot(os.path.join(args.out, "peer_copy.png"), "copies between GPUs", "elements", "GB/s", series)


if __name__ == "__main__":
    main()
