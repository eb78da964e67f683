"""The short ways in for kernel operands: numpy arrays read from numpy's array object, and
tensors that PyTorch lends through its DLPack exchange table (`dltensor_from_py_object_no_sync`),
held by their Python object until the kernel has run. Each must read what the long way reads
and refuse what it refuses; results are checked against numpy and torch."""

import gc

import cubridge as cb
import numpy as np
import pytest
from conftest import needs_torch, torch

HAS_GPU = cb.cuda.is_available() and torch is not None and torch.cuda.is_available()
cuda = [pytest.mark.cuda, pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")]

NUMPY_CODES = list("?bBhHiIlLqQefdFD")


@pytest.mark.parametrize("code", NUMPY_CODES)
def test_numpy_operands_of_every_type_code(code):
    dtype = np.dtype(code)
    a = (np.arange(24) % 5).astype(dtype).reshape(4, 6)
    b = (np.arange(24) % 3).astype(dtype).reshape(4, 6)
    out = np.empty_like(a)
    assert cb.add(a, b, out=out) is out
    np.testing.assert_array_equal(out, np.add(a, b))
    # Strided, negative and broadcast operands, and a 0-d one.
    out2 = np.empty((3, 6), dtype)
    cb.add(a[::-1][:3], b[0], out=out2)
    np.testing.assert_array_equal(out2, np.add(a[::-1][:3], b[0]))
    r = cb.add(a.T, np.array(b[0, 1]))
    np.testing.assert_array_equal(r.to_numpy(), a.T + b[0, 1])


class _Nested:
    """A DLPack producer whose export runs cubridge calls on numpy arrays `depth` deep: each level
    holds its own numpy operands (lent for the call) while the next one runs, until the lent
    views run out and the next level's are held as any import is."""

    def __init__(self, depth, log):
        self.depth, self.log = depth, log
        self.x = np.arange(6, dtype=np.float32) * (depth + 1)

    def __dlpack__(self, **kwargs):
        a = np.full(6, self.depth, np.float32)
        out = np.empty(6, np.float32)
        inner = _Nested(self.depth - 1, self.log) if self.depth else self.x
        cb.add(a, inner, out=out)
        self.log.append((self.depth, out.copy(), a + np.asarray(inner.x if self.depth else inner)))
        return self.x.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.x.__dlpack_device__()


def test_numpy_operands_of_nested_calls_and_more_than_are_lent():
    # add and sum lend numpy operands for the call (no reference, no allocation); calls nested
    # in a producer's export, eleven deep (more operands than there are lent views), each read and
    # write their own operands.
    log = []
    top = _Nested(10, log)
    a = np.arange(6, dtype=np.float32)
    out = np.empty(6, np.float32)
    assert cb.add(a, top, out=out) is out
    np.testing.assert_array_equal(out, a + top.x)
    assert [d for d, _, _ in log] == list(range(11))
    for _, got, want in log:
        np.testing.assert_array_equal(got, want)
    # No reference to the operands outlives the call.
    import sys

    refs = [sys.getrefcount(x) for x in (a, out)]
    for _ in range(3):
        cb.add(a, a, out=out)
        cb.sum(a, out=np.empty((), np.float32))
    assert [sys.getrefcount(x) for x in (a, out)] == refs
    np.testing.assert_array_equal(cb.sum(a).to_numpy(), a.sum())


class _Resizer:
    """A DLPack producer whose export tries to resize (reallocate) a numpy operand of the same
    call that nothing else references any longer."""

    def __init__(self, n):
        self.victim = np.full(n, 7.0)
        self.x = np.arange(n, dtype=np.float64)
        self.refused = None

    def __dlpack__(self, **kwargs):
        try:
            # One expression: no reference but the call's own and the resize's.
            self.__dict__.pop("victim").resize((16,), refcheck=True)
            self.refused = False
        except ValueError:
            self.refused = True
        return self.x.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.x.__dlpack_device__()


@pytest.mark.parametrize("op", ["add", "sum"])
def test_numpy_operands_cannot_be_resized_while_a_call_uses_them(op):
    # Python code runs within a call (a later operand's export here; another thread while the
    # interpreter is let go): an operand in use stays referenced, so numpy refuses to move its
    # memory, as it refuses for any array referenced elsewhere.
    n = 1 << 16
    w = _Resizer(n)
    out = np.empty(n)
    if op == "add":
        cb.add(w.victim, w, out=out)
        np.testing.assert_array_equal(out, 7.0 + w.x)
    else:
        # The export runs for `out`, after `x` was taken.
        got = np.empty((), np.float64)
        w.x = np.empty((), np.float64)
        cb.sum(w.victim, out=_ExportOf(w, got))
        assert got == 7.0 * n
    assert w.refused is True


class _ExportOf:
    """`target`'s DLPack export, after `resizer`'s (which tries its resize)."""

    def __init__(self, resizer, target):
        self.resizer, self.target = resizer, target

    def __dlpack__(self, **kwargs):
        self.resizer.__dlpack__(**kwargs)
        return self.target.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.target.__dlpack_device__()


def test_numpy_layouts_the_short_way_leaves_to_the_buffer_protocol():
    # Nine dimensions, a field of a structured array (strides not whole elements), a
    # byte-swapped array: answered as before the short way existed.
    nine = np.ones((1, 2, 1, 2, 1, 2, 1, 2, 3), np.float32)
    np.testing.assert_array_equal(cb.add(nine, nine).to_numpy(), nine + nine)
    rec = np.zeros(4, dtype=[("x", "<f4"), ("y", "<f8")])
    rec["x"] = [1, 2, 3, 4]
    np.testing.assert_array_equal(cb.add(rec["x"], rec["x"]).to_numpy(), [2, 4, 6, 8])
    packed = np.zeros(4, dtype=[("x", "<f4"), ("y", "u1")])
    with pytest.raises(BufferError, match="multiple of itemsize"):
        cb.add(packed["x"], packed["x"])
    with pytest.raises(TypeError, match="big-endian"):
        cb.add(np.arange(3, dtype=">f4"), np.arange(3, dtype=">f4"))


def test_numpy_outputs_the_short_way_refuses():
    a = np.arange(6, dtype=np.float64)
    frozen = np.empty_like(a)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        cb.add(a, a, out=frozen)
    zero_stride = np.lib.stride_tricks.as_strided(
        np.empty(1), shape=(6,), strides=(0,), writeable=True
    )
    with pytest.raises(ValueError, match="overlaps itself"):
        cb.add(a, a, out=zero_stride)
    # Partial overlap of out with an input is refused as on the long way; exact aliasing works.
    with pytest.raises(ValueError):
        cb.add(a[1:], a[1:], out=a[:-1])
    cb.add(a, a, out=a)
    np.testing.assert_array_equal(a, np.arange(6) * 2.0)


@needs_torch
@pytest.mark.parametrize(
    "dtype", ["float32", "float64", "float16", "bfloat16", "int8", "int64", "uint8", "bool"]
)
def test_torch_operands_lent_through_the_table(dtype):
    dt = getattr(torch, dtype)
    a = (torch.arange(24) % 5).to(dt).reshape(4, 6)
    b = (torch.arange(24) % 3).to(dt).reshape(4, 6)
    out = torch.empty_like(a)
    cb.add(a, b, out=out)
    assert torch.equal(out, (a + b) if dtype != "bool" else (a | b))
    # Transposed, sliced and expanded (stride 0) operands.
    c = cb.add(a.T, b[0].expand(4, 6).T)
    ref = a.T + b[0].expand(4, 6).T if dtype != "bool" else a.T | b[0].expand(4, 6).T
    assert torch.equal(torch.from_dlpack(c), ref)


@needs_torch
def test_lent_torch_operands_refuse_what_the_export_refuses():
    t = torch.arange(4.0)
    with pytest.raises(BufferError, match="negative bit"):
        cb.add(t.conj().imag if t.is_complex() else torch.complex(t, t).conj().imag, t)
    w = torch.ones(4, requires_grad=True)
    with pytest.raises(BufferError, match="requires grad"):
        cb.add(t, t, out=w)
    r = cb.add(w, t)  # read-only use is fine
    np.testing.assert_array_equal(r.to_numpy(), np.arange(4.0) + 1)


def _spin(seconds, stream):
    cycles = int(seconds * torch.cuda.get_device_properties(0).clock_rate * 1000)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(cycles)


@pytest.mark.parametrize("case", ["add", "kernel"])
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_lent_tensors_live_until_the_kernel_ran(case):
    """Operands allocated on a side stream, used on the default stream behind 0.3 s of work,
    then dropped: torch may hand their blocks out again on the side stream at once unless
    something holds them. cubridge holds the lent tensors until its kernel has run."""
    side = torch.cuda.Stream()
    n = 1 << 20
    with torch.cuda.stream(side):
        a = torch.full((n,), 1.0, device="cuda")
        b = torch.full((n,), 2.0, device="cuda")
    side.synchronize()
    out = torch.empty(n, device="cuda")
    _spin(0.3, torch.cuda.current_stream())
    if case == "add":
        cb.add(a, b, out=out)
    else:
        k = cb.ElementwiseKernel("T x, T y", "T z", "z = x + y", "lent_add")
        k(a, b, out)
    del a, b
    gc.collect()
    with torch.cuda.stream(side):
        junk = [torch.full((n,), -100.0, device="cuda") for _ in range(4)]
    torch.cuda.synchronize()
    assert bool((out == 3.0).all()), "an operand's memory was reused before the kernel read it"
    del junk


def test_numpy_scalars_read_in_place_keep_value_and_dtype():
    """numpy's own scalar types are read where numpy keeps the value once a first scalar of
    the type was read the long way; every later one must give the same value and dtype."""
    values = [
        np.float32(1.5),
        np.int8(-3),
        np.uint64(2**63 + 5),
        np.float16(0.5),
        np.complex64(1 + 2j),
        np.complex128(3 - 1j),
        np.bool_(True),
        np.int64(-(2**62)),
        np.longlong(7),
        np.uint32(9),
        np.int16(-7),
        np.uint8(200),
        np.float64(-0.25),
    ]
    for _ in range(3):
        for v in values:
            r = cb.full((2,), v)
            assert r.dtype == v.dtype.name
            np.testing.assert_array_equal(r.to_numpy(), np.full(2, v))


class _MyFloat32(np.float32):
    pass


def test_numpy_scalar_subclasses_take_the_long_way():
    for _ in range(2):
        r = cb.full((1,), _MyFloat32(2.5))
        assert r.dtype == "float32" and r.to_numpy()[0] == 2.5


def _cupy():
    try:
        import cupy
    except ImportError:
        return None
    return cupy


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU or _cupy() is None, reason="needs a GPU and CuPy")
@pytest.mark.parametrize("case", ["add", "add out=", "kernel"])
def test_cupy_operands_run_on_cupys_current_stream(case):
    """Inside a CuPy side stream, a call on CuPy arrays runs on that stream (CuPy's current
    stream): it follows the side stream's pending work, and neither the legacy default stream
    nor the host waits for it."""
    cupy = _cupy()
    side = cupy.cuda.Stream(non_blocking=True)
    n = 1 << 20
    k = cb.ElementwiseKernel("T a", "T z", "z = a + a", "cupy_twice")

    def call(x, out):
        if case == "add":
            return cb.add(x, x)
        if case == "add out=":
            return cb.add(x, x, out=out)
        return k(x, out)

    with side:
        x = cupy.arange(n, dtype=cupy.float32)
        out = cupy.empty_like(x)
        x += 1
        call(x, out)  # CuPy's and cubridge's kernels are compiled before the timed part
        x -= 1
        side.synchronize()
        _spin(1.0, torch.cuda.ExternalStream(side.ptr))
        x += 1  # queued behind the spin
        assert not side.done, "the spin did not keep the side stream busy"
        r = call(x, out)
        assert not side.done, "the side stream's work had already run"
        assert cupy.cuda.Stream.null.done, "the legacy default stream was made to wait"
    side.synchronize()
    got = cupy.asarray(r) if case == "add" else out
    expected = (np.arange(n, dtype=np.float32) + 1) * 2
    np.testing.assert_array_equal(cupy.asnumpy(got), expected)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU or _cupy() is None, reason="needs a GPU and CuPy")
def test_cupy_and_torch_operands_on_different_streams():
    """A torch operand first (the kernel runs on torch's current stream) and a CuPy operand
    written on CuPy's current stream, a side stream: the kernel waits for the CuPy write."""
    cupy = _cupy()
    side = cupy.cuda.Stream(non_blocking=True)
    n = 1 << 20
    t = torch.ones(n, device="cuda")
    with side:
        c = cupy.zeros(n, dtype=cupy.float32)
        c += 0
        side.synchronize()
        _spin(1.0, torch.cuda.ExternalStream(side.ptr))
        c += 5
        # CuPy orders its current stream's work (this side stream) before the stream it is
        # handed: torch's, on which the kernel runs.
        r = cb.add(t, c)
    torch.cuda.synchronize()
    side.synchronize()
    assert bool((torch.from_dlpack(r) == 6).all())
