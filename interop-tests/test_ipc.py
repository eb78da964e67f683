"""Arrays between processes: host, pinned and managed arrays pickle by value (like numpy's);
CUDA device arrays cross multiprocessing and torch.multiprocessing queues as zero-copy views of
the same memory (CUDA IPC), ordered after the sender's queued writes. Values are checked with
numpy; the CUDA tests are marked ``cuda`` and reuse one reader process per start method."""

import gc
import multiprocessing
import os
import pickle
import time
from multiprocessing.reduction import ForkingPickler

import cubridge as cb
import ipc_children as children
import numpy as np
import pytest
from conftest import NUMPY_DTYPES, sample, torch

HAS_GPU = cb.cuda.is_available() and cb.cuda.device_count() > 0
N = 1 << 20

# Spins about `cycles` clocks, then writes x[i] = 3 i + 1: a write still queued when it is sent.
LATE_WRITE = r"""extern "C" __global__ void late_write(float* x, long long n, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        x[i] = 3.0f * (float)i + 1.0f;
    }
}"""


# --- host arrays: by value -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_host_arrays_pickle_by_value(dtype):
    x = sample((3, 5), dtype, seed=3)
    a = cb.asarray(x)
    b = pickle.loads(pickle.dumps(a))
    assert b.data_ptr != a.data_ptr  # a copy, as numpy's pickles are
    assert (b.dtype, b.shape, str(b.device)) == (dtype, (3, 5), "cpu")
    np.testing.assert_array_equal(np.from_dlpack(b), x)


def test_host_views_pickle_their_own_elements_in_c_order():
    x = np.arange(24, dtype=np.int32).reshape(4, 6)
    a = cb.asarray(x).T.as_strided((3, 2), (6, -2), 10)
    reference = np.array([[x.flat[10 + 6 * i - 2 * j] for j in range(2)] for i in range(3)])
    got = pickle.loads(pickle.dumps(a))
    np.testing.assert_array_equal(np.from_dlpack(got), reference)
    assert got.strides == (2, 1)


def test_empty_and_zero_dimensional_host_arrays_pickle():
    for x in (np.zeros((0, 3), np.float64), np.array(7, np.int16)):
        b = pickle.loads(pickle.dumps(cb.asarray(x)))
        assert b.shape == x.shape
        np.testing.assert_array_equal(np.from_dlpack(b), x)


def test_read_only_stays_read_only():
    x = np.arange(4.0)
    x.flags.writeable = False
    b = pickle.loads(pickle.dumps(cb.asarray(x)))
    assert b.readonly
    np.testing.assert_array_equal(np.from_dlpack(b), x)


def test_damaged_host_pickles_are_refused():
    with pytest.raises(ValueError, match="bytes"):
        cb._cubridge._host_rebuild(b"\0" * 7, "float32", [2], "cpu", False)
    with pytest.raises(ValueError, match="not a shared cubridge array"):
        cb._cubridge._ipc_import(b"nope", -1, 0, [1], [1], "float32", False)


def test_host_arrays_cross_a_spawn_process_by_value():
    x = sample((64,), "float64", seed=5)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        back, total = pool.apply(children.echo, (cb.asarray(x),))
    np.testing.assert_array_equal(np.from_dlpack(back), x)
    assert total == x.sum()


def test_pool_descriptors_are_served_to_readers_as_often_as_asked():
    from cubridge._pickle import _PoolFds

    r, w = os.pipe()
    os.write(w, b"hello" * 2)
    source = _PoolFds.serve(r)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(children.read_served, (source,)) == b"hello"
        assert pool.apply(children.read_served, (source,)) == b"hello"  # served again, not used up
    os.close(w)


# --- CUDA: refusals --------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_plain_pickle_of_a_device_array_says_how_to_send_it():
    a = cb.zeros(4, device="cuda")
    with pytest.raises(TypeError, match="multiprocessing"):
        pickle.dumps(a)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_memory_of_the_devices_own_pool_is_refused_clearly():
    cb.cuda.set_shareable(False)
    a = cb.zeros(4, device="cuda")
    with pytest.raises(ValueError, match="set_shareable"):
        ForkingPickler.dumps(a)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
@pytest.mark.parametrize("device", ["cuda_host", "cuda_managed"])
def test_pinned_and_managed_arrays_pickle_by_value(device):
    x = np.arange(10, dtype=np.float32)
    a = cb.asarray(x, device=device)
    b = pickle.loads(pickle.dumps(a))
    assert str(b.device) == device and b.data_ptr != a.data_ptr
    np.testing.assert_array_equal(np.from_dlpack(b.to_device("cpu")), x)


# --- CUDA: a reader process, one per start method --------------------------------------------


def _context(method):
    if method == "torch":
        if torch is None:
            pytest.skip("torch is not installed")
        import torch.multiprocessing as tmp

        return tmp.get_context("spawn")
    return multiprocessing.get_context(method)


class Reader:
    def __init__(self, method):
        ctx = _context(method)
        self.requests, self.replies = ctx.Queue(), ctx.Queue()
        self.process = ctx.Process(target=children.serve, args=(self.requests, self.replies))
        self.process.start()
        assert self.replies.get(timeout=60) == "ready"

    def __call__(self, fn, *args):
        self.requests.put((fn, args))
        reply = self.replies.get(timeout=30)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def stop(self):
        self.requests.put(None)
        self.process.join(10)


