"""The memory model: device memory from the device's stream-ordered pool, frees that never
wait on the host yet are ordered after every stream a consumer declared, giving memory back
(``empty_cache``), statistics, graph capture of allocating adds, two devices. The CUDA cases are
marked ``cuda`` and skip without a GPU; every value is checked against torch or numpy."""

import gc
import json
import os
import threading
import time

import cubridge as cb
import numpy as np
import pytest
from conftest import _try_import, run_child, torch

cupy = _try_import("cupy")

HAS_GPU = cb.cuda.is_available() and torch is not None and torch.cuda.is_available()
cuda = [pytest.mark.cuda, pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")]
needs_cupy = pytest.mark.skipif(cupy is None, reason="cupy is not installed")
two_gpus = pytest.mark.skipif(not HAS_GPU or cb.cuda.device_count() < 2, reason="needs two GPUs")


# ---- without CUDA: the API is there and refuses clearly -------------------------------------


@pytest.mark.skipif(cb.cuda.is_available(), reason="this machine has CUDA")
def test_memory_functions_without_cuda_raise_cuda_unavailable():
    for call in (cb.cuda.empty_cache, cb.cuda.memory_stats):
        with pytest.raises(cb.CudaUnavailableError):
            call()
    with pytest.raises(ValueError, match="CUDA device memory"):
        cb.cuda.record_stream(cb.zeros(3), 1)


def test_record_stream_takes_cubridge_arrays_only():
    with pytest.raises(TypeError, match="cubridge.Array"):
        cb.cuda.record_stream(np.zeros(3), 1)
    with pytest.raises(ValueError, match="CUDA device memory"):
        cb.cuda.record_stream(cb.zeros(3), 1)


def test_memory_functions_refuse_host_devices():
    for device in ("cpu", "cuda_host"):
        with pytest.raises((ValueError, cb.CudaUnavailableError)):
            cb.cuda.memory_stats(device)
        with pytest.raises((ValueError, cb.CudaUnavailableError)):
            cb.cuda.empty_cache(device)


# ---- on the GPU -------------------------------------------------------------------------------


def spin(seconds, stream):
    """Queues about `seconds` of GPU work on the torch `stream`."""
    cycles = int(seconds * torch.cuda.get_device_properties(0).clock_rate * 1000)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(cycles)


def settle():
    torch.cuda.synchronize()
    gc.collect()
    cb.cuda.empty_cache()
    torch.cuda.empty_cache()


def host_blocking_calls():
    """Every public call that has no reason to wait for unrelated GPU work, as (name, fn). Each
    fn does its call and returns what must stay alive until the end of the timing."""
    n = 1 << 22  # 16 MiB of float32
    t = torch.ones(n, device="cuda")
    u = torch.ones(n, device="cuda")
    out = torch.empty(n, device="cuda")
    other = torch.cuda.Stream()
    c_arr = cupy.ones(n, dtype=cupy.float32) if cupy is not None else None
    keep = {}

    def drop(make):
        def fn():
            x = make()
            del x  # the last reference: freed here (a gc.collect() would time the collector)

        return fn

    def add_in_other_stream():
        with torch.cuda.stream(other):
            return cb.add(t, u)

    calls = [
        ("empty", lambda: cb.empty((n,), device="cuda")),
        ("zeros", lambda: cb.zeros((n,), device="cuda")),
        ("full", lambda: cb.full((n,), 2.5, device="cuda")),
        ("arange", lambda: cb.arange(1 << 16, device="cuda")),
        ("add allocating", lambda: cb.add(t, u)),
        ("add out=", lambda: cb.add(t, u, out=out)),
        ("add scalar", lambda: cb.add(t, 1.5)),
        ("add in torch.cuda.stream", add_in_other_stream),
        ("add of cubridge arrays", lambda: cb.zeros((n,), device="cuda") + 1.0),
        ("from_dlpack(torch)", lambda: cb.from_dlpack(t)),
        ("asarray(torch)", lambda: cb.asarray(t)),
        ("asarray cast", lambda: cb.asarray(t, dtype="float16")),
        ("__dlpack__", lambda: keep.setdefault("e", cb.zeros((n,), device="cuda")).__dlpack__()),
        (
            "__cuda_array_interface__",
            lambda: keep.setdefault("e", cb.zeros((n,), device="cuda")).__cuda_array_interface__,
        ),
        ("drop an array", drop(lambda: cb.empty((n,), device="cuda"))),
        ("drop a result", drop(lambda: cb.add(t, u))),
        ("drop a view", drop(lambda: cb.empty((n,), device="cuda").T)),
        ("drop an exported capsule", drop(lambda: cb.empty((n,), device="cuda").__dlpack__())),
        ("drop a torch import", drop(lambda: torch.from_dlpack(cb.empty((n,), device="cuda")))),
        ("drop a pinned array", drop(lambda: cb.empty((1 << 20,), device="cuda_host"))),
        ("drop a managed array", drop(lambda: cb.empty((1 << 20,), device="cuda_managed"))),
        ("cuda.Stream()", lambda: cb.cuda.Stream()),
    ]
    if cupy is not None:
        calls += [
            ("from_dlpack(cupy)", lambda: cb.from_dlpack(c_arr)),
            ("asarray(cupy)", lambda: cb.asarray(c_arr)),
            ("drop a cupy import", drop(lambda: cupy.asarray(cb.empty((n,), device="cuda")))),
        ]
    return calls


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_no_call_waits_for_unrelated_work_on_a_side_stream():
    """With half a second of work queued on a torch side stream, every call returns in well
    under that time, including allocations that must grow the (just emptied) pool, and the side
    stream is still busy when the calls are done."""
    calls = host_blocking_calls()
    for _, fn in calls:  # compile kernels, load modules, create streams: not what is timed
        fn()
    settle()
    side = torch.cuda.Stream()
    spin(0.5, side)
    times = {}
    kept = []
    start = time.perf_counter()
    for name, fn in calls:
        t0 = time.perf_counter()
        kept.append(fn())
        times[name] = time.perf_counter() - t0
    total = time.perf_counter() - start
    still_busy = not side.query()
    side.synchronize()
    report = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in times.items())
    assert still_busy, f"the side stream finished before the calls did ({total:.3f} s): {report}"
    slow = {k: v for k, v in times.items() if v > 0.05}
    assert not slow, f"calls that waited: {slow}; all: {report}"


