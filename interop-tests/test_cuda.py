"""CUDA: device arrays, DLPack and CAI exchange with torch, cupy and numba, stream ordering,
lifetimes, and cubridge.add on foreign device pointers. Marked ``cuda``; skipped cleanly where no
GPU is present. Every value is compared with numpy (host copies) or torch."""

import gc
import json
import math
import os
import struct
import subprocess
import sys
import time
import warnings

import cubridge as cb
import numpy as np
import pytest
from conftest import (
    ALL_DTYPES,
    INT_NEAR_TIES,
    NEAR_TIES,
    NUMPY_DTYPES,
    _try_import,
    float_values,
    jax,
    rounded,
    run_child,
    sample,
    torch,
)
from matrix_libs import CAIOnly

cupy = _try_import("cupy")
numba_cuda = _try_import("numba.cuda")

HAS_GPU = cb.cuda.is_available() and torch is not None and torch.cuda.is_available()
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")]
needs_cupy = pytest.mark.skipif(cupy is None, reason="cupy is not installed")
two_gpus = pytest.mark.skipif(not HAS_GPU or cb.cuda.device_count() < 2, reason="needs two GPUs")

# Dtypes torch holds on CUDA, by numpy name (bfloat16 handled separately).
TORCH_CUDA = [d for d in NUMPY_DTYPES]


def to_torch(x, device="cuda"):
    """numpy array → torch tensor on the device (uint16/32/64 through int64)."""
    if x.dtype.name in ("uint16", "uint32", "uint64"):
        return torch.from_numpy(x.astype(np.int64)).to(getattr(torch, x.dtype.name)).to(device)
    return torch.from_numpy(np.ascontiguousarray(x)).to(device)


def to_host(t):
    """torch tensor → numpy (uint16/32/64 through int64)."""
    name = str(t.dtype).removeprefix("torch.")
    if name in ("uint16", "uint32", "uint64"):
        return t.to(torch.int64).cpu().numpy().astype(name)
    return t.cpu().numpy()


def spin(seconds, stream=None):
    """Keeps the torch current stream (or `stream`) busy on the GPU for about `seconds`."""
    cycles = int(seconds * torch.cuda.get_device_properties(0).clock_rate * 1000)
    if stream is None:
        torch.cuda._sleep(cycles)
    else:
        with torch.cuda.stream(stream):
            torch.cuda._sleep(cycles)


def settled_free():
    """Free device memory once queued work has run and what cubridge's pool, torch and cupy
    cache unused has gone back to the driver (a pool keeps freed memory for reuse)."""
    torch.cuda.synchronize()
    gc.collect()
    cb.cuda.empty_cache()
    torch.cuda.empty_cache()
    if cupy is not None:
        cupy.get_default_memory_pool().free_all_blocks()
    return cb.cuda.mem_info()[0]


def test_device_arrays_round_trip():
    ref = sample((3, 5), "float64")
    a = cb.asarray(ref, device="cuda")
    assert a.device == "cuda:0"
    np.testing.assert_array_equal(a.to_numpy(), ref)
    np.testing.assert_array_equal(a.to_device("cpu").to_numpy(), ref)
    np.testing.assert_array_equal(
        cb.zeros((4,), device="cuda:0").to_numpy(), np.zeros(4, np.float32)
    )
    np.testing.assert_array_equal(
        cb.full((2, 2), 7, dtype="int32", device="cuda").to_numpy(), np.full((2, 2), 7, np.int32)
    )
    np.testing.assert_array_equal(
        cb.arange(10, dtype="int64", device="cuda").to_numpy(), np.arange(10)
    )
    # A strided host source and a dtype change on the way in.
    np.testing.assert_array_equal(
        cb.asarray(ref.T[::-1], dtype="float32", device="cuda").to_numpy(),
        ref.T[::-1].astype(np.float32),
    )


def test_pinned_and_managed_arrays():
    for device, code in (("cuda_host", 3), ("cuda_managed", 13)):
        a = cb.arange(6, dtype="int32", device=device)
        assert a.__dlpack_device__() == (code, 0)
        np.testing.assert_array_equal(np.asarray(a), np.arange(6))  # buffer protocol
        assert np.asarray(a).ctypes.data == a.data_ptr


@pytest.mark.parametrize("device", ["cuda_host", "cuda_managed"])
def test_pinned_and_managed_arrays_export_in_place_to_the_cpu(device):
    """Host-accessible memory asked for on the CPU (numpy.from_dlpack(x, device="cpu") asks for
    dl_device=(1, 0)) is exported in place, labelled CPU, with or without copy=False;
    copy=True still copies."""
    ref = sample((4, 5), "float32", 1)
    a = cb.asarray(ref, device=device)
    n = np.from_dlpack(a, device="cpu")
    assert n.ctypes.data == a.data_ptr
    np.testing.assert_array_equal(n, ref)
    n[0, 0] = 42.0  # the same memory
    np.testing.assert_array_equal(a.to_device("cpu").to_numpy()[0, 0], 42.0)
    for kwargs in ({}, {"copy": False}, {"max_version": (1, 0)}):
        capsule = a.__dlpack__(dl_device=(1, 0), **kwargs)
        view = cb.from_dlpack(capsule)
        assert view.device == "cpu" and view.data_ptr == a.data_ptr
    t = a.T
    assert np.from_dlpack(t, device="cpu").ctypes.data == t.data_ptr
    np.testing.assert_array_equal(np.from_dlpack(t, device="cpu"), n.T)
    copied = np.from_dlpack(a, device="cpu", copy=True)
    assert copied.ctypes.data != a.data_ptr
    np.testing.assert_array_equal(copied, n)


def test_torch_and_cupy_read_cubridge_arrays_zero_copy():
    a = cb.arange(12, dtype="float32", device="cuda")
    t = torch.from_dlpack(a)
    assert t.device.type == "cuda" and t.data_ptr() == a.data_ptr
    assert torch.equal(t.cpu(), torch.arange(12, dtype=torch.float32))
    assert torch.as_tensor(_CaiOnly(a), device="cuda").data_ptr() == a.data_ptr  # torch via CAI
    if cupy is not None:
        c = cupy.asarray(a)  # through __cuda_array_interface__
        assert c.data.ptr == a.data_ptr
        d = cupy.from_dlpack(a)
        assert d.data.ptr == a.data_ptr
        np.testing.assert_array_equal(cupy.asnumpy(c), np.arange(12, dtype=np.float32))


def test_cuda_array_interface_fields():
    a = cb.zeros((4, 3), dtype="int16", device="cuda")
    cai = a.__cuda_array_interface__
    assert cai["shape"] == (4, 3) and cai["typestr"] == "<i2" and cai["version"] == 3
    assert cai["data"] == (a.data_ptr, False) and cai["strides"] is None
    assert cai["stream"] == 1  # the zeroing is queued on the legacy default stream
    pending = cb.add(a, a)
    assert pending.__cuda_array_interface__["stream"] == 1  # handed over via the legacy stream
    t = cb.from_dlpack(torch.zeros(3, 4, dtype=torch.int16, device="cuda").T)
    assert t.__cuda_array_interface__["strides"] == (2, 8)
    with pytest.raises(AttributeError):
        _ = cb.zeros(2).__cuda_array_interface__


def test_numpy_reads_device_array_through_a_host_copy():
    a = cb.arange(5, dtype="float64", device="cuda")
    n = np.from_dlpack(a, device="cpu")
    np.testing.assert_array_equal(n, np.arange(5.0))
    with pytest.raises(BufferError):
        a.__dlpack__(dl_device=(1, 0), copy=False)


@pytest.mark.parametrize("dtype", TORCH_CUDA)
def test_import_from_torch_and_cupy_zero_copy(dtype):
    ref = sample((4, 6), dtype)
    t = to_torch(ref)
    a = cb.from_dlpack(t)
    assert a.data_ptr == t.data_ptr() and a.device == "cuda:0"
    np.testing.assert_array_equal(a.to_numpy(), ref)
    if cupy is not None:
        c = cupy.asarray(ref)
        b = cb.from_dlpack(c)
        assert b.data_ptr == c.data.ptr
        np.testing.assert_array_equal(b.to_numpy(), ref)
        v = cb.asarray(_CaiOnly(c))  # CAI only
        assert v.data_ptr == c.data.ptr
        np.testing.assert_array_equal(v.to_numpy(), ref)


class _CaiOnly:
    """Exposes only another array's __cuda_array_interface__ (optionally as version 2)."""

    def __init__(self, arr, version=None):
        self._arr = arr
        self._version = version

    @property
    def __cuda_array_interface__(self):
        cai = dict(self._arr.__cuda_array_interface__)
        if self._version == 2:
            cai.pop("stream", None)
            cai["version"] = 2
        return cai


@needs_cupy
def test_cai_version_2_and_bad_dicts():
    c = cupy.arange(6, dtype=cupy.float64)
    v = cb.asarray(_CaiOnly(c, version=2))
    assert v.data_ptr == c.data.ptr
    np.testing.assert_array_equal(v.to_numpy(), np.arange(6.0))

    class Bad:
        def __init__(self, **changes):
            self.cai = dict(c.__cuda_array_interface__, **changes)

        @property
        def __cuda_array_interface__(self):
            return self.cai

    for changes, match in [
        ({"version": 4}, "version"),
        ({"stream": 0}, "stream 0"),
        ({"typestr": "<x9"}, "typestr"),
        ({"mask": c}, "mask"),
    ]:
        with pytest.raises((ValueError, TypeError), match=match):
            cb.asarray(Bad(**changes))


def test_an_interface_without_a_stream_is_ordered_after_the_legacy_stream():
    """JAX's CUDA array interface is version 2, without a stream, and JAX hands it over while its
    write may still be queued on JAX's own streams (blocking ones, which the legacy default
    stream waits for). A cubridge kernel on a non-blocking side stream must see the finished
    values: cubridge orders its stream after the legacy default stream for such an interface."""
    jax = _try_import("jax")
    try:
        gpu = jax.devices("gpu")[0] if jax is not None else None
    except RuntimeError:
        gpu = None
    if gpu is None:
        pytest.skip("jax has no GPU backend here")
    jnp = jax.numpy
    x = jax.device_put(np.ones(1 << 20, np.float32), gpu)

    @jax.jit
    def slow(a):  # about a thousand dependent kernels, then a known value
        a = jax.lax.fori_loop(0, 1000, lambda i, v: jnp.sin(v) * 0.5 + 1.0, a)
        return a * 0.0 + 3.0

    slow(x).block_until_ready()
    side = torch.cuda.Stream()
    for _ in range(3):
        y = slow(x)
        assert not y.is_ready(), "jax finished before the hand-over: no race to lose"
        cai = CAIOnly(y)
        assert cai.__cuda_array_interface__["version"] == 2
        z = cb.add(cai, 0.0, stream=side)
        side.synchronize()
        assert (torch.from_dlpack(z) == 3.0).all()


