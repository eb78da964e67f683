"""The driver calls of one CUDA IPC send and receive, timed alone with cuda.bindings, as the floor
under cubridge's and torch's sharing of device arrays between processes (benches/ipc.py): the
sender exports a 4 MiB block of an IPC-capable pool (cuMemPoolExportPointer) and records an
interprocess event; the reader maps the block (cuMemPoolImportPointer), opens the event, waits
for it on a stream and records its own. Medians of 40 sends after the first, in microseconds.
With --fresh the sender frees the block after each send and allocates a new one (the pool puts it
at the same address), and the script counts whether the export data at a reused address stayed
the same; with --peer the pool's memory is accessible to device 1, as cubridge's pools are on a
host of several GPUs.

    python benches/ipc_floor.py [--others N] [--fresh] [--peer]   (N more blocks in the pool)
"""

import argparse
import multiprocessing as mp
import statistics
import time
from multiprocessing import reduction


def ok(result):
    """The values of a cuda.bindings call, raising on an error code."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(str(err))
    return values[0] if len(values) == 1 else values


def context():
    from cuda.bindings import driver as cu

    ok(cu.cuInit(0))
    ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))))
    return cu


def timed(times, key, f, *args):
    t0 = time.perf_counter_ns()
    value = ok(f(*args))
    times.setdefault(key, []).append((time.perf_counter_ns() - t0) / 1e3)
    return value


def reader(conn):
    cu = context()
    fd_type = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    stream = ok(cu.cuStreamCreate(1))
    pool = ok(cu.cuMemPoolImportFromShareableHandle(reduction.recv_handle(conn), fd_type, 0))
    own = ok(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING))
    conn.send("ready")
    times = {}
    while (msg := conn.recv()) is not None:
        data = cu.CUmemPoolPtrExportData()
        data.reserved = msg[0]
        handle = cu.CUipcEventHandle()
        handle.reserved = msg[1]
        ptr = timed(times, "import pointer", cu.cuMemPoolImportPointer, pool, data)
        event = timed(times, "open event", cu.cuIpcOpenEventHandle, handle)
        timed(times, "wait", cu.cuStreamWaitEvent, stream, event, 0)
        timed(times, "record own", cu.cuEventRecord, own, stream)
        ok(cu.cuStreamSynchronize(stream))
        timed(times, "destroy event", cu.cuEventDestroy, event)
        timed(times, "free mapping", cu.cuMemFree, ptr)
        conn.send("done")
    conn.send({k: statistics.median(v[1:]) for k, v in times.items()})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--others", type=int, default=0)
    parser.add_argument("--fresh", action="store_true", help="a new block for each send")
    parser.add_argument("--peer", action="store_true", help="device 1 may access the pool")
    args = parser.parse_args()
    cu = context()
    fd_type = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    props = cu.CUmemPoolProps()
    props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.handleTypes = fd_type
    props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = 0
    pool = ok(cu.cuMemPoolCreate(props))
    if args.peer:
        access = cu.CUmemAccessDesc()
        access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = 1
        access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        ok(cu.cuMemPoolSetAccess(pool, [access], 1))
    stream = ok(cu.cuStreamCreate(1))
    others = [
        ok(cu.cuMemAllocFromPoolAsync((k % 7 + 1) << 20, pool, stream)) for k in range(args.others)
    ]
    ptr = ok(cu.cuMemAllocFromPoolAsync(4 << 20, pool, stream))
    ok(cu.cuStreamSynchronize(stream))
    here, there = mp.get_context("spawn").Pipe()
    child = mp.get_context("spawn").Process(target=reader, args=(there,))
    child.start()
    reduction.send_handle(
        here, int(ok(cu.cuMemPoolExportToShareableHandle(pool, fd_type, 0))), child.pid
    )
    assert here.recv() == "ready"
    flags = cu.CUevent_flags.CU_EVENT_INTERPROCESS | cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
    times, data_at, same_data = {}, {}, [0, 0]
    for i in range(41):
        if args.fresh and i:
            ok(cu.cuMemFreeAsync(ptr, stream))
            ok(cu.cuStreamSynchronize(stream))
            ptr = ok(cu.cuMemAllocFromPoolAsync(4 << 20, pool, stream))
            ok(cu.cuStreamSynchronize(stream))
        data = timed(times, "export pointer", cu.cuMemPoolExportPointer, ptr)
        if int(ptr) in data_at:
            same_data[data_at[int(ptr)] == bytes(data.reserved)] += 1
        data_at[int(ptr)] = bytes(data.reserved)
        event = timed(times, "create event", cu.cuEventCreate, flags)
        timed(times, "record", cu.cuEventRecord, event, stream)
        handle = timed(times, "event handle", cu.cuIpcGetEventHandle, event)
        t0 = time.perf_counter_ns()
        here.send((bytes(data.reserved), bytes(handle.reserved)))
        assert here.recv() == "done"
        times.setdefault("pipe round trip", []).append((time.perf_counter_ns() - t0) / 1e3)
        timed(times, "destroy event", cu.cuEventDestroy, event)
    here.send(None)
    theirs = here.recv()
    child.join()
    del others
    print(
        f"export data at a reused address: the same {same_data[1]} times, different "
        f"{same_data[0]} times ({len(data_at)} addresses)"
    )
    kind = "a fresh block each send" if args.fresh else "the same block"
    peer = ", device 1 may access the pool" if args.peer else ""
    print(f"sender, {kind}, {args.others} other blocks in the pool{peer} (us, median of 40):")
    for k, v in times.items():
        print(f"  {k:18} {statistics.median(v[1:]):8.1f}")
    print("reader:")
    for k, v in theirs.items():
        print(f"  {k:18} {v:8.1f}")


if __name__ == "__main__":
    main()
