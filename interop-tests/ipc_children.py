"""What the processes of test_ipc.py run: a reader that serves jobs, and small jobs. Kept
apart from the tests so that a spawned child imports only cubridge and numpy."""

import gc
import os

import cubridge as cb
import numpy as np


def echo(a):
    return a, np.from_dlpack(a).sum()


def read_served(source):
    from cubridge._pickle import _PoolFds

    fd = _PoolFds.fetch(source)
    try:
        return os.read(fd, 5)
    finally:
        os.close(fd)


_held = {}


def serve(requests, replies):
    """The reader: runs (function, args) jobs until None, replying with each result. What a
    job received is let go of before the reply, unless the job keeps it."""
    cb.zeros(1, device="cuda")  # CUDA set up before the first array arrives
    replies.put("ready")
    while (job := requests.get()) is not None:
        reply = _run(*job)
        del job
        replies.put(reply)


def _run(fn, args):
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - reported to the test
        return e


def settle():
    """Lets go of what earlier jobs received (the releases wait for the device)."""
    gc.collect()
    cb.cuda.empty_cache()
    return True


def host_copy(a):
    return np.from_dlpack(a.to_device("cpu"))


def double_in_place(a):
    cb.add(a, a, out=a)
    cb.cuda.synchronize()
    return True


def hold(key, a):
    _held[key] = a
    return a.data_ptr


def let_go(key):
    del _held[key]
    return settle()


def hold_and_die(a):
    _held["doomed"] = a
    host_copy(a)
    os._exit(3)