@pytest.mark.parametrize("dtype", TORCH_CUDA)
def test_add_torch_plus_cupy_into_torch_every_dtype(dtype):
    """The acceptance check: torch.from_dlpack(add(torch_a, cupy_b)) == a + b."""
    x, y = sample((5, 7), dtype, 1), sample((5, 7), dtype, 2)
    ta = to_torch(x)
    b = cupy.asarray(y) if cupy is not None else to_torch(y)
    r = cb.add(ta, b)
    assert r.device == "cuda:0"
    out = torch.from_dlpack(r)
    assert out.data_ptr() == r.data_ptr
    np.testing.assert_array_equal(to_host(out), x + y)
    if cupy is not None:
        assert cupy.asarray(r).data.ptr == r.data_ptr


def test_add_bfloat16_torch_on_both_sides():
    g = torch.Generator(device="cuda").manual_seed(0)
    a = (torch.randn(4096, device="cuda", generator=g) * 100).to(torch.bfloat16)
    b = torch.randn(4096, device="cuda", generator=g).to(torch.bfloat16)
    assert torch.equal(torch.from_dlpack(cb.add(a, b)), a + b)
    h = (torch.randn(4096, device="cuda", generator=g) * 100).to(torch.float16)
    ht = h.view(64, 64).T  # a strided float16 view
    assert torch.equal(torch.from_dlpack(cb.add(ht, ht.T)), ht + ht.T)
    assert torch.equal(torch.from_dlpack(cb.add(a, h)), a + h)  # -> float32


@pytest.mark.parametrize(
    "make",
    [
        lambda t: t.T,
        lambda t: t[1:, ::2],
        lambda t: t[:, :1].expand(-1, 6),
        lambda t: t[2],
        lambda t: t[:0],
    ],
    ids=["transposed", "sliced", "broadcast", "row", "empty"],
)
def test_add_strided_and_broadcast_torch(make):
    x = torch.arange(36, dtype=torch.float32, device="cuda").reshape(6, 6)
    y = torch.ones(6, 6, device="cuda") * 0.5
    a, b = make(x), make(y)
    got = torch.from_dlpack(cb.add(a, b))
    assert torch.equal(got, a + b)
    row = y[0, : a.shape[-1]] * 3  # broadcast a row over `a`
    assert torch.equal(torch.from_dlpack(cb.add(a, row)), a + row)


KERNEL_DTYPES = ["bool", "int8", "float16", "bfloat16", "float32", "float64", "complex128"]


def _random(shape, dtype, gen):
    t = torch.randn(shape, device="cuda", generator=gen, dtype=torch.float64) * 50
    if dtype == "bool":
        return t > 0
    if dtype == "complex128":
        return torch.complex(t, -t)
    return t.to(getattr(torch, dtype))


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize(
    "case",
    [
        "vector",
        "misaligned",
        "odd-length",
        "tile-a",
        "tile-b",
        "tile-both",
        "out-transposed",
        "column-broadcast",
        "3-d",
        "even-tile-a",
        "even-tile-b",
        "even-tile-both",
        "even-tile-a-row-broadcast",
        "even-tile-a-misaligned-b",
        "even-tile-b-misaligned-out",
        "even-strides-odd-cols",
        "pairs-tile-a",
        "pairs-tile-b",
        "pairs-tile-both",
        "pairs-tile-a-row-broadcast",
    ],
)
def test_every_add_kernel_variant(dtype, case):
    """Each kernel variant the host may choose (vectorized, scalar contiguous, strided, tiled;
    edges that are not multiples of a pack, an unroll chunk or a tile) against torch. The
    "even" cases add tiled layouts with an even number of columns (still no tile multiple), an
    operand broadcast along rows, and an operand or out one element off an aligned start; and
    slices with even strides over an odd number of rows and of columns. The "pairs" cases have
    even strides everywhere, which lets 2-byte dtypes move interior tiles in pairs."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    rows, cols = 67, 131  # edges that no tile or pack divides
    if case.startswith("pairs"):
        rows, cols = 130, 194  # interior tiles and edge tiles, all strides even
        a = (
            _random((cols, rows), dtype, gen).T
            if "tile-a" in case or "both" in case
            else (_random((rows, cols), dtype, gen))
        )
        b = (
            _random((cols, rows), dtype, gen).T
            if "tile-b" in case or "both" in case
            else (_random((rows, cols), dtype, gen))
        )
        if case.endswith("row-broadcast"):
            b = _random((1, cols), dtype, gen).expand(rows, cols)
        out = torch.empty((rows, cols), device="cuda", dtype=a.dtype)
    elif case == "even-strides-odd-cols":
        a = _random((130, 68), dtype, gen).T[:rows, :129]  # strides (1, 68)
        b = _random((rows, 130), dtype, gen)[:, :129]  # strides (130, 1)
        out = torch.empty((rows, 130), device="cuda", dtype=a.dtype)[:, :129]
    elif case.startswith("even"):
        cols = 130  # even, but not a multiple of a tile

        def shifted(shape):  # contiguous, one element past an aligned start
            return _random(rows * cols + 1, dtype, gen)[1:].view(shape)

        a = (
            _random((cols, rows), dtype, gen).T
            if "tile-a" in case
            else _random((rows, cols), dtype, gen)
        )
        b = (
            _random((cols, rows), dtype, gen).T
            if "tile-b" in case or "both" in case
            else (_random((rows, cols), dtype, gen))
        )
        if "both" in case:
            a = _random((cols, rows), dtype, gen).T
        if case.endswith("row-broadcast"):
            b = _random((1, cols), dtype, gen).expand(rows, cols)
        if case.endswith("misaligned-b"):
            b = shifted((rows, cols))
        out = (
            shifted((rows, cols))
            if case.endswith("misaligned-out")
            else torch.empty((rows, cols), device="cuda", dtype=a.dtype)
        )
    elif case in ("vector", "odd-length", "misaligned"):
        n = {"vector": 1 << 16, "odd-length": 1_000_003, "misaligned": 4099}[case]
        a, b = _random(n + 1, dtype, gen), _random(n + 1, dtype, gen)
        a, b = (a[1:], b[1:]) if case == "misaligned" else (a[:n], b[:n])
        out = torch.empty(n, device="cuda", dtype=a.dtype)
    elif case.startswith("tile") or case == "column-broadcast":
        a, b = _random((rows, cols), dtype, gen), _random((rows, cols), dtype, gen)
        if case in ("tile-a", "tile-both"):
            a = _random((cols, rows), dtype, gen).T
        if case in ("tile-b", "tile-both"):
            b = _random((cols, rows), dtype, gen).T
        if case == "column-broadcast":
            a = _random((rows, 1), dtype, gen).expand(rows, cols)
        out = torch.empty((rows, cols), device="cuda", dtype=a.dtype)
    elif case == "out-transposed":
        a, b = _random((rows, cols), dtype, gen), _random((rows, cols), dtype, gen)
        out = torch.empty((cols, rows), device="cuda", dtype=a.dtype).T
    else:
        a = _random((5, 6, 7), dtype, gen).permute(2, 0, 1)
        b = _random((7, 1, 6), dtype, gen)
        out = torch.empty((7, 5, 6), device="cuda", dtype=a.dtype)
    settled(lambda: cb.add(a, b, out=out))
    torch.cuda.synchronize()
    assert torch.equal(out, a + b), f"{case} {dtype}"


def settled(call):
    """Runs `call` twice, waiting between for kernels compiling in the background (a tiled
    kernel that neither the build shipped nor the disk cache held: the first call runs the
    strided one), so that the second runs the kernel that later calls take."""
    call()
    cb.cuda.wait_for_compiles()
    return call()


SCALARS = {
    "bool": True,
    "int8": -3,
    "float16": 0.7,
    "bfloat16": 0.7,
    "float32": 0.7,
    "float64": 0.7,
    "complex128": complex(1.5, -2.0),
}


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize(
    "case",
    [
        "vector",
        "misaligned",
        "odd-length",
        "tiled",
        "tiled-even",
        "3-d",
        "broadcast",
        "out-transposed",
        "in-place",
        "scalar-first",
    ],
)
def test_python_scalar_operand_on_every_kernel_variant(dtype, case):
    """A Python scalar beside a CUDA array goes to the kernel by value, in the array's dtype (the
    Array API's rule), on each layout the host may choose a kernel for. The reference is torch
    adding a 0-d tensor of that dtype, i.e. the scalar rounded to the dtype first."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    value = SCALARS[dtype]
    rows, cols = 67, 131
    a = {
        "vector": lambda: _random(1 << 16, dtype, gen),
        "misaligned": lambda: _random(4100, dtype, gen)[1:],
        "odd-length": lambda: _random(1_000_003, dtype, gen),
        "tiled": lambda: _random((cols, rows), dtype, gen).T,
        "tiled-even": lambda: _random((194, 130), dtype, gen).T,  # pairs for 2-byte dtypes
        "3-d": lambda: _random((5, 6, 7), dtype, gen).permute(2, 0, 1),
        "broadcast": lambda: _random((rows, 1), dtype, gen).expand(rows, cols),
        "out-transposed": lambda: _random((rows, cols), dtype, gen),
        "in-place": lambda: _random((rows, cols), dtype, gen),
        "scalar-first": lambda: _random((rows, cols), dtype, gen),
    }[case]()
    want = a + torch.tensor(value, dtype=a.dtype, device="cuda")
    if case == "out-transposed":
        out = torch.empty(a.shape[::-1], device="cuda", dtype=a.dtype).T
        assert settled(lambda: cb.add(a, value, out=out)) is out
    elif case == "in-place":
        out = a
        cb.add(a, value, out=a)
    elif case == "scalar-first":
        out = torch.from_dlpack(settled(lambda: cb.add(value, a)))
    else:
        out = torch.from_dlpack(settled(lambda: cb.add(a, value)))
    torch.cuda.synchronize()
    assert out.dtype == a.dtype and out.shape == want.shape
    assert torch.equal(out, want), f"{case} {dtype}"