@pytest.fixture(scope="module", params=["spawn", "forkserver", "torch"])
def reader_process(request):
    if not HAS_GPU:
        pytest.skip("no CUDA GPU here")
    r = Reader(request.param)
    yield r
    r.stop()


@pytest.fixture
def reader(reader_process):
    """The reader process of the start method, with this process's new device memory
    shareable for the test."""
    cb.cuda.set_shareable(True)
    yield reader_process
    cb.cuda.set_shareable(False)


def late_write(a, stream):
    cycles = 100_000_000  # about 50 ms at 2 GHz
    k = cb.RawKernel(LATE_WRITE, "late_write")
    k((64,), (256,), (a, np.int64(a.size), np.int64(cycles)), stream=stream)


@pytest.mark.cuda
def test_reader_sees_the_values_of_the_writers_still_queued_kernel(reader):
    a = cb.zeros(N, dtype="float32", device="cuda")
    late_write(a, cb.cuda.Stream())
    got = reader(children.host_copy, a)  # sent without any synchronize
    np.testing.assert_array_equal(got, 3.0 * np.arange(N, dtype=np.float32) + 1.0)


@pytest.mark.cuda
def test_an_array_sent_again_and_new_ones_in_its_place_arrive_with_their_own_values(reader):
    """The first send travels with an interprocess event (the write is still queued), the second
    without one (the write is complete) and on the export data kept from the first; arrays
    allocated after it is freed, which the pool may place at its address, have data of their
    own."""
    a = cb.zeros(N, dtype="float32", device="cuda")
    late_write(a, cb.cuda.Stream())
    expected = 3.0 * np.arange(N, dtype=np.float32) + 1.0
    np.testing.assert_array_equal(reader(children.host_copy, a), expected)
    cb.cuda.synchronize()
    np.testing.assert_array_equal(reader(children.host_copy, a), expected)
    del a
    for value in (5.0, 6.0):
        reader(children.settle)
        gc.collect()
        b = cb.asarray(np.full(N, value, dtype=np.float32), device="cuda")
        np.testing.assert_array_equal(reader(children.host_copy, b), np.full(N, value, np.float32))
        del b


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
@pytest.mark.parametrize("write", ["queued", "complete"])
def test_an_array_read_back_where_it_was_sent_is_the_same_memory(write):
    cb.cuda.set_shareable(True)
    try:
        a = cb.zeros(N, dtype="float32", device="cuda")
        late_write(a, cb.cuda.Stream())
        if write == "complete":
            cb.cuda.synchronize()  # sent without an interprocess event
        q = multiprocessing.get_context("spawn").Queue()
        q.put(a)
        b = q.get(timeout=30)
        assert b.data_ptr == a.data_ptr
        expected = 3.0 * np.arange(N, dtype=np.float32) + 1.0
        np.testing.assert_array_equal(np.from_dlpack(b.to_device("cpu")), expected)
    finally:
        cb.cuda.set_shareable(False)


@pytest.mark.cuda
def test_the_reader_maps_the_same_memory(reader):
    a = cb.asarray(np.arange(1000, dtype=np.float32), device="cuda")
    view = a.as_strided((10, 50), (100, 2), 1)
    assert reader(children.double_in_place, view)
    expected = np.arange(1000, dtype=np.float32)
    mask = np.zeros(1000, bool)
    mask[(np.arange(10)[:, None] * 100 + 1 + 2 * np.arange(50)).ravel()] = True
    expected[mask] *= 2
    np.testing.assert_array_equal(np.from_dlpack(a.to_device("cpu")), expected)


@pytest.mark.cuda
def test_memory_goes_back_to_the_writer_once_the_reader_lets_go(reader):
    reader(children.settle)
    cb.cuda.empty_cache()
    before = cb.cuda.memory_stats()["allocated_bytes"]
    a = cb.zeros(16 << 20, dtype="float32", device="cuda")
    reader(children.hold, "big", a)
    del a
    gc.collect()
    cb.cuda.empty_cache()
    assert cb.cuda.memory_stats()["allocated_bytes"] >= before + (64 << 20)  # the reader holds it
    assert reader(children.let_go, "big")
    cb.cuda.empty_cache()
    assert cb.cuda.memory_stats()["allocated_bytes"] == before


@pytest.mark.cuda
def test_a_reader_that_dies_holding_memory_breaks_nothing(reader):
    reader(children.settle)
    cb.cuda.empty_cache()
    before = cb.cuda.memory_stats()["allocated_bytes"]
    a = cb.asarray(np.arange(4096, dtype=np.float32), device="cuda")
    ctx = multiprocessing.get_context("spawn")
    doomed = ctx.Process(target=children.hold_and_die, args=(a,))
    doomed.start()
    doomed.join(60)
    assert doomed.exitcode == 3
    np.testing.assert_array_equal(
        np.from_dlpack((a + a).to_device("cpu")), 2 * np.arange(4096, dtype=np.float32)
    )
    assert reader(children.host_copy, a).sum() == np.arange(4096, dtype=np.float32).sum()
    del a
    reader(children.settle)
    gc.collect()
    deadline = time.monotonic() + 5
    while cb.cuda.memory_stats()["allocated_bytes"] != before and time.monotonic() < deadline:
        cb.cuda.empty_cache()  # the dead reader's hold is reclaimed
    assert cb.cuda.memory_stats()["allocated_bytes"] == before