_FILL = 7.0
_RAW = cb.RawKernel(
    'extern "C" __global__ void fill7(float* x, long long n) {'
    " long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] = 7.0f; }",
    "fill7",
)
_DOUBLE_PLUS_ONE = cb.ElementwiseKernel("T x", "T z", "z = x + x + 1", "double_plus_one")


def _result_of(path, n):
    """A float32 CUDA array of `n` sevens made by one of cubridge's result-producing paths, with
    what must stay alive beside it (nothing of the producer's own is kept: the test drops it)."""
    if path == "full":
        return cb.full((n,), _FILL, dtype="float32", device="cuda")
    if path == "add":
        return cb.add(torch.full((n,), 3.0, device="cuda"), 4.0)
    if path == "elementwise":
        return _DOUBLE_PLUS_ONE(torch.full((n,), 3.0, device="cuda"))
    if path == "raw":
        out = cb.empty((n,), dtype="float32", device="cuda")
        _RAW(((n + 255) // 256,), (256,), (out, np.int64(n)))
        return out
    if path == "extension":
        ext = pytest.importorskip("cubridge_example")
        return ext.scaled_add(
            torch.full((n,), 3.0, device="cuda"), torch.ones(n, device="cuda"), 2.0
        )
    if path == "torch_view":  # foreign memory: torch's caching allocator frees it
        return cb.asarray(torch.full((n,), _FILL, device="cuda"))
    raise AssertionError(path)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
@pytest.mark.parametrize("path", ["full", "add", "elementwise", "raw", "extension", "torch_view"])
@pytest.mark.parametrize("how", ["declared", "record_stream", "torch_from_dlpack", "cai"])
def test_memory_is_not_reused_while_a_consumer_still_reads_it(how, path):
    """Every path that makes a result goes through the same check: a consumer reads the result
    on its own stream behind 0.3 s of work; the result and its export are dropped at once and
    new arrays of the same size (cubridge's and torch's) are written at once. The consumer must
    still read the original values: the memory is let go of only after the consumer's stream."""
    if how == "cai" and cupy is None:
        pytest.skip("cupy is not installed")
    n = 1 << 22
    settle()
    side = torch.cuda.Stream()
    got = torch.empty(n, device="cuda")
    a = _result_of(path, n)
    torch.cuda.synchronize()
    time.sleep(0.02)  # what held the result's kernel has let go of it
    spin(0.3, side)
    with torch.cuda.stream(side):
        if how == "declared":
            t = torch.utils.dlpack.from_dlpack(a.__dlpack__(stream=side.cuda_stream))
        elif how == "record_stream":
            # Exported for the legacy default stream, then read on another: only
            # record_stream tells cubridge.
            t = torch.utils.dlpack.from_dlpack(a.__dlpack__(stream=1))
            cb.cuda.record_stream(a, side)
        elif how == "torch_from_dlpack":
            t = torch.from_dlpack(a)
        else:
            with cupy.cuda.ExternalStream(side.cuda_stream):
                t = torch.as_tensor(cupy.asarray(a), device="cuda")
        got.copy_(t)  # queued behind the spin
    ptr = a.data_ptr
    del a, t
    gc.collect()
    fresh = [cb.full((n,), -1.0, dtype="float32", device="cuda") for _ in range(4)]
    fresh += [torch.full((n,), -1.0, device="cuda") for _ in range(4)]
    reused = any(f.data_ptr == ptr for f in fresh[:4]) or any(
        f.data_ptr() == ptr for f in fresh[4:]
    )
    side.synchronize()
    torch.cuda.synchronize()
    bad = int((got != _FILL).sum())
    assert bad == 0, f"the consumer read {bad} of {n} elements reused under it (reused: {reused})"


@pytest.mark.whole_gpu
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_out_of_memory_names_the_bytes_asked_for_and_the_device():
    n = 4 * cb.cuda.mem_info()[1]
    with pytest.raises(MemoryError, match=f"could not allocate {2 * n} bytes on cuda:0$"):
        cb.empty((n,), dtype="float16", device="cuda:0")
    np.testing.assert_array_equal(cb.arange(3, device="cuda").to_numpy(), np.arange(3))


@pytest.mark.whole_gpu
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_allocating_adds_and_zeros_keep_memory_flat_and_empty_cache_gives_it_back():
    """mem_info() is the whole device's free memory: run this test with the GPU to itself (not
    beside other pytest-xdist workers, whose allocations it would count)."""
    x = torch.ones(1 << 16, device="cuda")
    y = torch.full((1 << 16,), 2.0, device="cuda")
    for _ in range(1000):
        c = cb.add(x, y)
        z = cb.zeros((1 << 16,), device="cuda")
    # The checks below run torch's own kernels; their first use loads them (device memory that
    # is torch's, not ours), so they run once before the baseline is read.
    assert torch.equal(torch.from_dlpack(c), torch.full((1 << 16,), 3.0, device="cuda"))
    del c, z
    settle()
    stats0 = cb.cuda.memory_stats()
    free0 = cb.cuda.mem_info()[0]
    with open("/proc/self/statm") as f:
        rss0 = int(f.read().split()[1])
    chain = cb.zeros((1 << 16,), device="cuda")
    for _ in range(100_000):
        c = cb.add(x, y)
        z = cb.zeros((1 << 16,), device="cuda")
        chain = chain + c
    torch.cuda.synchronize()
    expected = 3.0 * 100_000
    assert torch.equal(torch.from_dlpack(chain), torch.full((1 << 16,), expected, device="cuda"))
    assert torch.equal(torch.from_dlpack(z), torch.zeros(1 << 16, device="cuda"))
    del c, z, chain
    gc.collect()
    torch.cuda.synchronize()
    during = cb.cuda.memory_stats()
    settle()
    stats1 = cb.cuda.memory_stats()
    with open("/proc/self/statm") as f:
        rss1 = int(f.read().split()[1])
    page = os.sysconf("SC_PAGE_SIZE")
    assert stats1["allocations"] - stats0["allocations"] >= 300_000
    assert stats1["allocated_bytes"] == stats0["allocated_bytes"], (stats0, stats1)
    assert during["reserved_bytes"] < 256 << 20, during  # reused, not grown per call
    assert abs(cb.cuda.mem_info()[0] - free0) < (32 << 20)
    assert (rss1 - rss0) * page < (8 << 20), f"RSS grew {(rss1 - rss0) * page} bytes"


_FIRST_ALLOCATIONS_CHILD = r"""
import gc, json, time, torch, cubridge as cb
n = 1 << 20
a = torch.arange(n, dtype=torch.float32, device="cuda")
b = torch.full((n,), 0.5, device="cuda")
torch.cuda.synchronize()
first = cb.add(a, b)
at_first = cb.cuda.memory_stats()
kept, calls, t0 = [first], 0, time.perf_counter()
# Allocate well past the pool's set-up (milliseconds), keeping some results across it.
while time.perf_counter() - t0 < 0.2 or calls < 50:
    c = cb.add(a, b)
    z = cb.zeros(n, device="cuda")
    e = cb.empty(n, device="cuda")
    if calls % 10 == 0:
        kept.append(c)
    calls += 1
torch.cuda.synchronize()
want = a + b
ok = all(torch.equal(torch.from_dlpack(k), want) for k in kept)
ok = ok and torch.equal(torch.from_dlpack(z), torch.zeros(n, device="cuda"))
del c, z, e, kept, first
gc.collect()
cb.cuda.empty_cache()
after = cb.cuda.memory_stats()
late = cb.add(a, b)
at_late = cb.cuda.memory_stats()
ok = ok and torch.equal(torch.from_dlpack(late), want)
print(json.dumps(dict(ok=ok, calls=calls, at_first=at_first, after=after, at_late=at_late)))
"""


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_first_allocations_of_a_process_come_from_outside_the_pool_while_it_sets_up():
    """A process's first pool allocation costs the driver milliseconds, so cubridge makes it on a
    thread of its own and answers the first allocations with cuMemAlloc meanwhile. In a new
    process: the first result is not pool memory, every result across the switch equals torch's,
    all of it is given back, and a later result comes from the pool."""
    done = run_child(_FIRST_ALLOCATIONS_CHILD)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    nbytes = 4 << 20
    assert out["ok"], out
    assert out["at_first"]["allocated_bytes"] == nbytes, out
    assert out["at_first"]["pool_used_bytes"] < nbytes, out  # the first result: cuMemAlloc
    assert out["after"]["allocated_bytes"] == 0, out
    assert out["at_late"]["pool_used_bytes"] >= nbytes, out  # set up: from the pool


@pytest.mark.whole_gpu
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_after_a_burst_and_empty_cache_torch_can_allocate_what_it_could_before():
    settle()
    free, _ = cb.cuda.mem_info()
    budget = free - (2 << 30)
    burst = [cb.empty((budget // 8,), dtype="uint8", device="cuda") for _ in range(8)]
    assert cb.cuda.memory_stats()["allocated_bytes"] >= budget - 8
    del burst
    gc.collect()
    reserved = cb.cuda.memory_stats()["reserved_bytes"]
    assert reserved >= budget - (64 << 20), "the pool keeps what was freed, for reuse"
    cb.cuda.empty_cache()
    assert cb.cuda.memory_stats()["reserved_bytes"] < (64 << 20)
    big = torch.empty(budget, dtype=torch.uint8, device="cuda")  # what torch could take before
    del big
    torch.cuda.empty_cache()


@pytest.mark.whole_gpu
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_allocation_that_needs_torchs_cache_gets_it():
    """torch caches freed memory; an allocation that only fits once torch gives it back
    succeeds (cubridge asks torch and CuPy to release their caches before failing)."""
    settle()
    free, _ = cb.cuda.mem_info()
    hog = torch.empty(free - (1 << 30), dtype=torch.uint8, device="cuda")
    del hog  # now cached by torch, not free on the device
    assert cb.cuda.mem_info()[0] < (2 << 30)
    a = cb.empty((free - (1 << 30),), dtype="uint8", device="cuda")
    del a
    settle()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_allocating_add_is_captured_into_a_cuda_graph_and_replays():
    n = 1 << 20
    a = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up: compile and load the kernels outside the capture
        for _ in range(3):
            c = cb.add(a, b)
            cb.add(cb.add(c, 1.0, stream=s), c, stream=s)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        c = cb.add(a, b)  # on torch's current stream, the capturing one
        # Operands that are all cubridge's name no framework stream: the capturing one is given.
        here = torch.cuda.current_stream()
        d = cb.add(c, 1.0, stream=here)
        e = cb.add(d, c, stream=here)
    for _ in range(3):
        a.copy_(torch.randn(n, device="cuda"))
        b.copy_(torch.randn(n, device="cuda"))
        g.replay()
        torch.cuda.synchronize()
        want = (a + b) + 1.0 + (a + b)
        torch.testing.assert_close(torch.from_dlpack(e), want)
    del c, d, e, g
    settle()


def _capture_torch(fn):
    """`fn()` warmed up on a side stream, then captured into a torch graph: (graph, result)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def _capture_cupy(fn):
    """The same with a CuPy stream capture: (graph, result, stream)."""
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        for _ in range(2):
            fn(s)
        s.synchronize()
        s.begin_capture()
        out = fn(s)
        g = s.end_capture()
    return g, out, s


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_a_captured_result_lives_as_long_as_its_graph(framework):
    """A users' kernel's result allocated inside a capture is dropped, other arrays take the
    freed memory, and the graph is replayed: the replays must write the result's own memory,
    never those arrays (the graph holds its memory), and once the graph is gone the memory is
    given back."""
    if framework == "cupy" and cupy is None:
        pytest.skip("cupy is not installed")
    n = 1 << 20
    settle()
    before = cb.cuda.memory_stats()["allocated_bytes"]
    k = cb.ElementwiseKernel("T x, T y", "T z", "z = x + y", "captured_sum")
    if framework == "torch":
        x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        g, z = _capture_torch(lambda: k(x, y))
        want, s = x + y, None
    else:
        x, y = cupy.random.randn(n, dtype=cupy.float32), cupy.random.randn(n, dtype=cupy.float32)
        g, z, s = _capture_cupy(lambda s: k(x, y, stream=s))
        want = torch.from_dlpack(x + y)

    def replay(graph):
        graph.replay() if s is None else graph.launch(s)
        torch.cuda.synchronize()
        if s is not None:
            s.synchronize()

    replay(g)
    torch.testing.assert_close(torch.from_dlpack(z).clone(), want)
    del z
    gc.collect()
    torch.cuda.synchronize()
    others = [cb.full((n,), -3.0, dtype="float32", device="cuda") for _ in range(8)]
    for _ in range(3):
        replay(g)
    wrote = [i for i, o in enumerate(others) if not bool((torch.from_dlpack(o) == -3.0).all())]
    assert not wrote, f"replays wrote arrays {wrote}, made of memory the graph gave back"
    del others, g
    gc.collect()
    settle()
    # The driver hands the graph's memory back from a thread of its own, then cubridge's
    # background threads free it after waiting for the device.
    deadline = time.monotonic() + 5
    while cb.cuda.memory_stats()["allocated_bytes"] > before and time.monotonic() < deadline:
        time.sleep(0.01)
        settle()
    assert cb.cuda.memory_stats()["allocated_bytes"] <= before


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_arrays_dropped_during_a_capture_are_freed_after_it():
    x = cb.zeros((1 << 20,), device="cuda")
    t = torch.ones(1 << 20, device="cuda")
    torch.from_dlpack(x)  # exported to a consumer whose stream is unknown
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = cb.add(t, t)
        del x  # its free waits for the device: deferred until the capture ended
        gc.collect()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(torch.from_dlpack(y), torch.full((1 << 20,), 2.0, device="cuda"))
    del y, g
    settle()
    assert cb.cuda.memory_stats()["allocated_bytes"] < (1 << 20)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_a_side_stream_call_beside_another_threads_capture_leaves_it_valid():
    """Operands written on another stream, done but not yet seen done, are asked about (and then
    not waited for) while another thread captures a graph in the global mode: the capture must
    stay valid and both results right."""
    n = 1 << 16
    t = torch.ones(n, device="cuda")
    first, side = torch.cuda.Stream(), torch.cuda.Stream()
    x = cb.add(t, t, stream=first)
    z = cb.add(t, t, stream=first)
    first.synchronize()
    capturing, called = threading.Event(), threading.Event()
    outcome = {}

    def capture():
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):  # the global capture mode, torch's default
                y = t * 3
                capturing.set()
                called.wait(20)
                y = y + 1
            g.replay()
            torch.cuda.synchronize()
            outcome["y"] = y.cpu()
        except Exception as e:  # noqa: BLE001 - reported below
            outcome["error"] = repr(e)
            capturing.set()

    worker = threading.Thread(target=capture)
    worker.start()
    assert capturing.wait(20)
    try:
        cb.add(x, x, out=z, stream=side)
    finally:
        called.set()
        worker.join()
    assert "error" not in outcome, outcome
    assert torch.equal(outcome["y"], torch.full((n,), 4.0))
    side.synchronize()
    assert torch.equal(torch.from_dlpack(z).cpu(), torch.full((n,), 4.0))
    settle()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_adds_from_threads_on_their_own_streams_allocate_and_free_correctly():
    errors = []

    def work(seed):
        try:
            s = torch.cuda.Stream()
            g = torch.Generator(device="cuda").manual_seed(seed)
            with torch.cuda.stream(s):
                x = torch.rand(1 << 18, device="cuda", generator=g)
                acc = cb.zeros((1 << 18,), device="cuda")
                for _ in range(200):
                    acc = cb.add(acc, x)
                got = torch.from_dlpack(acc)
                torch.testing.assert_close(got, x * 200, rtol=1e-5, atol=1e-3)
            s.synchronize()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    settle()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_side_stream_results_are_reused_there_only_after_their_last_use():
    """A small result whose every use was on one side stream waits (parked) for the next
    allocation there, which frees it on that stream. A chain of 300 allocating adds behind
    0.2 s of queued work (each block freed and reused while the work that used it is still
    queued), three times, each on a new stream: every value equals torch's, and the pool does
    not grow by every result. (The ordering across a destroyed stream: the next test.)"""
    settle()
    n = 1 << 16
    x = torch.rand(n, device="cuda")
    torch.cuda.synchronize()  # x is read on other streams, which torch does not order
    before = cb.cuda.memory_stats()["reserved_bytes"]
    for _ in range(3):
        s = cupy.cuda.Stream(non_blocking=True) if cupy is not None else torch.cuda.Stream()
        handle = s.ptr if cupy is not None else s.cuda_stream
        spin(0.2, torch.cuda.ExternalStream(handle))
        acc = cb.zeros((n,), device="cuda")
        for _ in range(300):
            acc = cb.add(acc, x, stream=handle)
        got = torch.empty(n, device="cuda")
        with torch.cuda.stream(torch.cuda.ExternalStream(handle)):
            got.copy_(torch.from_dlpack(acc.__dlpack__(stream=handle)))
        del acc
        torch.cuda.ExternalStream(handle).synchronize()
        torch.testing.assert_close(got, x * 300, rtol=1e-5, atol=1e-3)
        del s  # blocks of the last adds are still parked for it
        gc.collect()
    grown = cb.cuda.memory_stats()["reserved_bytes"] - before
    assert grown < 64 << 20, grown
    settle()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
@needs_cupy
def test_a_parked_block_outwaits_its_last_use_on_a_destroyed_stream():
    """A result parked for a CuPy stream whose last use (the next add, reading it) is still
    queued behind 0.3 s of work when the stream is destroyed; a new stream that the driver
    gives the same handle then allocates the same size at once, which frees the parked block
    there and may reuse it, and writes x + 5 into it. The queued use must still read 2x: the
    free waits for the use's event, not only for the new stream's own order."""
    settle()
    n = 1 << 16
    x = torch.rand(n, device="cuda")
    torch.cuda.synchronize()  # x is read on other streams, which torch does not order
    tried = 0
    for _ in range(8):
        s1 = cupy.cuda.Stream(non_blocking=True)
        h1 = s1.ptr
        spin(0.3, torch.cuda.ExternalStream(h1))
        c = cb.add(x, x, stream=h1)
        d = cb.add(c, x, stream=h1)  # reads c behind the spin
        del c  # parked for s1
        del s1
        gc.collect()  # s1 destroyed, its work still queued
        s2 = cupy.cuda.Stream(non_blocking=True)
        if s2.ptr != h1:
            torch.cuda.synchronize()
            continue
        tried += 1
        junk = [cb.add(x, 5.0, stream=s2.ptr) for _ in range(4)]
        got = torch.from_dlpack(d).clone()
        torch.cuda.synchronize()
        torch.testing.assert_close(got, x * 3)
        for j in junk:
            torch.testing.assert_close(torch.from_dlpack(j), x + 5)
        del junk, d, s2
        settle()
    if tried == 0:
        pytest.skip("the driver gave no new stream a destroyed one's handle")


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_empty_cache_gives_back_blocks_parked_for_a_side_stream():
    """Results used only on a torch side stream are parked for it; `empty_cache` frees them
    after their uses (the values read on the default stream stay right) and the pool's use
    goes back to what it was."""
    settle()
    side = torch.cuda.Stream()
    x = torch.ones(1 << 16, device="cuda")
    side.wait_stream(torch.cuda.current_stream())  # torch does not order the fill before side
    with torch.cuda.stream(side):
        x = x.clone()
    side.synchronize()
    used = cb.cuda.memory_stats()["pool_used_bytes"]
    with torch.cuda.stream(side):
        c = cb.add(x, x)
        d = cb.add(c, x)
    e = torch.from_dlpack(d).clone()
    del c, d
    side.synchronize()
    cb.cuda.empty_cache()
    assert torch.equal(e.cpu(), torch.full((1 << 16,), 3.0))
    assert cb.cuda.memory_stats()["pool_used_bytes"] <= used
    settle()


@two_gpus
@pytest.mark.cuda
def test_each_device_allocates_from_its_own_pool():
    settle()
    for d in (0, 1):
        torch.cuda.synchronize(d)
    before = [cb.cuda.memory_stats(d)["allocated_bytes"] for d in (0, 1)]
    x1 = torch.arange(1 << 20, dtype=torch.float32, device="cuda:1")
    r = cb.add(x1, x1)
    z = cb.zeros((1 << 20,), device="cuda:1")
    assert r.device == "cuda:1" and z.device == "cuda:1"
    assert cb.cuda.memory_stats(1)["allocated_bytes"] - before[1] >= 8 << 20
    assert cb.cuda.memory_stats(0)["allocated_bytes"] == before[0]
    assert torch.equal(torch.from_dlpack(r), x1 * 2)
    assert torch.equal(torch.from_dlpack(z), torch.zeros(1 << 20, device="cuda:1"))
    copied = r.to_device("cuda:0")
    assert torch.equal(torch.from_dlpack(copied).cpu(), (x1 * 2).cpu())
    # The copy's memory is counted on the device it lives on, and handed back there.
    assert cb.cuda.memory_stats(torch.device("cuda", 0))["allocated_bytes"] - before[0] == 4 << 20
    del r, z, copied
    gc.collect()
    torch.cuda.synchronize(1)
    cb.cuda.empty_cache(1)
    assert cb.cuda.memory_stats(1)["allocated_bytes"] == before[1]
    assert cb.cuda.memory_stats(0)["allocated_bytes"] == before[0]
    assert torch.cuda.current_device() == 0


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
@pytest.mark.parametrize(
    "dtype,value",
    [
        ("bool", True),
        ("int8", -3),
        ("uint8", 200),
        ("int16", -12345),
        ("float16", -0.0),
        ("bfloat16", 1.5),
        ("int32", -7),
        ("float32", -2.75),
        ("int64", -(2**40) - 3),
        ("int64", -1),
        ("float64", -0.0),
        ("float64", 1e300),
        ("complex64", 1.5 - 2.25j),
        ("complex128", -0.5 + 3j),
    ],
)
def test_full_fills_on_the_device_every_element_size(dtype, value):
    """full on CUDA is a memset queued on the device (elements of 8 and 16 bytes word by word);
    compared with torch.full bit for bit, negative zero included."""
    n = 1000
    got = torch.from_dlpack(cb.full((n,), value, dtype=dtype, device="cuda"))
    want = torch.full((n,), value, dtype=getattr(torch, dtype), device="cuda")
    torch.cuda.synchronize()
    assert got.dtype == want.dtype
    if got.is_complex():
        got, want = torch.view_as_real(got), torch.view_as_real(want)
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
    assert torch.equal(got.view(bits), want.view(bits))


# ---- on any machine: mem_info -------------------------------------------------------------------


def test_mem_info_takes_none_as_the_current_device():
    """`mem_info(None)` said "cpu is not a CUDA device"; every other cuda.* function takes
    None as the current device."""
    if cb.cuda.is_available():
        free, total = cb.cuda.mem_info(None)
        assert 0 < free <= total
        assert cb.cuda.mem_info() == pytest.approx((free, total), rel=0.5)
    else:
        with pytest.raises(cb.CudaUnavailableError):
            cb.cuda.mem_info(None)