def test_python_scalar_operand_does_not_wait_for_the_device():
    """`cb.add(t, 1.0)` passes the scalar to the kernel by value: no allocation and no upload,
    so the call returns while the stream is still busy with half a second of earlier work (an
    upload from pageable memory would wait for it), and the kernel still sees the value."""
    a = torch.ones(N, device="cuda")
    out = torch.empty(N, device="cuda")
    cb.add(a, 2.0, out=out)  # loads the kernels
    torch.cuda.synchronize()
    spin(0.5)  # the legacy default stream, which the add below also runs on
    start = time.perf_counter()
    cb.add(a, 4.0, out=out)
    r = cb.add(a, 8.0)
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    assert elapsed < 0.2, f"the calls waited {elapsed:.3f} s for the device"
    assert torch.equal(out, torch.full((N,), 5.0, device="cuda"))
    assert torch.equal(torch.from_dlpack(r), torch.full((N,), 9.0, device="cuda"))
    # On a stream of the caller's own too.
    side = torch.cuda.Stream()
    spin(0.5, side)
    start = time.perf_counter()
    cb.add(a, -1.0, out=out, stream=side.cuda_stream)
    elapsed = time.perf_counter() - start
    side.synchronize()
    assert elapsed < 0.2, f"the call waited {elapsed:.3f} s for the device"
    assert torch.equal(out, torch.zeros(N, device="cuda"))


def test_python_scalar_errors_on_the_device():
    i = torch.zeros(4, dtype=torch.int32, device="cuda")
    with pytest.raises(TypeError, match="int32 and a Python float"):
        cb.add(i, 0.5)
    with pytest.raises(TypeError, match="bool and a Python int"):
        cb.add(torch.zeros(4, dtype=torch.bool, device="cuda"), 1)
    with pytest.raises(ValueError, match="shape"):
        cb.add(i, 1, out=torch.zeros(5, dtype=torch.int32, device="cuda"))
    with pytest.raises(OverflowError, match="out of bounds for int32"):
        cb.add(i, 1 << 70)
    with pytest.raises(OverflowError, match="out of bounds for int32"):
        cb.add(i, 2**31)
    with pytest.raises(OverflowError, match="out of bounds for uint8"):
        cb.add(torch.zeros(4, dtype=torch.uint8, device="cuda"), -1)


@pytest.mark.parametrize("form", ["scalar", "0-d"])
@pytest.mark.parametrize(
    "da,ds",
    [(d, d) for d in NUMPY_DTYPES]
    + [("float32", "float64"), ("int8", "int64"), ("uint8", "int8"), ("float16", "float32")],
)
def test_numpy_scalar_beside_a_device_array(da, ds, form):
    """A numpy scalar or 0-d numpy array beside a CUDA array is a value of its own dtype, as
    in CuPy and torch (not a host array on another device), promoted as numpy promotes it."""
    a = sample((5, 7), da, 1)
    s = np.asarray(sample((1,), ds, 2)[0])
    if form == "scalar":
        s = s[()]
    x = cb.asarray(a, device="cuda")
    want = a + s
    for r in (cb.add(x, s), cb.add(s, x)):
        assert r.device == "cuda:0"
        got = r.to_numpy()
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    if want.dtype == a.dtype:
        cb.add(x, s, out=x)
        np.testing.assert_array_equal(x.to_numpy(), want)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_values_reach_the_device_rounded_once(dtype):
    """full, asarray and add's Python scalars convert on the host before the device sees the
    value: each rounds once into float16 and bfloat16, as on the CPU."""
    values = NEAR_TIES[dtype] + INT_NEAR_TIES[dtype]
    want = [rounded(v, dtype) for v in values]
    got = cb.asarray(values, dtype=dtype, device="cuda")
    np.testing.assert_array_equal(float_values(got.to_device("cpu")), want)
    zero = cb.zeros((1,), dtype=dtype, device="cuda")
    for v, w in zip(values, want, strict=True):
        for a in (cb.full((2,), v, dtype=dtype, device="cuda"), cb.add(zero, v)):
            np.testing.assert_array_equal(float_values(a.to_device("cpu")), [w] * a.shape[0])


def test_arange_and_sequences_on_the_device_match_numpy():
    """arange is made on the host and copied; sequences may hold device arrays (0-d or not)."""
    for args, dtype in (
        ((0, 1, 0.1), "float16"),
        ((0, 10, 0.1), "int8"),
        ((2**63, 2**64 - 1, 2**61), None),
    ):
        got = cb.arange(*args, dtype=dtype, device="cuda").to_numpy()
        want = (
            np.array(range(*args), dtype=np.uint64)
            if dtype is None
            else np.arange(*args, dtype=dtype)
        )
        np.testing.assert_array_equal(got, want, strict=True)
    t = torch.arange(4, dtype=torch.float64, device="cuda")
    got = cb.asarray([t, [torch.tensor(7.0, device="cuda")] * 4, range(4)], device="cuda")
    assert got.dtype == "float64" and got.device == "cuda:0"
    np.testing.assert_array_equal(got.to_numpy(), [[0, 1, 2, 3], [7] * 4, [0, 1, 2, 3]])


# The casts on the device (asarray(x, dtype=) of a device array), against numpy's cast of the
# same values. numpy has no bfloat16: a bfloat16 source holds values exact in it (read as
# float64), and a bfloat16 result is compared with `rounded`, the exact rounding.
def _kind(dtype):
    if dtype.startswith(("int", "uint")):
        return "int"
    return {"bool": "bool", "complex64": "complex", "complex128": "complex"}.get(dtype, "float")


def _held(value, dtype):
    """A real `value` as the floating `dtype` holds it (bfloat16: exactly rounded)."""
    if dtype == "bfloat16":
        return rounded(value, "bfloat16")
    with np.errstate(all="ignore"):
        return float(np.float64(value).astype(dtype))


_FLOATS = [0.0, -0.0, 0.5, 1.9, 2.5, -1.9, -2.5, 100.75, -100.75, 127.9, -128.9, 255.5, 1e4 + 0.5,
           65504.0, 2**31 - 0.5, -(2**31) - 0.5, 2**32 - 1.5, 2**53 + 2, -(2**63), 2**63 + 2**40,
           2**64 - 2**11, 1 + 2**-11 + 2**-23, 65520 - 2**-8, 1 + 2**-8 + 2**-23, 1 + 2**-24 + 2**-40,
           -(1 + 2**-24 + 2**-45), 1e-45, 3e-39, 5e-324, 1e5, 3.4e38, 3.5e38, 1e300]  # fmt: skip
_FLOATS += NEAR_TIES["float16"] + NEAR_TIES["bfloat16"]
_SPECIALS = [math.inf, -math.inf, math.nan]


def _cast_values(src, dst):
    """Python values of dtype `src` (as it holds them) whose cast into `dst` numpy defines:
    integers and bool anywhere, floats (and complex numbers' real parts) into integer types only
    where they truncate into the target's range."""
    if src == "bool":
        return [False, True]
    if _kind(src) == "int":
        info = np.iinfo(src)
        ties = INT_NEAR_TIES["float16"] + INT_NEAR_TIES["bfloat16"]
        vs = [info.min, info.min + 1, info.max, info.max - 1, 0, 1, -1, -2, 100, -129, 255, 256]
        return [v for v in vs + ties + [2**31, 2**53 + 1, 2**63 + 1] if info.min <= v <= info.max]
    part = "float64" if src == "complex128" else "float32" if src == "complex64" else src
    reals = [_held(v, part) for v in _FLOATS + _SPECIALS]
    if _kind(dst) == "int":
        info = np.iinfo(dst)
        reals = [r for r in reals if math.isfinite(r) and info.min <= math.trunc(r) <= info.max]
    if _kind(src) == "float":
        return reals
    imags = [_held(v, part) for v in [0.0, -0.0, 1.5, -3.25, 2**-30, math.nan, math.inf]]
    values = [complex(r, imags[k % len(imags)]) for k, r in enumerate(reals)]
    return values + [complex(0.0, 1.0), complex(-0.0, 0.0), complex(0.0, math.nan)]


def _cast_source(src, dst, shape):
    """A host array of `shape` cycling through `_cast_values(src, dst)` (bfloat16: a float64
    array of its values) and the same on the device."""
    values = _cast_values(src, dst)
    host = np.resize(np.asarray(values, dtype="float64" if src == "bfloat16" else src), shape)
    if src == "bfloat16":
        return host, torch.from_numpy(host).to(torch.bfloat16).cuda()
    return host, torch.from_dlpack(cb.asarray(host, device="cuda"))


