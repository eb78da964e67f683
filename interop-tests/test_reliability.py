"""Reliability: lifetimes and deleter counts, leaks over many exchanges, malformed input (hand-made
DLPack capsules, CAI dicts, streams) answered by clean exceptions, fuzzing of descriptor parsing,
and concurrency. The CUDA parts live in test_cuda.py."""

import gc
import os
import threading
import time

import cubridge as cb
import numpy as np
import pytest
from conftest import examples, needs_torch, run_child, torch
from dlpack_ctypes import float_buffer, make_capsule
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CLEAN = (ValueError, TypeError, BufferError, cb.CudaUnavailableError)


# ---- lifetimes and deleter counts -------------------------------------------------------------


@pytest.mark.parametrize("versioned", [False, True])
def test_deleter_runs_once_when_the_last_view_goes(versioned):
    buf = float_buffer(4)
    made = make_capsule(data=buf, shape=(4,), strides=(1,), versioned=versioned)
    v = cb.from_dlpack(made.capsule)
    w = cb.asarray(v)  # a second reference to the same view
    n = np.from_dlpack(v)  # and an export of it
    del v, w
    gc.collect()
    assert made.deleted == 0
    assert n.ctypes.data == ctypes_addr(buf)
    del n
    gc.collect()
    assert made.deleted == 1


def ctypes_addr(buf):
    import ctypes

    return ctypes.addressof(buf)


def test_capsule_consumed_twice_frees_nothing_twice():
    made = make_capsule(data=float_buffer(4), strides=(1,))
    v = cb.from_dlpack(made.capsule)
    with pytest.raises(ValueError, match="consumed"):
        cb.from_dlpack(made.capsule)
    del v
    gc.collect()
    assert made.deleted == 1


def test_never_consumed_exports_are_freed():
    a = cb.arange(1000, dtype="int32")
    caps = [a.__dlpack__(), a.__dlpack__(max_version=(1, 0))]
    del caps
    gc.collect()
    np.testing.assert_array_equal(a.to_numpy(), np.arange(1000))


def test_producer_dies_first_and_consumer_dies_first():
    ref = np.arange(10.0)
    v = cb.asarray(ref)
    del ref
    gc.collect()
    np.testing.assert_array_equal(v.to_numpy(), np.arange(10.0))
    a = cb.arange(10, dtype="float64")
    n = np.from_dlpack(a)
    del n
    gc.collect()
    np.testing.assert_array_equal(a.to_numpy(), np.arange(10.0))


def test_deleter_called_from_another_thread():
    made = make_capsule(data=float_buffer(4), strides=(1,))
    holder = [cb.from_dlpack(made.capsule)]

    def drop():
        holder.clear()
        gc.collect()

    t = threading.Thread(target=drop)
    t.start()
    t.join()
    assert made.deleted == 1


def test_interpreter_exits_cleanly_with_live_exports():
    code = (
        "import numpy as np, cubridge as cb\n"
        "a = cb.arange(100, dtype='float32')\n"
        "n = np.from_dlpack(a)\n"
        "cap = a.__dlpack__(max_version=(1, 0))\n"
        "v = cb.asarray(np.arange(5))\n"
        "m = memoryview(cb.zeros((3,)))\n"
        "keep = [a, n, cap, v, m]\n"
        "print('ok')\n"
    )
    done = run_child(code)
    assert done.stdout.strip() == "ok" and done.stderr == ""


# ---- leaks -------------------------------------------------------------------------------------


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


CYCLES = 100_000
CPU_PROTOCOLS = {
    "dlpack_legacy": lambda a, src: cb.from_dlpack(a.__dlpack__()),
    "dlpack_versioned": lambda a, src: cb.from_dlpack(a.__dlpack__(max_version=(1, 0))),
    "numpy_consumes": lambda a, src: np.from_dlpack(a),
    "buffer_export": lambda a, src: memoryview(a),
    "buffer_import": lambda a, src: cb.asarray(memoryview(src)),
}


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
@pytest.mark.parametrize("protocol", CPU_PROTOCOLS)
def test_many_exchanges_keep_host_memory_flat(protocol):
    a = cb.arange(256, dtype="float32")
    src = np.arange(256, dtype=np.float32)
    step = CPU_PROTOCOLS[protocol]
    for _ in range(2000):  # warm up allocator pools
        step(a, src)
    gc.collect()
    before = rss_bytes()
    for _ in range(CYCLES):
        step(a, src)
    gc.collect()
    grown = rss_bytes() - before
    # A leak of even one 40-byte descriptor per cycle would be 4 MB.
    assert grown < 2 << 20, f"{protocol}: RSS grew {grown} bytes over {CYCLES} cycles"


