"""Sending a CUDA array to another process: for cubridge (memory from `set_shareable(True)`)
beside torch's sharing of a CUDA tensor through `torch.multiprocessing`, the same way (a spawn
`Pipe`, whose `send` is `ForkingPickler.dumps` then `send_bytes`, and `recv` the reverse), the
parts of one send: the export (the sender's pickling), the transport (from the bytes' send to
their arrival), the open (the reader's unpickling: the block mapped, the event opened and
waited for on the device), and the total from the sender's call to the reader's array. Both
clocks are `time.perf_counter_ns` (CLOCK_MONOTONIC, one clock for every process of the
machine).

Cases, each after a first send that sets up what is set up once (the pool's file descriptor,
the counters, torch's CUDA IPC state): the same array again (the reader lets go of it each
time), and a fresh array each time (a new pool block to map; torch: a new tensor from its
caching allocator), each sent once its writes are complete and once while a write of it is
still queued on the device (a kernel that spins about 0.2 ms, then writes: the write then
travels as an interprocess event). Prints the medians (and the total's 90th percentile) in microseconds.

    python benches/ipc.py [--sends 300] [--mib 4]
"""

import argparse
import statistics
import time
from multiprocessing.reduction import ForkingPickler

import cubridge as cb
import numpy as np
import torch
import torch.multiprocessing as tmp


def reader(conn):
    """Receives until None; replies with when the bytes arrived and when the array was ready."""
    import cubridge  # noqa: F401 - registers the reducers before the first array arrives

    torch.zeros(1, device="cuda")
    cubridge.zeros(1, device="cuda")
    conn.send("ready")
    while True:
        raw = conn.recv_bytes()
        arrived = time.perf_counter_ns()
        got = ForkingPickler.loads(raw)
        ready = time.perf_counter_ns()
        if got is None:
            return
        del got  # let go (no cycles hold it: no collection needed, which takes ~80 ms with torch)
        conn.send((arrived, ready))


SPIN_THEN_WRITE = r"""extern "C" __global__ void spin_then_write(float* x, long long n, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        x[i] = 1.0f;
    }
}"""


def queue_write(x):
    """Queues a write of `x` behind about 0.2 ms of spinning on the device."""
    cycles = 400_000
    if isinstance(x, torch.Tensor):
        torch.cuda._sleep(cycles)
        x.fill_(1.0)
    else:
        kernel = cb.RawKernel(SPIN_THEN_WRITE, "spin_then_write")
        kernel((8,), (256,), (x, np.int64(x.size), np.int64(cycles)))


def latencies(conn, make, sends, queued, pause):
    times = []
    for _ in range(sends + 1):
        x = make()
        torch.cuda.synchronize()
        time.sleep(pause)
        if queued:
            queue_write(x)
        t0 = time.perf_counter_ns()
        raw = ForkingPickler.dumps(x)
        t1 = time.perf_counter_ns()
        conn.send_bytes(raw)
        arrived, ready = conn.recv()
        times.append([(t1 - t0) / 1e3, (arrived - t1) / 1e3, (ready - arrived) / 1e3])
        times[-1].append((ready - t0) / 1e3)
        torch.cuda.synchronize()
        del x
    return times[1:]  # after the first


def report(name, times):
    export, transport, open_, total = (sorted(column) for column in zip(*times, strict=True))
    p90 = total[int(0.9 * (len(total) - 1))]
    m = statistics.median
    print(
        f"{name:<24} export {m(export):7.1f}  transport {m(transport):7.1f}  "
        f"open {m(open_):7.1f}  export+open {m(export) + m(open_):7.1f}  "
        f"total {m(total):7.1f} (p90 {p90:7.1f}) us"
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sends", type=int, default=300)
    parser.add_argument("--mib", type=int, default=4)
    parser.add_argument(
        "--pause-ms",
        type=float,
        default=0.0,
        help="idle time before each send (a host that idles runs the next send's code cold)",
    )
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
    print(
        f"{args.mib} MiB float32, {args.sends} sends after the first, "
        f"{args.pause_ms} ms idle before each, {gpu}"
    )
    for queued in (False, True):
        print("a write still queued:" if queued else "writes complete:")
        for name, make in cases.items():
            report(name, latencies(here, make, args.sends, queued, args.pause_ms / 1e3))
    here.send(None)
    child.join()


if __name__ == "__main__":
    main()