def _numpy_cast(host, src, dst):
    """numpy's cast of a host source (bfloat16 results: each real value rounded exactly)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
        if dst != "bfloat16":
            return host.astype(dst)
        reals = np.real(host)
        if src == "bool" or _kind(src) == "int":
            return np.asarray([rounded(int(v), dst) for v in reals.flat]).reshape(host.shape)
        return np.asarray([rounded(float(v), dst) for v in reals.flat]).reshape(host.shape)


# Views of a (66, 130) source, each a variant of the cast's kernel: vectorized (a flat run of
# packs with a tail), scalar (misaligned), tiled (transposed, in pairs where both dtypes have 2
# bytes) and strided.
_CAST_VIEWS = {
    "contiguous": lambda x: x.reshape(-1),
    "misaligned": lambda x: x.reshape(-1)[1:],
    "transposed": lambda x: x.T,
    "strided": lambda x: x[:, ::3],
}


def _check_cast(src, dst, view):
    host, dev = _cast_source(src, dst, (66, 130))
    host, dev = _CAST_VIEWS[view](host), _CAST_VIEWS[view](dev)
    got = cb.asarray(dev, dtype=dst)
    assert (got.dtype, got.device, got.shape) == (dst, "cuda:0", host.shape)
    want = _numpy_cast(host, src, dst)
    if dst == "bfloat16":
        np.testing.assert_array_equal(float_values(got.to_device("cpu")), want, strict=True)
    else:
        np.testing.assert_array_equal(got.to_numpy(), want, strict=True)


@pytest.mark.parametrize("dst", ALL_DTYPES)
@pytest.mark.parametrize("src", ALL_DTYPES)
def test_casts_on_the_device_match_numpy(src, dst):
    """Every dtype into every other on the device gives numpy's values: floats and integers
    into float16 and bfloat16 rounded once from the exact value (float64 values next to ties),
    floats truncated into integers, integers wrapped, bool from nonzero, complex numbers into
    real types by their real part."""
    _check_cast(src, dst, "contiguous")


@pytest.mark.parametrize("view", ["misaligned", "transposed", "strided"])
@pytest.mark.parametrize("src", ALL_DTYPES)
def test_casts_and_copies_of_views_on_the_device(src, view):
    """Misaligned, transposed and strided sources cast (into float16, bfloat16, int32 and
    complex128) and copied (into their own dtype: a contiguous copy) on the device."""
    for dst in dict.fromkeys([src, "float16", "bfloat16", "int32", "complex128"]):
        _check_cast(src, dst, view)


def test_a_cast_on_the_device_waits_for_nothing_and_follows_its_source():
    """asarray(x, dtype=) of a CUDA array copied x to the host, converted it there and copied it
    back: the host waited for all of x's pending work (0.3 s here), and a 2^24 float32 cast took
    53 ms (torch: 48 us). It is a kernel now, queued after the work that writes x, on the
    legacy default stream or behind a torch side stream."""
    x = torch.zeros(1 << 20, device="cuda")
    cb.asarray(x, dtype="float16")  # loads the kernel
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side):
        torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            spin(0.3)
            x.fill_(2.5)
            start = time.perf_counter()
            got = cb.asarray(x, dtype="float16")
            took = time.perf_counter() - start
        still_busy = not stream.query()
        torch.cuda.synchronize()
        assert took < 0.1 and still_busy, f"the cast waited {took:.3f} s"
        assert torch.equal(torch.from_dlpack(got), torch.full_like(x, 2.5, dtype=torch.float16))


def test_tiled_add_with_promotion():
    gen = torch.Generator(device="cuda").manual_seed(3)
    a = _random((300, 200), "float16", gen).T  # transposed float16
    b = _random((200, 300), "float32", gen)
    assert torch.equal(torch.from_dlpack(settled(lambda: cb.add(a, b))), a.float() + b)
    c = _random((300, 200), "bfloat16", gen).T
    d = _random((300, 200), "float64", gen).T  # both transposed: out takes their order
    assert torch.equal(torch.from_dlpack(cb.add(c, d)), c.double() + d)


def test_add_beyond_32_bit_indexing():
    """2^31 + 5 int8 elements: the 64-bit variants (contiguous, then strided over a 2-D view)."""
    n = (1 << 31) + 5
    a = torch.ones(n, dtype=torch.int8, device="cuda")
    b = torch.full((n,), 2, dtype=torch.int8, device="cuda")
    b[-1] = 5
    out = torch.empty(n, dtype=torch.int8, device="cuda")
    cb.add(a, b, out=out)
    torch.cuda.synchronize()
    assert int(out[0]) == 3 and int(out[-1]) == 6 and int(out[n // 2]) == 3
    assert int((out == 3).sum()) == n - 1
    # Strided: every other element of a 2-D view, so the plan cannot collapse to one dimension.
    rows = 1 << 16
    a2 = a[: rows * (1 << 15)].view(rows, 1 << 15)[:, ::2]
    b2 = b[: rows * (1 << 15)].view(rows, 1 << 15)[:, 1::2]
    out2 = out[: rows * (1 << 14)].view(rows, 1 << 14)
    cb.add(a2, b2, out=out2)
    torch.cuda.synchronize()
    assert torch.equal(out2, a2 + b2)
    del a, b, out, a2, b2, out2
    torch.cuda.empty_cache()


@needs_cupy
def test_add_negative_strides_cupy():
    x = cupy.arange(24, dtype=cupy.int32).reshape(4, 6)
    a, b = x[::-1, ::-2], x[:, ::2]
    # CuPy 14's DLPack export mangles negative strides (they come out as 2**62 - k); cubridge
    # rejects that descriptor and reads the same memory through CuPy's CUDA array interface.
    view = cb.asarray(a)
    assert view.strides == (-6, -2) and view.data_ptr == a.data.ptr
    r = cb.add(a, b)
    np.testing.assert_array_equal(cupy.asnumpy(cupy.asarray(r)), cupy.asnumpy(a + b))


def test_promotion_on_the_device():
    a = torch.arange(6, dtype=torch.int8, device="cuda")
    b = torch.arange(6, dtype=torch.int32, device="cuda")
    r = torch.from_dlpack(cb.add(a, b))
    assert r.dtype == torch.int32 and torch.equal(r, a.int() + b)
    h = torch.ones(3, dtype=torch.float16, device="cuda")
    f = torch.ones(3, dtype=torch.float32, device="cuda")
    assert torch.from_dlpack(cb.add(h, f)).dtype == torch.float32
    with pytest.raises(TypeError, match="int32.*float32"):
        cb.add(b, f[:1])


def test_foreign_out_written_in_place_and_aliasing():
    a = torch.arange(8, dtype=torch.float32, device="cuda")
    b = torch.full((8,), 2.0, device="cuda")
    out = torch.empty(8, device="cuda")
    assert cb.add(a, b, out=out) is out  # out itself is the result, as in numpy and torch
    assert torch.equal(out, a + b)
    expected = a + b
    cb.add(a, b, out=a)  # in place
    assert torch.equal(a, expected)
    if cupy is not None:
        c_out = cupy.zeros(8, dtype=cupy.float32)
        cb.add(a, b, out=c_out)
        np.testing.assert_array_equal(cupy.asnumpy(c_out), (expected + b).cpu().numpy())
    cb_out = cb.empty((8,), device="cuda")
    assert cb.add(a, b, out=cb_out) is cb_out


def test_errors_on_the_device():
    with pytest.raises(ValueError, match="different devices"):
        cb.add(torch.ones(3, device="cuda"), np.ones(3, np.float32))
    with pytest.raises(ValueError, match="stream 0"):
        cb.add(torch.ones(3, device="cuda"), torch.ones(3, device="cuda"), stream=0)
    with pytest.raises(ValueError, match="does not exist"):
        cb.zeros(2, device=f"cuda:{cb.cuda.device_count()}")
    with pytest.raises(ValueError, match="stream 0"):
        cb.arange(3, device="cuda").__dlpack__(stream=0)


def test_stream_arguments():
    a = torch.ones(1000, device="cuda")
    s = torch.cuda.Stream()
    for stream in (s, s.cuda_stream, cb.cuda.Stream()):
        r = cb.add(a, a, stream=stream)
        torch.cuda.synchronize()
        assert torch.equal(torch.from_dlpack(r), a + a)
    if cupy is not None:
        r = cb.add(a, a, stream=cupy.cuda.Stream())
        torch.cuda.synchronize()
        assert torch.equal(torch.from_dlpack(r), a + a)
    with pytest.raises(ValueError, match="stream must be"):
        cb.add(a, a, stream="fast")


N = 1 << 22


def test_reader_on_another_stream_waits_for_a_side_stream_producer():
    """torch writes on a side stream behind a long kernel; cubridge reads at once on its own
    stream. Without the ordering edge the kernel would read the zeros still there."""
    a = torch.zeros(N, device="cuda")
    b = torch.ones(N, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    mine = cb.cuda.Stream()
    with torch.cuda.stream(side):
        spin(0.2)
        a.fill_(2.0)
        r = cb.add(a, b, stream=mine)  # torch's current stream is `side`
    mine.synchronize()
    assert torch.equal(torch.from_dlpack(r), torch.full((N,), 3.0, device="cuda"))


@needs_cupy
def test_reader_waits_for_a_cupy_side_stream_producer():
    busy = cupy.RawKernel(
        r"""extern "C" __global__ void busy(long long cycles) {
            long long t0 = clock64(); while (clock64() - t0 < cycles) {} }""",
        "busy",
    )
    a = cupy.zeros(N, dtype=cupy.float32)
    cupy.cuda.Device().synchronize()
    side = cupy.cuda.Stream(non_blocking=True)
    mine = cb.cuda.Stream()
    with side:
        busy((1,), (1,), (np.int64(300_000_000),))
        a.fill(5.0)
        r = cb.add(a, a, stream=mine)
    mine.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(cupy.asarray(r)), np.full(N, 10.0, np.float32))


@needs_cupy
def test_a_kept_cupy_view_orders_readers_after_its_side_stream_producer():
    """from_dlpack hands CuPy the legacy default stream to order its pending work before, and
    the view records that stream as its writer with no event yet: a reader on a non-blocking
    stream must still wait for the producer's work."""
    busy = cupy.RawKernel(
        r"""extern "C" __global__ void busy(long long cycles) {
            long long t0 = clock64(); while (clock64() - t0 < cycles) {} }""",
        "busy",
    )
    a = cupy.zeros(N, dtype=cupy.float32)
    cupy.cuda.Device().synchronize()
    side = cupy.cuda.Stream(non_blocking=True)
    mine = cb.cuda.Stream()
    with side:
        busy((1,), (1,), (np.int64(300_000_000),))
        a.fill(5.0)
        v = cb.from_dlpack(a)
    r = cb.add(v, v, stream=mine)
    mine.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(cupy.asarray(r)), np.full(N, 10.0, np.float32))