# ---- malformed DLPack capsules ------------------------------------------------------------------


BAD_CAPSULES = {
    "negative ndim": dict(ndim=-1),
    "huge ndim": dict(ndim=1 << 30),
    "ndim above 64": dict(ndim=65, shape=(1,) * 65, strides=(1,) * 65),
    "negative shape": dict(shape=(-3,), strides=(1,)),
    "null shape": dict(shape_is_null=True, strides=(1,)),
    "opaque handle dtype": dict(code=3, bits=64),
    "fp8 dtype": dict(code=10, bits=8),
    "80-bit float": dict(code=2, bits=80),
    "vector lanes": dict(code=2, bits=32, lanes=4),
    "zero bits": dict(code=2, bits=0),
    "ROCm device": dict(device_type=10),
    "Metal device": dict(device_type=8),
    "Vulkan device": dict(device_type=7),
    "oneAPI device": dict(device_type=14),
    "misaligned byte_offset": dict(byte_offset=2, strides=(1,)),
    "strides overflow": dict(shape=(4,), strides=(1 << 62,)),
    "null data, non-empty": dict(data=None, strides=(1,)),
    "versioned 2.0": dict(versioned=True, version=(2, 0), strides=(1,)),
    "versioned 1.3 null strides": dict(versioned=True, strides=None, shape=(4,)),
}


@pytest.mark.parametrize("case", BAD_CAPSULES)
def test_malformed_capsules_raise_and_release(case):
    fields = dict(data=float_buffer(16), shape=(4,))
    fields.update(BAD_CAPSULES[case])
    made = make_capsule(**fields)
    with pytest.raises(CLEAN) as info:
        cb.from_dlpack(made.capsule)
    assert str(info.value)  # a message, not a bare exception
    gc.collect()
    assert made.deleted == 1, "a refused tensor is handed back to its producer exactly once"


def test_device_errors_name_the_device():
    for code, name in [(10, "ROCm"), (8, "Metal"), (7, "Vulkan"), (14, "oneAPI")]:
        made = make_capsule(data=float_buffer(4), strides=(1,), device_type=code)
        with pytest.raises(ValueError, match=name):
            cb.from_dlpack(made.capsule)


def test_wrong_capsule_name():
    made = make_capsule(data=float_buffer(4), strides=(1,), name=b"not_a_tensor")
    with pytest.raises(CLEAN):
        cb.from_dlpack(made.capsule)
    assert made.deleted == 0  # not a DLPack capsule: cubridge must not touch it


def test_null_strides_from_legacy_producers_mean_contiguous():
    buf = float_buffer(6)
    made = make_capsule(data=buf, ndim=2, shape=(2, 3), strides=None)
    v = cb.from_dlpack(made.capsule)
    assert v.strides == (3, 1)


def test_null_data_is_fine_when_empty():
    made = make_capsule(data=None, shape=(0,), strides=(1,))
    v = cb.from_dlpack(made.capsule)
    assert v.shape == (0,) and np.from_dlpack(v).size == 0


@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ndim=st.integers(-4, 70),
    dims=st.lists(st.integers(-3, 1 << 40), min_size=0, max_size=70),
    strides=st.one_of(st.none(), st.lists(st.integers(-(1 << 62), 1 << 62), max_size=70)),
    code=st.integers(0, 20),
    bits=st.sampled_from([0, 1, 4, 8, 16, 32, 64, 128, 255]),
    lanes=st.sampled_from([0, 1, 2, 4]),
    device_type=st.integers(0, 20),
    device_id=st.integers(-2, 3),
    byte_offset=st.integers(0, 1 << 64 - 1),
    has_data=st.booleans(),
    versioned=st.booleans(),
)
def test_fuzzed_descriptors_never_crash(
    ndim,
    dims,
    strides,
    code,
    bits,
    lanes,
    device_type,
    device_id,
    byte_offset,
    has_data,
    versioned,
):
    # The shape and strides arrays hold at least `ndim` entries whenever cubridge may read them
    # (ndim <= 64); beyond that it must refuse before reading.
    n = max(ndim, 0)
    shape = (dims + [1] * n)[:n] if n <= 64 else [1]
    stride_vals = None if strides is None else ((strides + [1] * n)[:n] if n <= 64 else [1])
    made = make_capsule(
        data=float_buffer(16) if has_data else None,
        ndim=ndim,
        shape=shape,
        strides=stride_vals,
        code=code,
        bits=bits,
        lanes=lanes,
        device_type=device_type,
        device_id=device_id,
        byte_offset=byte_offset,
        versioned=versioned,
    )
    # Reference counting alone must hand the tensor back (no gc.collect: it would take most of
    # the run time with torch and jax loaded, and a leak into a reference cycle is a leak too).
    try:
        v = cb.from_dlpack(made.capsule)
    except CLEAN:
        assert made.deleted == 1
        return
    # Accepted: the view must describe exactly what was handed over.
    assert v.shape == tuple(shape[:n])
    del v
    assert made.deleted == 1


