"""How ``cubridge.Array`` pickles (registered when cubridge is imported).

Host, pinned and managed arrays pickle by value, as numpy's do. A CUDA device array goes to
another process of the node only through ``multiprocessing`` (spawn or forkserver) or
``torch.multiprocessing`` queues and pipes, whose pickler carries file descriptors: it arrives
as a zero-copy view of the same memory (CUDA IPC), and the reader's kernels are ordered after
the sender's last write on the device. A plain ``pickle.dumps`` of one raises ``TypeError``.
"""

import copyreg
import os
import threading
from multiprocessing import connection, process, reduction

from . import _cubridge


def _by_value(array):
    if array.device.type == "cuda":
        raise TypeError(
            f"a cubridge.Array on {array.device} cannot be pickled: send it to another process "
            "through a multiprocessing (spawn or forkserver) or torch.multiprocessing Queue or "
            "Pipe, which shares its memory (allocate it after "
            "cubridge.cuda.set_shareable(True)), or pickle a host copy, "
            "array.to_device('cpu')"
        )
    data = _cubridge._host_bytes(array)
    meta = (str(array.dtype), array.shape, str(array.device), array.readonly)
    return _rebuild_host, (data, *meta)


def _for_process(array):
    if array.device.type != "cuda":
        return _by_value(array)
    if array.size == 0:
        return _rebuild_empty, (array.shape, str(array.dtype), str(array.device))
    wire, fd, *layout = _cubridge._ipc_export(array)
    return _rebuild_shared, (wire, _PoolFds.serve(fd), *layout)


def _rebuild_host(data, dtype, shape, device, readonly):
    return _cubridge._host_rebuild(data, dtype, list(shape), device, readonly)


def _rebuild_empty(shape, dtype, device):
    return _cubridge.empty(shape, dtype=dtype, device=device)


def _rebuild_shared(wire, source, offset, shape, strides, dtype, readonly):
    fd = _PoolFds.fetch(source) if _cubridge._ipc_needs_pool(wire) else -1
    return _cubridge._ipc_import(wire, fd, offset, shape, strides, dtype, readonly)


class _PoolFds:
    """Hands this process's pool file descriptors to the readers that have not imported the
    pool yet, over a Unix socket authenticated with the process's authkey (as multiprocessing's
    resource sharer does, but serving each descriptor as often as asked): a reader fetches it
    once per sending process and device, not once per array."""

    _lock = threading.Lock()
    _listener = None
    _pid = None
    _fds = set()

    @classmethod
    def serve(cls, fd):
        with cls._lock:
            if cls._listener is None or cls._pid != os.getpid():
                cls._listener = connection.Listener(authkey=process.current_process().authkey)
                cls._pid = os.getpid()
                cls._fds = set()
                threading.Thread(target=cls._loop, args=(cls._listener,), daemon=True).start()
            cls._fds.add(fd)
            return cls._listener.address, fd

    @classmethod
    def _loop(cls, listener):
        failures = 0
        while failures < 100:  # a listener that keeps failing is gone
            try:
                with listener.accept() as conn:
                    fd, pid = conn.recv()
                    if fd in cls._fds:
                        reduction.send_handle(conn, fd, pid)
                failures = 0
            except Exception:  # noqa: BLE001 - a reader that failed sees it on its side
                failures += 1

    @staticmethod
    def fetch(source):
        address, fd = source
        with connection.Client(address, authkey=process.current_process().authkey) as conn:
            conn.send((fd, os.getpid()))
            return reduction.recv_handle(conn)


copyreg.pickle(_cubridge.Array, _by_value)
reduction.ForkingPickler.register(_cubridge.Array, _for_process)