def test_a_kept_torch_view_orders_readers_after_its_side_stream_producer():
    """from_dlpack of a torch tensor takes it through the exchange table with torch's current
    stream as its writer (no ordering call at import): a reader on another stream waits."""
    a = torch.zeros(N, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    mine = cb.cuda.Stream()
    with torch.cuda.stream(side):
        spin(0.1)
        a.fill_(5.0)
        v = cb.from_dlpack(a)
    r = cb.add(v, v, stream=mine)
    mine.synchronize()
    assert torch.equal(torch.from_dlpack(r), torch.full((N,), 10.0, device="cuda"))


@needs_cupy
def test_cupy_managed_memory_comes_in_zero_copy():
    """CuPy's managed arrays: CuPy's device is not asked (it is CUDA memory, managed or not),
    and CuPy orders its work before the stream it is handed."""
    with cupy.cuda.using_allocator(cupy.cuda.malloc_managed):
        m = cupy.arange(6, dtype=cupy.float32) * 2
    v = cb.from_dlpack(m)
    assert v.data_ptr == m.data.ptr
    np.testing.assert_array_equal(v.to_numpy(), np.arange(6, dtype=np.float32) * 2)


def test_default_stream_is_the_producers_current_stream():
    a = torch.ones(N, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        spin(0.1)
        a.mul_(4.0)
        r = cb.add(a, a)  # stream=None: torch's current stream, through the exchange table
        if hasattr(type(a), "__dlpack_c_exchange_api__"):
            assert r.stream == side.cuda_stream
        else:  # older torch: the legacy default stream, ordered after `side` by __dlpack__
            assert r.stream == 1
        t = torch.from_dlpack(r)
        assert torch.equal(t, torch.full((N,), 8.0, device="cuda"))


def test_pending_result_consumed_by_torch_and_cupy_at_once():
    a = torch.ones(N, device="cuda")
    torch.cuda.synchronize()
    mine = cb.cuda.Stream()
    with torch.cuda.stream(torch.cuda.ExternalStream(mine.ptr)):
        spin(0.2)  # queue a long kernel on cubridge's stream ...
    r = cb.add(a, a, stream=mine)  # ... so the result is still pending when read below
    assert r.stream == mine.ptr
    t = torch.from_dlpack(r) * 1  # torch's default stream waits for `mine`
    expected = np.full(N, 2.0, np.float32)
    np.testing.assert_array_equal(t.cpu().numpy(), expected)
    if cupy is not None:
        c = cupy.asarray(r) * 1  # CAI v3 stream: cupy orders its stream after `mine`
        np.testing.assert_array_equal(cupy.asnumpy(c), expected)


def test_legacy_stream_result_read_on_other_streams_waits_for_its_kernel():
    """A result written on the legacy default stream carries no event until a reader on another
    stream needs one. Such readers still wait for the kernel, queued here behind half a second
    of work: a cubridge add on a stream of its own (whose other operand brings no ordering of
    its own), and a consumer that asks __dlpack__ for its stream. Nothing in the timed part may
    wait for the device itself: everything is allocated and every kernel loaded beforehand, and
    the results first hold other values, which a reader that did not wait would see."""
    a, b = torch.ones(N, device="cuda"), torch.full((N,), 4.0, device="cuda")
    one = cb.full((N,), 1.0, device="cuda")
    r1, r2, s = (cb.empty((N,), dtype="float32", device="cuda") for _ in range(3))
    t = torch.empty(N, device="cuda")
    mine = cb.cuda.Stream()
    side = torch.cuda.Stream()
    cb.add(b, b, out=r1)  # 8.0
    cb.add(b, b, out=r2)  # 8.0
    cb.add(r1, one, out=s, stream=mine)
    mine.synchronize()
    torch.cuda.synchronize()

    spin(0.5)  # torch's current stream is the legacy default stream
    cb.add(a, a, out=r1)  # 2.0, behind the spin
    assert r1.stream == 1
    cb.add(r1, one, out=s, stream=mine)
    mine.synchronize()
    assert torch.equal(torch.from_dlpack(s), torch.full((N,), 3.0, device="cuda"))

    spin(0.5)
    cb.add(a, b, out=r2)  # 5.0, behind the spin
    capsule = r2.__dlpack__(stream=side.cuda_stream)
    with torch.cuda.stream(side):
        torch.mul(torch.utils.dlpack.from_dlpack(capsule), 1, out=t)
    side.synchronize()
    assert torch.equal(t, torch.full((N,), 5.0, device="cuda"))


@pytest.mark.whole_gpu
def test_dlpack_refusals_of_a_device_array():
    """A stream of another type is a TypeError; a device that does not exist, or one of a type
    cubridge has not, is the export's BufferError."""
    a = cb.zeros(3, device="cuda")
    for stream in (object(), 1.5):
        with pytest.raises(TypeError, match="stream"):
            a.__dlpack__(stream=stream)
    for device in [(2, cb.cuda.device_count()), (4, 0)]:
        with pytest.raises(BufferError):
            a.__dlpack__(dl_device=device)


@pytest.mark.whole_gpu
def test_gigabyte_export_is_freed_after_both_sides_let_go():
    # torch's add_ and CuPy's import load their kernels on first use, which takes device memory
    # they keep: done once before the baseline, so that only the export is measured.
    small = cb.zeros((16,), device="cuda")
    torch.from_dlpack(small).add_(1)
    if cupy is not None:
        cupy.asarray(small)
    del small
    free0 = settled_free()
    a = cb.zeros((1 << 28,), dtype="float32", device="cuda")  # 1 GiB
    t = torch.from_dlpack(a)
    c = cupy.asarray(a) if cupy is not None else None
    del a
    held = settled_free()
    assert free0 - held >= (1 << 30) - (64 << 20), "the export should still hold 1 GiB"
    t.add_(1)
    torch.cuda.synchronize()
    del t, c
    free1 = settled_free()
    assert abs(free1 - free0) < (64 << 20), (free0, free1)


@pytest.mark.whole_gpu
def test_round_trips_keep_device_memory_flat():
    base = cb.zeros((1024,), device="cuda")
    free0 = settled_free()
    for i in range(100_000):
        t = torch.from_dlpack(base)
        back = cb.from_dlpack(t)
        if i % 1000 == 0:
            fresh = cb.empty((4096,), device="cuda")
            torch.from_dlpack(fresh)
            del fresh
        del t, back
    free1 = settled_free()
    assert abs(free1 - free0) < (16 << 20), (free0, free1)


def test_producer_kept_alive_by_the_view():
    t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    v = cb.from_dlpack(t)
    ptr = t.data_ptr()
    del t
    gc.collect()
    torch.cuda.empty_cache()
    assert v.data_ptr == ptr
    np.testing.assert_array_equal(v.to_numpy()[:5], np.arange(5, dtype=np.float32))


def test_operands_are_held_while_the_kernel_waits_and_released_after_without_another_call():
    """add keeps a foreign operand alive while its kernel is queued behind other work, and lets
    it go soon after the kernel has run, though no later cubridge call comes to release it."""
    import weakref

    n = 1 << 20
    for _attempt in range(3):
        x = CAIOnly(torch.full((n,), 1.5, device="cuda"))
        out = torch.empty(n, device="cuda")
        alive = weakref.ref(x)
        torch.cuda.synchronize()
        start = time.monotonic()
        spin(1.0)  # the kernel queues behind a second of work on torch's current stream
        cb.add(x, x, out=out)
        del x
        gc.collect()
        held = alive() is not None
        # Only a check made while the spin still ran says anything: on a loaded host (parallel
        # workers, background compiles) this thread may not run again for a while.
        if time.monotonic() - start < 0.5:
            break
        torch.cuda.synchronize()
    else:
        pytest.fail("the test thread never ran within 0.5 s of queuing the kernel")
    assert held, "an operand was dropped while its kernel was still queued"
    torch.cuda.synchronize()
    deadline = time.monotonic() + 5
    while alive() is not None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert alive() is None, "an operand was still held 5 s after its kernel ran"
    assert torch.equal(out, torch.full((n,), 3.0, device="cuda"))


@pytest.mark.whole_gpu
def test_deleter_runs_on_another_thread():
    import threading

    free0 = settled_free()
    holder = [torch.from_dlpack(cb.zeros((1 << 26,), device="cuda"))]  # 256 MiB, torch's alone
    assert free0 - cb.cuda.mem_info()[0] >= (256 << 20) - (32 << 20)

    def drop():
        holder.clear()  # the last reference goes on this thread
        gc.collect()

    t = threading.Thread(target=drop)
    t.start()
    t.join()
    assert abs(settled_free() - free0) < (32 << 20)


def test_interpreter_exits_cleanly_with_live_exports():
    code = (
        "import cubridge as cb, torch\n"
        "a = cb.arange(1000, device='cuda')\n"
        "t = torch.from_dlpack(a)\n"
        "cap = cb.zeros((10,), device='cuda').__dlpack__()\n"
        "r = cb.add(t, t)\n"
        "keep = [a, t, cap, r]\n"
        "print('ok')\n"
    )
    done = run_child(code)
    assert done.stdout.strip() == "ok" and "Error" not in done.stderr


def test_operands_still_queued_at_exit_are_released_before_the_interpreter_goes():
    # Each line in one write: the release runs on cubridge's thread, which may take the GIL
    # between print's write of a word and of its newline.
    code = (
        "import cubridge as cb, sys, torch\n"
        "def say(word):\n"
        "    sys.stdout.write(word + '\\n')\n"
        "    sys.stdout.flush()\n"
        "class Cai:\n"
        "    def __init__(self, t):\n"
        "        self.t = t\n"
        "        self.__cuda_array_interface__ = t.__cuda_array_interface__\n"
        "    def __del__(self):\n"
        "        say('released')\n"
        "out = torch.empty(1 << 20, device='cuda')\n"
        "torch.cuda.synchronize()\n"
        "torch.cuda._sleep(int(0.3 * torch.cuda.get_device_properties(0).clock_rate * 1000))\n"
        "cb.add(Cai(torch.ones(1 << 20, device='cuda')), 1.0, out=out)\n"
        "say('queued')\n"
    )
    done = run_child(code)
    assert done.stdout.split() == ["queued", "released"], (done.stdout, done.stderr)
    assert "Error" not in done.stderr


@pytest.mark.skipif(numba_cuda is None, reason="numba is not installed")
def test_numba_device_arrays_through_cai():
    d = numba_cuda.to_device(np.arange(10, dtype=np.float64))
    a = cb.asarray(d)
    assert a.data_ptr == d.__cuda_array_interface__["data"][0]
    r = cb.add(a, a)
    back = numba_cuda.as_cuda_array(r)
    np.testing.assert_array_equal(back.copy_to_host(), np.arange(10) * 2.0)


def test_kernels_are_cached_on_disk(tmp_path):
    code = (
        "import cubridge as cb, torch\n"
        "a = torch.ones(4, dtype=torch.int16, device='cuda')\n"
        "b = torch.ones(4, dtype=torch.int32, device='cuda')\n"
        "print(torch.from_dlpack(cb.add(a, b)).tolist())\n"
    )
    env = dict(os.environ, CUBRIDGE_CACHE_DIR=str(tmp_path))
    first = run_child(code, env)
    assert first.stdout.strip() == "[2, 2, 2, 2]"
    cached = sorted(p.name for p in tmp_path.iterdir())
    # int16 + int32 is not among the kernels shipped in a wheel: it is compiled, to machine code
    # for this device, and cached.
    major, minor = torch.cuda.get_device_capability()
    assert cached and all(n.endswith(f".{major}{minor}.bin") for n in cached), cached
    mtimes = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    second = run_child(code, env)
    assert second.stdout.strip() == "[2, 2, 2, 2]"
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == mtimes


_SHIPPED_CHILD = r"""
import json, sys, torch, cubridge as cb
failures = []
WIDE = {torch.uint16: torch.int32, torch.uint32: torch.int64, torch.uint64: torch.int64}
def check(what, got, a, b):
    wide = WIDE.get(a.dtype)
    if wide is not None:  # torch adds these unsigned types only on the CPU: compare widened
        a, b, got = a.to(wide), b.to(wide), torch.from_dlpack(got).to(wide)
    wider = torch.promote_types(a.dtype, b.dtype)
    want = (a.to(wider) + b.to(wider)) if a.dtype != b.dtype else (a + b if a.dtype != torch.bool else a | b)
    got = torch.from_dlpack(got)
    if got.dtype != want.dtype or not torch.equal(got.cpu(), want.cpu()):
        failures.append(what)
g = torch.Generator(device="cuda").manual_seed(0)
def sample(dtype):
    x = torch.randint(0, 50, (96, 96), generator=g, device="cuda")
    return (x % 2).bool() if dtype == torch.bool else x.to(dtype)
names = sys.argv[1].split(",")
for name in names:
    a, b = (getattr(torch, n) for n in name.split("+"))
    x, y = sample(a), sample(b)
    check(name, cb.add(x, y), x, y)
    check(name + " transposed", cb.add(x.T, y), x.T, y)
    if a == b:
        s = True if a == torch.bool else 3
        check(name + " scalar", cb.add(x, s), x, torch.full_like(x, s))
        # A strided source is copied into a contiguous array on its device, then to the host.
        host = torch.from_dlpack(cb.asarray(x[:, ::3], device="cpu"))
        if not torch.equal(host, x[:, ::3].cpu()):
            failures.append(name + " gather")
    if torch.float32 in (a, b) and {a, b} & {torch.float16, torch.bfloat16}:
        for v in (x, x.T):  # casts between float32 and float16 or bfloat16 ship too
            if not torch.equal(torch.from_dlpack(cb.asarray(v, dtype=name.split("+")[1])), v.to(b)):
                failures.append(name + " cast")
try:
    cb.add(torch.ones(4, dtype=torch.int16, device="cuda"), torch.ones(4, dtype=torch.int32, device="cuda"))
    failures.append("int16 + int32 compiled although CUBRIDGE_NVRTC=0")
except cb.CompileError as e:
    if "CUBRIDGE_NVRTC=0" not in str(e) or e.code is not None:
        failures.append("int16 + int32 error: " + str(e) + f" (code {e.code})")
print(json.dumps(failures))
"""

_SHIPPED_CASES = (
    "bool+bool,int8+int8,int16+int16,int32+int32,int64+int64,uint8+uint8,uint16+uint16,"
    "uint32+uint32,uint64+uint64,complex64+complex64,complex128+complex128,float16+float16,"
    "bfloat16+bfloat16,float32+float32,float64+float64,float16+float32,float32+float16,"
    "bfloat16+float32,float32+bfloat16,float16+float64,float64+float16,bfloat16+float64,"
    "float64+bfloat16"
)


def test_shipped_kernels_run_without_nvrtc(tmp_path):
    """A wheel built by `make wheel` ships add's kernels for every dtype: in a new process
    with an empty kernel cache and run-time compilation off, every shipped case (contiguous,
    transposed, scalar, the copy of a strided source, and casts between float32 and float16 or
    bfloat16) runs and equals torch's result, and one that is not shipped says why it cannot
    compile."""
    major, minor = torch.cuda.get_device_capability()
    arch = major * 10 + minor
    shipped = {a for _, a in cb.cuda.shipped_kernels() if a // 10 == major and a <= arch}
    if not shipped:
        pytest.skip(f"this build ships no kernels for sm_{arch} (a source build; see make wheel)")
    env = dict(os.environ, CUBRIDGE_CACHE_DIR=str(tmp_path), CUBRIDGE_NVRTC="0")
    done = subprocess.run(
        [sys.executable, "-c", _SHIPPED_CHILD, _SHIPPED_CASES],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    # Nothing was compiled, so nothing was cached.
    assert list(tmp_path.iterdir()) == []


@two_gpus
def test_second_gpu():
    x = torch.arange(10, dtype=torch.float32, device="cuda:1")
    r = cb.add(x, x)
    assert r.device == "cuda:1"
    t = torch.from_dlpack(r)
    assert t.device == torch.device("cuda:1")
    assert torch.equal(t, x + x)
    if cupy is not None:
        with cupy.cuda.Device(1):
            c = cupy.arange(10, dtype=cupy.float32)
        rc = cb.add(c, c)
        assert rc.device == "cuda:1"
        a = cb.asarray(_CaiOnly(c))
        assert a.device == "cuda:1"
    with pytest.raises(ValueError, match="different devices"):
        cb.add(x, torch.ones(10, device="cuda:0"))
    z = cb.zeros((3,), device="cuda:1")
    assert z.__dlpack_device__() == (2, 1)
    # Work on cuda:1, and freeing its memory, leaves the caller's current device as it was.
    torch.cuda.synchronize(0)
    del z, r, t
    gc.collect()
    assert torch.cuda.current_device() == 0
    assert cb.cuda.Stream().device == 0


def _bound_context():
    """The CUDA context current on the calling thread (its handle; 0 for none), as the driver
    reports it."""
    import ctypes

    ctx = ctypes.c_void_p()
    assert ctypes.CDLL("libcuda.so.1").cuCtxGetCurrent(ctypes.byref(ctx)) == 0
    return ctx.value or 0


def _current_devices():
    """The current device as torch, CuPy (the runtime's, read through cudaGetDevice) and the
    driver see it."""
    cupy_device = cupy.cuda.runtime.getDevice() if cupy is not None else None
    return torch.cuda.current_device(), cupy_device, _bound_context()


def _calls_on(d, foreign=True):
    """cubridge calls that work on device `d` (an int), each as (name, fn): on torch operands
    where `foreign`, else on cubridge's own arrays only (no other library's call in them)."""
    other = 1 - d if cb.cuda.device_count() > 1 else d
    a = cb.arange(0, 1000, dtype="float32", device=d)
    x = torch.arange(1000, dtype=torch.float32, device=f"cuda:{d}") if foreign else a
    k = cb.ElementwiseKernel("T x", "T z", "z = x + x", "current_device_probe")
    raw = cb.RawKernel('extern "C" __global__ void noop(float* x) {}', "noop")

    def stream_use():
        s = cb.cuda.Stream(d)
        cb.add(a, a, stream=s)
        s.synchronize()
        del s
        gc.collect()

    calls = [
        ("zeros", lambda: cb.zeros(4, device=d)),
        ("arange", lambda: cb.arange(0, 4, dtype="float32", device=f"cuda:{d}")),
        ("add", lambda: cb.add(x, x)),
        ("kernel", lambda: k(x)),
        ("raw kernel", lambda: raw(1, 1, (x,))),
        ("to_device", lambda: a.to_device(other)),
        ("to_numpy", lambda: a.to_numpy()),
        ("__dlpack__", lambda: a.__dlpack__(stream=1)),
        ("__cuda_array_interface__", lambda: a.__cuda_array_interface__),
        ("Stream, synchronize, del", stream_use),
        ("synchronize", lambda: cb.cuda.synchronize(d)),
        ("memory_stats", lambda: cb.cuda.memory_stats(d)),
        ("mem_info", lambda: cb.cuda.mem_info(d)),
        ("empty_cache", lambda: cb.cuda.empty_cache(d)),
        ("free", lambda: (cb.zeros(4, device=d), gc.collect())),
    ]
    if foreign:
        calls += [
            ("asarray", lambda: cb.asarray(x)),
            ("torch import", lambda: torch.from_dlpack(a)),
        ]
    return calls


@two_gpus
@pytest.mark.parametrize("current", [0, 1])
def test_calls_on_another_device_leave_every_frameworks_current_device(current):
    """Work on the other GPU leaves torch's, CuPy's and the driver's current device as they were
    (CuPy reads it from the runtime, which reads the driver's current context)."""
    with torch.cuda.device(current):
        if cupy is not None:
            cupy.cuda.Device(current).use()
        calls = _calls_on(1 - current) + _calls_on(current)
        torch.cuda.synchronize()
        before = _current_devices()
        for name, call in calls:
            call()
            assert _current_devices() == before, name
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
    if cupy is not None:
        cupy.cuda.Device(0).use()


def test_calls_on_a_thread_without_a_context_leave_none_bound():
    """On a thread where no CUDA context is current (a new one), cubridge's calls bind the
    device's context for their work and unbind it after: the runtime, and so CuPy, would
    otherwise take that device as the thread's current one."""
    import threading

    devices = range(min(cb.cuda.device_count(), 2))
    calls = [(d, name, call) for d in devices for name, call in _calls_on(d, foreign=False)]
    left_bound = []

    def work():
        for d, name, call in calls:
            if _bound_context() != 0:
                left_bound.append("the thread started with a context")
                return
            call()
            if _bound_context() != 0:
                left_bound.append(f"{name} on cuda:{d}")

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert left_bound == []


def _pending_on_legacy(d, values):
    """A torch tensor on cuda:`d` written on the legacy default stream behind a long kernel
    (still running on return), and that stream."""
    stream = torch.cuda.default_stream(d)
    with torch.cuda.device(d), torch.cuda.stream(stream):
        t = torch.empty_like(values, device=f"cuda:{d}")
        spin(0.3, stream)
        t.copy_(values, non_blocking=True)
    return t, stream


@two_gpus
@pytest.mark.parametrize(("src", "dst"), [(0, 1), (1, 0)])
@pytest.mark.parametrize("how", ["to_device", "asarray", "dl_device"])
def test_copies_between_devices_follow_pending_work_without_waiting(src, dst, how):
    """to_device, asarray(device=) and __dlpack__(dl_device=) copy device to device, ordered
    after the source's pending work (a long kernel, then the write) and without the host
    waiting for it."""
    cb.arange(4, device=src).to_device(dst)  # peer access and pools set up before the race
    ref = torch.arange(1 << 20, dtype=torch.float32).mul_(3).add_(1)
    x, stream = _pending_on_legacy(src, ref.to(f"cuda:{src}"))
    torch.cuda.synchronize(dst)
    a = cb.asarray(x)
    if how == "to_device":
        c = a.to_device(dst)
    elif how == "asarray":
        c = cb.asarray(x, device=f"cuda:{dst}")
    else:
        c = torch.from_dlpack(a.__dlpack__(dl_device=(2, dst), stream=1))
    assert not stream.query(), "the host waited for the source's pending work"
    got = c if isinstance(c, torch.Tensor) else torch.from_dlpack(c)
    assert got.device == torch.device("cuda", dst)
    assert torch.equal(got.cpu(), ref)
    assert torch.cuda.current_device() == 0


@two_gpus
@pytest.mark.parametrize("dtype", ["float16", "int64", "float32"])
def test_copies_between_devices_of_strided_and_cast_arrays(dtype):
    ref = torch.arange(4096, dtype=torch.float64).reshape(64, 64).to(getattr(torch, dtype))
    x = ref.to("cuda:1").T
    c = cb.asarray(x, device=0)
    assert c.device == "cuda:0"
    assert torch.equal(torch.from_dlpack(c).cpu(), ref.T)
    f = cb.asarray(x, dtype="float64", device=torch.device("cuda", 0))
    assert torch.equal(torch.from_dlpack(f).cpu(), ref.T.to(torch.float64))


@two_gpus
def test_other_libraries_copy_cubridge_memory_between_devices():
    """cubridge's pool memory is made accessible to the peer device, so torch's and CuPy's own
    copies of an exported cubridge array to the other GPU work."""
    a = cb.arange(0, 1 << 20, dtype="float32", device="cuda:0")
    expected = torch.arange(1 << 20, dtype=torch.float32)
    t = torch.from_dlpack(a)
    assert torch.equal(t.to("cuda:1").cpu(), expected)
    b = cb.arange(0, 1 << 20, dtype="float32", device="cuda:1")
    assert torch.equal(torch.from_dlpack(b).to("cuda:0").cpu(), expected)
    if cupy is not None:
        source = cupy.from_dlpack(a)
        with cupy.cuda.Device(1):
            onto = cupy.empty(1 << 20, dtype=cupy.float32)
            onto.data.copy_from_device(source.data, onto.nbytes)
            assert np.array_equal(cupy.asnumpy(onto), expected.numpy())


@two_gpus
def test_operands_on_two_devices_are_refused_naming_both():
    x0 = torch.ones(8, device="cuda:0")
    x1 = torch.ones(8, device="cuda:1")
    k = cb.ElementwiseKernel("T x, T y", "T z", "z = x + y", "two_devices")
    raw = cb.RawKernel('extern "C" __global__ void f(float* x, float* y) {}', "f")
    for call in (lambda: cb.add(x0, x1), lambda: k(x0, x1), lambda: raw(1, 1, (x0, x1))):
        with pytest.raises(ValueError) as info:
            call()
        assert "cuda:0" in str(info.value) and "cuda:1" in str(info.value), str(info.value)


def _second_gpu_operands():
    """(name, x, y) pairs of float32 operands on cuda:1 from torch, CuPy and JAX, with their
    values as numpy arrays."""
    rx = np.arange(1000, dtype=np.float32) * 0.5
    ry = np.arange(1000, dtype=np.float32)[::-1].copy()
    out = [("torch", torch.from_numpy(rx).to("cuda:1"), torch.from_numpy(ry).to("cuda:1"))]
    if cupy is not None:
        with cupy.cuda.Device(1):
            out.append(("cupy", cupy.asarray(rx), cupy.asarray(ry)))
    try:
        gpus = jax.devices("gpu") if jax is not None else []
    except RuntimeError:  # jax without a CUDA backend
        gpus = []
    if len(gpus) > 1:
        out.append(("jax", jax.device_put(rx, gpus[1]), jax.device_put(ry, gpus[1])))
    return rx, ry, out


@two_gpus
def test_add_and_kernels_on_second_gpu_operands_of_every_framework():
    rx, ry, operands = _second_gpu_operands()
    k = cb.ElementwiseKernel("T x, T y", "T z", "z = x * y + x", "second_gpu")
    raw = cb.RawKernel(
        'extern "C" __global__ void twice(const float* x, float* y, int n) {'
        " int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = x[i] + x[i]; }",
        "twice",
    )
    for name, x, y in operands:
        r = cb.add(x, y)
        assert r.device == "cuda:1", name
        np.testing.assert_array_equal(r.to_numpy(), rx + ry, err_msg=name)
        z = k(x, y)
        assert z.device == "cuda:1", name
        np.testing.assert_array_equal(z.to_numpy(), rx * ry + rx, err_msg=name)
        out = cb.zeros(rx.size, dtype="float32", device=1)
        raw(4, 256, (x, out, np.int32(rx.size)), readonly_ok=name == "jax")
        np.testing.assert_array_equal(out.to_numpy(), rx + rx, err_msg=name)
        assert torch.cuda.current_device() == 0, name


@two_gpus
def test_eight_threads_alternating_devices():
    import threading

    n = 1 << 16
    errors = []

    def work(k):
        try:
            for i in range(10):
                d = (k + i) % 2
                x = torch.full((n,), float(k), device=f"cuda:{d}")
                y = torch.arange(n, dtype=torch.float32, device=f"cuda:{d}")
                r = cb.add(x, y)
                moved = r.to_device(1 - d)
                expected = torch.arange(n, dtype=torch.float32) + k
                if r.device != f"cuda:{d}" or moved.device != f"cuda:{1 - d}":
                    errors.append(f"thread {k}: devices {r.device}, {moved.device}")
                if not torch.equal(torch.from_dlpack(moved).cpu(), expected):
                    errors.append(f"thread {k}, step {i}: wrong values")
                if torch.cuda.current_device() != 0:
                    errors.append(f"thread {k}: torch's current device moved")
        except Exception as e:  # noqa: BLE001 - reported below with the thread's number
            errors.append(f"thread {k}: {e!r}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


# ---- reliability on the device: faults, leaks per protocol, threads, the GIL ------------------


@pytest.mark.whole_gpu
def test_allocation_beyond_free_memory_is_a_memory_error_and_nothing_breaks():
    free = settled_free()
    total = cb.cuda.mem_info()[1]
    with pytest.raises(MemoryError, match="could not allocate"):
        cb.empty((total * 4,), dtype="uint8", device="cuda")
    with pytest.raises(MemoryError):
        cb.zeros((total // 8, 4), dtype="float32", device="cuda")  # twice the device
    hog = cb.empty((free - (1 << 30),), dtype="uint8", device="cuda")  # all but 1 GiB
    with pytest.raises(MemoryError):
        cb.zeros((1 << 29,), dtype="float32", device="cuda")  # 2 GiB: beyond what is free
    del hog
    # The process keeps working: allocations, kernels and exports after the failures.
    r = cb.add(cb.arange(1000, dtype="float32", device="cuda"), torch.ones(1000, device="cuda"))
    np.testing.assert_array_equal(torch.from_dlpack(r).cpu().numpy(), np.arange(1, 1001))
    del r
    assert abs(settled_free() - free) < (64 << 20)


def test_driver_errors_surface_as_cuda_error():
    """A kernel that faults (a CAI view claiming far more memory than exists) poisons the CUDA
    context, so it runs in a child process; the child must see cubridge.CudaError naming the
    driver's error, and exit normally."""
    code = (
        "import cubridge as cb\n"
        "a = cb.zeros((1024,), dtype='float32', device='cuda')\n"
        "class Liar:\n"
        "    __cuda_array_interface__ = {'shape': (1 << 36,), 'typestr': '<f4',\n"
        "        'data': (a.data_ptr, False), 'version': 3, 'stream': None}\n"
        "try:\n"
        "    r = cb.add(Liar(), Liar(), out=Liar())\n"
        "    cb.cuda.synchronize()\n"
        "    print('no error')\n"
        "except cb.CudaError as e:\n"
        "    print('CudaError:', e)\n"
    )
    done = run_child(code)
    assert done.stdout.startswith("CudaError:"), done.stdout + done.stderr
    assert "CUDA_ERROR_" in done.stdout


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


DEVICE_PROTOCOLS = {
    "dlpack_legacy": lambda a, t: cb.from_dlpack(a.__dlpack__(stream=1)),
    "dlpack_versioned": lambda a, t: cb.from_dlpack(a.__dlpack__(stream=1, max_version=(1, 3))),
    "torch_from_dlpack": lambda a, t: torch.from_dlpack(a),
    "torch_import": lambda a, t: cb.from_dlpack(t),
    "cai_export": lambda a, t: a.__cuda_array_interface__,
    "cai_import": lambda a, t: cb.asarray(_CaiOnly(t)),
}


@pytest.mark.whole_gpu
@pytest.mark.parametrize("protocol", DEVICE_PROTOCOLS)
def test_100k_device_exchanges_keep_device_and_host_memory_flat(protocol):
    a = cb.arange(1024, dtype="float32", device="cuda")
    t = torch.arange(1024, dtype=torch.float32, device="cuda")
    step = DEVICE_PROTOCOLS[protocol]
    for _ in range(2000):
        step(a, t)
    free0, rss0 = settled_free(), _rss()
    for _ in range(100_000):
        step(a, t)
    free1, rss1 = settled_free(), _rss()
    # One leaked 4 KiB buffer per cycle would be 400 MB; one leaked event or descriptor, megabytes.
    assert abs(free1 - free0) < (2 << 20), f"device memory moved {free0 - free1} bytes"
    assert rss1 - rss0 < (4 << 20), f"RSS grew {rss1 - rss0} bytes"


def test_a_write_through_out_is_ordered_before_later_consumers_of_that_array():
    """cubridge.add(..., out=x, stream=s) while s is busy: x itself (not only the returned
    object) carries the write, so a consumer of x waits for it instead of reading old values."""
    n = 1 << 16
    s = cb.cuda.Stream()
    x = cb.full((n,), -7.0, device="cuda")
    view = x.as_strided((n // 2,), (2,))
    src, zero = cb.arange(n, dtype="float32", device="cuda"), cb.zeros((), device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.ExternalStream(s.ptr)):
        torch.cuda._sleep(200_000_000)
    cb.add(src, zero, out=x, stream=s)
    assert x.stream == s.ptr and view.stream == s.ptr
    expected = torch.arange(n, dtype=torch.float32, device="cuda")
    assert torch.equal(torch.from_dlpack(x), expected)
    assert torch.equal(torch.from_dlpack(view), expected[::2])


def test_adds_from_eight_threads_each_on_its_own_stream():
    import threading

    n = 1 << 16  # small enough to run under compute-sanitizer too
    errors = []

    def work(k):
        try:
            s = cb.cuda.Stream()
            a = torch.full((n,), float(k), device="cuda")
            b = torch.arange(n, dtype=torch.float32, device="cuda")
            torch.cuda.synchronize()
            out = None
            for _ in range(20):
                out = cb.add(a, b, stream=s)
                assert out.stream == s.ptr
            s.synchronize()
            got = torch.from_dlpack(out)
            expected = torch.arange(n, dtype=torch.float32, device="cuda") + k
            if not torch.equal(got, expected):
                errors.append(f"thread {k}: wrong values")
        except Exception as e:  # noqa: BLE001 - reported below with the thread's number
            errors.append(f"thread {k}: {e!r}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


@pytest.mark.parametrize("wait", ["synchronize", "stream", "to_numpy"])
def test_the_gil_is_released_while_waiting_on_the_gpu(wait):
    import threading

    s = cb.cuda.Stream()
    a = torch.ones(1024, device="cuda")
    # Settle earlier work first: freeing device memory (cuMemFree) waits for the device, and a
    # free of some earlier test's array inside the add below would do the waiting too early.
    warm = cb.add(a, a, stream=s)
    cb.cuda.synchronize()
    gc.collect()
    warm2 = cb.add(a, a, stream=s)  # kept: its free would also wait for the device
    cb.cuda.synchronize()
    side = torch.cuda.ExternalStream(s.ptr)
    with torch.cuda.stream(side):
        spin(1.0)  # about a second of GPU work ahead of the add
    r = cb.add(a, a, stream=s)
    assert not side.query(), "the add should have returned while the GPU is still busy"
    waits = {
        "synchronize": cb.cuda.synchronize,
        "stream": s.synchronize,
        "to_numpy": r.to_numpy,
    }
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (waits[wait](), done.set()))
    ticks = 0
    waiter.start()
    time.sleep(0.05)
    while not done.is_set():
        ticks += 1  # runs only if the waiting thread let go of the GIL
        time.sleep(0.001)
    waiter.join()
    assert ticks > 100, f"only {ticks} ticks while {wait} waited on the GPU"
    np.testing.assert_array_equal(r.to_numpy(), np.full(1024, 2.0, np.float32))
    del warm, warm2


# ---- the kernel disk cache checks what it loads -------------------------------------------------


_CACHE_CHILD = """
import cubridge as cb, torch
k = cb.ElementwiseKernel("T x", "T z", "z = x * (T)3 + (T)1", "cache_probe")
x = torch.arange(8, dtype=torch.float32, device="cuda")
print(torch.from_dlpack(k(x)).tolist())
"""
_CACHE_WANT = str([3.0 * i + 1 for i in range(8)])


def _entries(folder):
    return sorted(p for p in folder.iterdir() if p.suffix == ".bin")


def _fnv_words(data):
    """The disk cache's checksum (64-bit FNV-1a over little-endian words, then the tail)."""
    h, prime, mask = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1
    cut = len(data) // 8 * 8
    for (w,) in struct.iter_unpack("<Q", data[:cut]):
        h = ((h ^ w) * prime) & mask
    for b in data[cut:]:
        h = ((h ^ b) * prime) & mask
    return h


HEADER = 8 + 4 + 4 + 4 + 4 + 16 + 8 + 8


def _damage(kind, data):
    if kind == "truncated":
        return data[: len(data) // 2]
    if kind == "zeroed":
        return bytes(len(data))
    if kind == "empty":
        return b""
    if kind == "garbage":
        return os.urandom(len(data))
    if kind == "wrong architecture":
        # An intact entry that says it was made for another architecture.
        return data[:12] + struct.pack("<I", 80) + data[16:]
    if kind == "refused image":
        # A header that checks out over an image the driver cannot load.
        image = os.urandom(4096)
        head = data[: HEADER - 16] + struct.pack("<QQ", len(image), _fnv_words(image))
        return head + image
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind", ["truncated", "zeroed", "empty", "garbage", "wrong architecture", "refused image"]
)
def test_damaged_cache_entries_are_discarded_and_recompiled(kind, tmp_path):
    """A truncated, zeroed or garbage entry gave CUDA_ERROR_INVALID_IMAGE on every later run
    until the user deleted it, and an empty one killed the process with SIGSEGV. Now each is
    discarded with one warning, the kernel compiled again and the answer right, and the entry
    written anew is then used without a warning."""
    env = dict(os.environ, CUBRIDGE_CACHE_DIR=str(tmp_path))
    assert run_child(_CACHE_CHILD, env).stdout.strip() == _CACHE_WANT
    (entry,) = _entries(tmp_path)
    good = entry.read_bytes()
    entry.write_bytes(_damage(kind, good))
    again = run_child(_CACHE_CHILD, env)
    assert again.stdout.strip() == _CACHE_WANT
    assert again.stderr.count("discarded the damaged kernel cache entry") == 1, again.stderr
    (rewritten,) = _entries(tmp_path)
    assert rewritten.read_bytes()[: HEADER - 16] == good[: HEADER - 16]
    third = run_child(_CACHE_CHILD, env)
    assert third.stdout.strip() == _CACHE_WANT and "discarded" not in third.stderr


def test_entries_name_the_nvrtc_that_made_them(tmp_path):
    """The key left out the NVRTC version: an image another toolkit's NVRTC wrote was loaded.
    An entry is named for its NVRTC, and one of another version is not read."""
    env = dict(os.environ, CUBRIDGE_CACHE_DIR=str(tmp_path))
    run_child(_CACHE_CHILD, env)
    (entry,) = _entries(tmp_path)
    assert entry.name.split(".")[1].startswith("nvrtc"), entry.name
    major, minor = torch.cuda.get_device_capability()
    assert entry.name.endswith(f".{major}{minor}.bin")
    # The same image under another NVRTC version's name is another entry: compiled anew.
    other = tmp_path / entry.name.replace(".nvrtc", ".nvrtc9", 1)
    entry.rename(other)
    run_child(_CACHE_CHILD, env)
    assert len(_entries(tmp_path)) == 2


def test_processes_compiling_one_kernel_at_once_share_one_good_entry(tmp_path):
    """Concurrent writers: eight processes compile the same kernel into an empty cache at once;
    all answer right, one entry remains, no temporary file is left, and a ninth process loads
    the entry without compiling (its file is not rewritten)."""
    env = dict(os.environ, CUBRIDGE_CACHE_DIR=str(tmp_path))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CACHE_CHILD], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(8)
    ]
    outs = [p.communicate()[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs == [_CACHE_WANT] * 8
    assert [p.suffix for p in tmp_path.iterdir()] == [".bin"]
    (entry,) = _entries(tmp_path)
    stamp = entry.stat().st_mtime_ns
    last = run_child(_CACHE_CHILD, env)
    assert last.stdout.strip() == _CACHE_WANT and "discarded" not in last.stderr
    assert entry.stat().st_mtime_ns == stamp


# ---- memory its producer forbids writing, on the device -----------------------------------------


def _jax_gpu():
    try:
        return jax.devices("gpu")[0] if jax is not None else None
    except RuntimeError:
        return None


def test_jax_device_arrays_are_not_written():
    """The same for JAX arrays on the GPU, through DLPack and the CUDA array interface."""
    gpu = _jax_gpu()
    if gpu is None:
        pytest.skip("jax has no GPU backend here")
    a = jax.device_put(np.arange(4, dtype=np.float32), gpu)
    with pytest.raises(ValueError, match="immutable"):
        cb.add(torch.ones(4, device="cuda"), 1.0, out=a)
    for imported in (cb.asarray(a), cb.from_dlpack(a)):
        assert imported.readonly
        with pytest.raises(ValueError, match="read-only"):
            cb.add(imported, 1.0, out=imported)
    np.testing.assert_array_equal(np.asarray(a), [0, 1, 2, 3])
    np.testing.assert_array_equal(cb.add(a, a).to_numpy(), [0, 2, 4, 6])


def test_device_tensors_that_require_grad_on_every_path():
    """The same on the GPU, through the exchange table (from_dlpack, asarray), the CUDA array
    interface, a users' kernel's output and a raw kernel's argument."""
    x = torch.nn.Parameter(torch.ones(8, device="cuda"))
    for imported in (cb.from_dlpack(x), cb.asarray(x)):
        assert imported.readonly
        with pytest.raises(ValueError, match="read-only"):
            cb.add(imported, 1.0, out=imported)
    k = cb.ElementwiseKernel("T x", "T z", "z = x", "grad_out")
    with pytest.raises(BufferError, match="requires grad"):
        k(torch.ones(8, device="cuda"), out=x)
    r = cb.RawKernel('extern "C" __global__ void f(float* x) {}', "f")
    with pytest.raises(ValueError, match="read-only"):
        r(1, 1, (x,))
    torch.cuda.synchronize()
    assert (x.detach() == 1).all()


# ---- a DLPack copy is ordered before its consumer's reads ---------------------------------------


def test_dlpack_copy_is_ordered_before_the_consumer_stream():
    """`__dlpack__(stream=s, copy=True)` ordered neither the consumer's stream after the copy
    nor recorded its use. With the producer's write still queued behind 0.2 s and the consumer
    reading on a busy side stream of its own, it must read the written values; so must a
    consumer of a copy to the host (`dl_device`)."""
    cycles = int(0.2 * torch.cuda.get_device_properties(0).clock_rate * 1000)
    writer, reader = torch.cuda.Stream(), torch.cuda.Stream()
    src = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(writer):
        torch.cuda._sleep(cycles)
        a = cb.add(src, 5.0)  # queued behind the sleep, on the writer stream
    with torch.cuda.stream(reader):
        torch.cuda._sleep(cycles // 4)  # a busy consumer stream
        capsule = a.__dlpack__(stream=reader.cuda_stream, max_version=(1, 0), copy=True)
        seen = torch.from_dlpack(capsule) * 1  # read on the reader stream
    with torch.cuda.stream(writer):
        torch.cuda._sleep(cycles)
        b = cb.add(src, 7.0)
    host = torch.from_dlpack(b.__dlpack__(max_version=(1, 0), dl_device=(1, 0)))
    del a, b
    torch.cuda.synchronize()
    assert (seen == 5.0).all(), f"{int((seen != 5.0).sum())} elements read before the copy"
    assert (host == 7.0).all()
