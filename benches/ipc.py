"""Sending a CUDA array to another process: the time from the sender's `send` on a spawn
`Pipe` to the reader's array being ready (unpickled: pool block mapped, event opened and
waited for on the device), for cubridge (memory from `set_shareable(True)`) beside torch's
sharing of a CUDA tensor through `torch.multiprocessing`, the same way. Both clocks are
`time.perf_counter_ns` (CLOCK_MONOTONIC, one clock for every process of the machine).

Two cases, each after a first send that sets up what is set up once (the pool's file
descriptor, the counters, torch's CUDA IPC state): the same array again (the reader lets go of
it each time), and a fresh array each time (a new pool block to map; torch: a new tensor from
its caching allocator). Prints the median and 90th percentile in microseconds.

    python benches/ipc.py [--sends 300] [--mib 4]
"""

import argparse
import gc
import statistics
import time

import cubridge as cb
import torch
import torch.multiprocessing as tmp


def reader(conn):
    """Receives until None; replies with the time each array was ready."""
    import cubridge  # noqa: F401 - registers the reducers before the first array arrives

    torch.zeros(1, device="cuda")
    cubridge.zeros(1, device="cuda")
    conn.send("ready")
    while True:
        got = conn.recv()
        ready = time.perf_counter_ns()
        if got is None:
            return
        del got
        gc.collect()
        conn.send(ready)


def latencies(conn, make, sends):
    times = []
    for _ in range(sends + 1):
        x = make()
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        conn.send(x)
        times.append((conn.recv() - t0) / 1e3)
        del x
    return times[1:]  # after the first


def report(name, times):
    times = sorted(times)
    p90 = times[int(0.9 * (len(times) - 1))]
    print(f"{name:<34} median {statistics.median(times):8.1f} us   p90 {p90:8.1f} us")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sends", type=int, default=300)
    parser.add_argument("--mib", type=int, default=4)
    args = parser.parse_args()
    n = args.mib << 18  # float32 elements
    cb.cuda.set_shareable(True)
    ctx = tmp.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=reader, args=(there,))
    child.start()
    assert here.recv() == "ready"
    same_cb = cb.zeros(n, dtype="float32", device="cuda")
    same_torch = torch.zeros(n, device="cuda")
    cases = {
        "cubridge, same array": lambda: same_cb,
        "torch, same tensor": lambda: same_torch,
        "cubridge, fresh array": lambda: cb.zeros(n, dtype="float32", device="cuda"),
        "torch, fresh tensor": lambda: torch.zeros(n, device="cuda"),
    }
    gpu = torch.cuda.get_device_name()
    print(f"{args.mib} MiB float32, {args.sends} sends after the first, {gpu}")
    for name, make in cases.items():
        report(name, latencies(here, make, args.sends))
    here.send(None)
    child.join()


if __name__ == "__main__":
    main()
