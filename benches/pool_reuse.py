"""Why a side-stream allocating add pays for the pool's reuse check: 20,000 allocating adds on a
torch side stream, results dropped, with the device pool's reuse of blocks freed on another
stream (CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC) on and off, then alternating two side streams.
Prints the time per call and the pool's reserved memory: with the reuse off the calls are faster
and the pool grows by every result, since cubridge frees a side stream's results on a stream of
its own. The attribute is set back to the driver's default (on) at the end.

    python benches/pool_reuse.py
"""

import ctypes
import time

import cubridge as cb
import torch

LIBCUDA = ctypes.CDLL("libcuda.so.1")


def device_pool():
    pool = ctypes.c_void_p()
    get = LIBCUDA.cuDeviceGetMemPool
    get.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    assert get(ctypes.byref(pool), torch.cuda.current_device()) == 0
    return pool


def set_opportunistic_reuse(pool, on):
    set_attribute = LIBCUDA.cuMemPoolSetAttribute
    set_attribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    value = ctypes.c_int(int(on))
    assert set_attribute(pool, 2, ctypes.byref(value)) == 0


def timed_calls(streams, x, y, n=20000):
    start = time.perf_counter()
    for i in range(n):
        with torch.cuda.stream(streams[i % len(streams)]):
            cb.add(x, y)
    per_call = (time.perf_counter() - start) / n * 1e6
    torch.cuda.synchronize()
    return per_call, cb.cuda.memory_stats()["reserved_bytes"] >> 20


def main():
    torch.zeros(1, device="cuda")
    pool = device_pool()
    x, y = torch.ones(1 << 16, device="cuda"), torch.ones(1 << 16, device="cuda")
    one, two = torch.cuda.Stream(), torch.cuda.Stream()
    print(torch.cuda.get_device_name())
    try:
        for on in (True, False, True, False):
            set_opportunistic_reuse(pool, on)
            torch.cuda.synchronize()
            cb.cuda.empty_cache()
            per_call, reserved = timed_calls([one], x, y)
            print(
                f"reuse {'on ' if on else 'off'}: {per_call:6.2f} us/call, reserved {reserved} MiB"
            )
            per_call, reserved = timed_calls([one, two], x, y)
            print(f"  two streams in turn: {per_call:6.2f} us/call, reserved {reserved} MiB")
    finally:
        set_opportunistic_reuse(pool, True)


if __name__ == "__main__":
    main()