# ---- malformed CUDA array interfaces and streams ---------------------------------------------


class CaiObject:
    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


GOOD_CAI = {"shape": (4,), "typestr": "<f4", "data": (0x7F000000, False), "version": 3}


@pytest.mark.parametrize(
    "change",
    [
        {"shape": None},
        {"typestr": None},
        {"data": None},
        {"version": None},
        {"shape": "abc"},
        {"shape": (-1,)},
        {"typestr": "<x4"},
        {"typestr": ">f4"},
        {"typestr": 5},
        {"data": (None, False)},
        {"data": "ptr"},
        {"mask": (1,)},
        {"version": 4},
        {"version": "3"},
        {"stream": 0},
        {"stream": "s"},
        {"strides": (3,)},
        {"strides": "x"},
    ],
    ids=str,
)
def test_malformed_cai_dicts(change):
    cai = {k: v for k, v in {**GOOD_CAI, **change}.items() if v is not None}
    with pytest.raises(CLEAN) as info:
        cb.asarray(CaiObject(cai))
    assert "__cuda_array_interface__" in str(info.value) or isinstance(
        info.value, (TypeError, cb.CudaUnavailableError)
    )


def test_cai_that_is_not_a_dict():
    with pytest.raises(TypeError, match="dict"):
        cb.asarray(CaiObject([1, 2]))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4).map(tuple) | st.lists(inner, max_size=4),
    max_leaves=8,
)


@settings(max_examples=examples(10), deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["shape", "typestr", "data", "version", "strides", "stream", "mask", "x"]),
        json_values,
    )
)
def test_fuzzed_cai_dicts_never_crash(cai):
    try:
        cb.asarray(CaiObject(cai))
    except CLEAN:
        pass
    except OverflowError:
        pass


@pytest.mark.parametrize("stream", ["fast", 1.5, object(), [1]])
def test_streams_that_are_not_streams(stream):
    with pytest.raises(ValueError, match="stream"):
        cb.add(np.ones(2), np.ones(2), stream=stream)


# ---- concurrency -------------------------------------------------------------------------------


def test_adds_from_eight_threads():
    rng = np.random.default_rng(0)
    inputs = [(rng.standard_normal(1 << 18), rng.standard_normal(1 << 18)) for _ in range(8)]
    results = [None] * 8

    def work(i):
        a, b = inputs[i]
        for _ in range(5):
            results[i] = np.from_dlpack(cb.add(a, b))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (a, b), r in zip(inputs, results, strict=True):
        np.testing.assert_array_equal(r, a + b)


def test_large_cpu_adds_release_the_gil():
    a = np.ones(1 << 25, dtype=np.float32)
    out = np.empty_like(a)
    t0 = time.perf_counter()
    cb.add(a, a, out=out)
    alone = time.perf_counter() - t0

    gaps = []
    done = threading.Event()

    def ticker():
        last = time.perf_counter()
        while not done.is_set():
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
            time.sleep(0.0005)

    t = threading.Thread(target=ticker)
    t.start()
    time.sleep(0.01)
    for _ in range(3):
        cb.add(a, a, out=out)
    done.set()
    t.join()
    # Holding the GIL through an add would stall the ticker for the whole add.
    assert max(gaps) < max(alone * 0.6, 0.005), (max(gaps), alone)


@needs_torch
def test_torch_tensor_deleted_on_another_thread():
    a = cb.arange(1000, dtype="float32")
    t = torch.from_dlpack(a)
    box = [t]
    del t

    th = threading.Thread(target=box.clear)
    th.start()
    th.join()
    gc.collect()
    np.testing.assert_array_equal(a.to_numpy(), np.arange(1000, dtype=np.float32))
