"""Importing into cubridge: numpy, torch and jax over DLPack, raw capsules, and buffer-protocol
objects. Zero copy is checked with pointers, lifetime by deleting the producer first."""

import array
import collections
import gc
import re

import cubridge as cb
import numpy as np
import pytest
from conftest import (
    ALL_DTYPES,
    INT_NEAR_TIES,
    NEAR_TIES,
    NUMPY_DTYPES,
    float_values,
    jax,
    jnp,
    needs_jax,
    needs_torch,
    rounded,
    sample,
    torch,
    torch_sample,
)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_in_zero_copy(dtype):
    ref = sample((2, 3), dtype)
    a = cb.from_dlpack(ref)
    assert a.dtype == dtype
    assert a.shape == (2, 3)
    assert a.data_ptr == ref.ctypes.data
    np.testing.assert_array_equal(a.to_numpy(), ref)


@needs_torch
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_torch_in_zero_copy(dtype):
    t = torch_sample((4, 2), dtype)
    a = cb.from_dlpack(t)
    assert a.dtype == dtype
    assert a.data_ptr == t.data_ptr()
    assert torch.equal(torch.from_dlpack(a), t)


@needs_jax
@pytest.mark.parametrize("dtype", ["float32", "int64", "bool", "complex64", "bfloat16"])
def test_jax_in(dtype):
    j = jnp.arange(6).astype(dtype).reshape(2, 3)
    a = cb.from_dlpack(j)
    assert a.dtype == dtype
    got = cb.add(a, cb.zeros((2, 3), dtype=dtype))
    if dtype == "bfloat16":
        assert torch is None or torch.equal(
            torch.from_dlpack(got).float(), torch.tensor(np.asarray(j.astype("float32")))
        )
    else:
        np.testing.assert_array_equal(np.from_dlpack(got), np.asarray(j))


@pytest.mark.parametrize(
    "make",
    [
        lambda b: b[::-1],
        lambda b: b.T,
        lambda b: b[1:, 1:],
        lambda b: b[:, ::-2],
        lambda b: b[2],
        lambda b: b[2:3, 3:4].reshape(()),
        lambda b: b[:0],
    ],
    ids=["neg", "transposed", "offset", "neg2", "row", "0d", "empty"],
)
def test_numpy_strides_and_offsets(make):
    base = sample((4, 5), "float64")
    v = make(base)
    a = cb.asarray(v)
    assert a.shape == v.shape
    np.testing.assert_array_equal(a.to_numpy(), v)
    if v.size:
        assert a.data_ptr == v.ctypes.data


@needs_torch
def test_numpy_bfloat16_arrays_come_in_zero_copy():
    """An ml_dtypes bfloat16 numpy array (which numpy.asarray of a cubridge bfloat16 array
    makes) comes back without a copy, though numpy's DLPack export and buffer refuse it."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    ref = torch_sample((3, 4), "bfloat16", 1)
    n = ref.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    for read in (cb.asarray, cb.from_dlpack):
        a = read(n)
        assert a.dtype == "bfloat16" and a.shape == (3, 4)
        assert a.data_ptr == n.ctypes.data
        assert torch.equal(torch.from_dlpack(a), ref)
    t = n.T[::2]
    a = cb.asarray(t)
    assert a.data_ptr == t.ctypes.data and a.strides == (2, 4)
    assert torch.equal(torch.from_dlpack(a), ref.T[::2])
    back = np.asarray(cb.arange(5, dtype="bfloat16"))
    assert back.dtype == np.dtype(ml_dtypes.bfloat16)
    assert torch.equal(torch.from_dlpack(cb.asarray(back)), torch.arange(5).to(torch.bfloat16))
    assert torch.equal(torch.from_dlpack(cb.add(n, n)), ref + ref)


@needs_torch
@pytest.mark.filterwarnings("ignore::UserWarning")  # torch deprecates quantized tensors
def test_a_producers_buffer_error_reaches_the_caller():
    """torch refuses DLPack for a quantized tensor with BufferError; cubridge passes it on (the
    DLPack standard asks consumers to), not a TypeError of its own."""
    q = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)
    with pytest.raises(BufferError) as refused:
        q.__dlpack__()
    for read in (cb.asarray, cb.from_dlpack):
        with pytest.raises(BufferError, match=re.escape(str(refused.value))):
            read(q)


def test_numpy_scalars_come_in_as_0d_arrays():
    for value in (np.float64(2.5), np.int8(-3), np.complex64(1 + 2j), np.bool_(True)):
        a = cb.asarray(value)
        assert a.shape == () and a.dtype == value.dtype.name
        assert a.to_numpy() == value


@pytest.mark.parametrize(
    "value",
    [
        np.timedelta64(5, "s"),
        np.datetime64("2020-01-01"),
        np.bytes_(b"ab"),
    ],
    ids=["timedelta64", "datetime64", "bytes_"],
)
def test_numpy_scalars_of_dtypes_cubridge_has_not_are_type_errors(value):
    """`add(zeros(8, int64), np.timedelta64(5, 's'))` gave [5, 0, 0, 0, 0, 0, 0, 0]: the scalar
    was read as a uint8 array of its bytes."""
    for call in (
        lambda: cb.add(cb.zeros(8, dtype="int64"), value),
        lambda: cb.asarray(value),
        lambda: cb.asarray([value]),
        lambda: cb.full(2, value),
        lambda: cb.from_dlpack(value),
    ):
        with pytest.raises(TypeError, match="unsupported dtype"):
            call()


def test_read_only_numpy_gives_a_read_only_view():
    ref = np.arange(4.0)
    ref.flags.writeable = False
    a = cb.asarray(ref)
    assert a.readonly
    assert a.data_ptr == ref.ctypes.data
    with pytest.raises(ValueError, match="read-only"):
        cb.add(a, a, out=a)


@needs_torch
def test_tensors_that_require_grad_import_read_only():
    """`cb.asarray(param)` was writable: `add(a, 100, out=a)` changed what autograd saw (x.grad
    408 instead of 8) and `np.from_dlpack(cb.asarray(param))[:] = 5` wrote the parameter."""
    x = torch.nn.Parameter(torch.full((3,), 2.0))
    for imported in (cb.asarray(x), cb.from_dlpack(x)):
        assert imported.readonly
        with pytest.raises(ValueError, match="read-only"):
            cb.add(imported, 100, out=imported)
        view = np.from_dlpack(imported)
        assert not view.flags.writeable
        with pytest.raises(ValueError):
            view[:] = 5
    with pytest.raises(BufferError, match="requires grad"):
        cb.add(x, 1.0, out=x)
    (x * x * x).sum().backward()
    np.testing.assert_array_equal(x.detach().numpy(), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(x.grad.numpy(), [12.0, 12.0, 12.0])  # 3 x^2
    # Reading it is fine, and so is writing a detached tensor.
    np.testing.assert_array_equal(cb.add(x, 1.0).to_numpy(), [3.0, 3.0, 3.0])
    d = x.detach()
    cb.add(d, 1.0, out=d)
    np.testing.assert_array_equal(x.detach().numpy(), [3.0, 3.0, 3.0])


@needs_jax
def test_jax_arrays_are_not_written():
    """out= wrote into JAX arrays, which are immutable, changing other JAX arrays that share the
    buffer. They are refused as out, and imported read-only."""
    cpu = jax.devices("cpu")[0]  # numpy reads it back below, wherever JAX runs by default
    a = jax.device_put(np.arange(4, dtype=np.float32), cpu)
    b = a + 0  # JAX may share buffers between arrays like these
    with pytest.raises(ValueError, match="JAX array, which is immutable"):
        cb.add(np.ones(4, np.float32), 1.0, out=a)
    k = cb.ElementwiseKernel("T x", "T z", "z = x", "jax_out")
    with pytest.raises(ValueError, match="immutable"):
        k(np.ones(4, np.float32), out=a)
    imported = cb.asarray(a)
    assert imported.readonly
    with pytest.raises(ValueError, match="read-only"):
        cb.add(imported, 1.0, out=imported)
    assert not np.from_dlpack(imported).flags.writeable
    np.testing.assert_array_equal(np.asarray(a), [0, 1, 2, 3])
    np.testing.assert_array_equal(np.asarray(b), [0, 1, 2, 3])
    # Reading JAX arrays is what cubridge is for.
    np.testing.assert_array_equal(cb.add(a, b).to_numpy(), [0, 2, 4, 6])


def test_view_keeps_the_producer_alive():
    ref = np.arange(1000, dtype=np.int32)
    ptr = ref.ctypes.data
    a = cb.asarray(ref)
    del ref
    gc.collect()
    assert a.data_ptr == ptr
    np.testing.assert_array_equal(a.to_numpy(), np.arange(1000))


@needs_torch
def test_torch_view_keeps_the_tensor_alive():
    t = torch.arange(100, dtype=torch.float32)
    a = cb.from_dlpack(t)
    del t
    gc.collect()
    np.testing.assert_array_equal(a.to_numpy(), np.arange(100, dtype=np.float32))


@pytest.mark.parametrize(
    "obj,dtype,values",
    [
        (bytearray(b"\x01\x02\x03"), "uint8", [1, 2, 3]),
        (b"ab", "uint8", [97, 98]),
        (array.array("d", [1.5, 2.5]), "float64", [1.5, 2.5]),
        (array.array("i", [-1, 7]), "int32", [-1, 7]),
        (array.array("q", [2**40]), "int64", [2**40]),
    ],
)
def test_buffer_protocol_objects(obj, dtype, values):
    a = cb.asarray(obj)
    assert a.dtype == dtype
    np.testing.assert_array_equal(a.to_numpy(), values)
    assert a.readonly == isinstance(obj, bytes)


def test_byte_strides_that_split_an_element_are_refused():
    """The buffer protocol and the CUDA array interface count strides in bytes; one that is not
    a whole number of elements is a ValueError that names the stride and the item size."""
    split = np.lib.stride_tricks.as_strided(np.zeros(16, np.int32), (3,), (6,))
    with pytest.raises(ValueError, match="stride 6 is not a multiple of itemsize 4"):
        cb.asarray(memoryview(split))

    class Cai:
        __cuda_array_interface__ = {
            "version": 3,
            "shape": (3,),
            "typestr": "<i4",
            "data": (0, False),
            "strides": (6,),
        }

    with pytest.raises(ValueError, match="__cuda_array_interface__: stride 6 is not a multiple"):
        cb.asarray(Cai())


def test_bytearray_view_is_writable_and_shared():
    buf = bytearray(4)
    a = cb.asarray(buf)
    cb.add(a, cb.full((4,), 5, dtype="uint8"), out=a)
    assert buf == bytearray(b"\x05\x05\x05\x05")


def test_raw_capsules_from_numpy():
    ref = np.arange(6, dtype=np.int16)
    for cap in (ref.__dlpack__(), ref.__dlpack__(max_version=(1, 0))):
        a = cb.from_dlpack(cap)
        assert a.data_ptr == ref.ctypes.data
        np.testing.assert_array_equal(a.to_numpy(), ref)


class LegacyProducer:
    """A producer whose __dlpack__ predates max_version, like older libraries."""

    def __init__(self, arr):
        self.arr = arr
        self.calls = []

    def __dlpack__(self, stream=None):
        self.calls.append(stream)
        return self.arr.__dlpack__()

    def __dlpack_device__(self):
        return (1, 0)


def test_producer_without_max_version_falls_back_to_legacy():
    ref = np.arange(3, dtype=np.float32)
    p = LegacyProducer(ref)
    a = cb.from_dlpack(p)
    assert a.data_ptr == ref.ctypes.data
    assert p.calls  # asked the legacy way after the versioned request failed


class _CountingMeta(type):
    """Counts the attribute lookups that miss on its classes (``__getattr__`` of a metaclass
    runs only for a class attribute that is not there)."""

    misses: list = []

    def __getattr__(cls, name):
        _CountingMeta.misses.append(name)
        raise AttributeError(name)


class _CountedProducer(metaclass=_CountingMeta):
    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return self.arr.__dlpack__(max_version=max_version)

    def __dlpack_device__(self):
        return (1, 0)


def test_a_producer_type_is_asked_for_an_exchange_table_once():
    """Every import of a producer without a DLPack C exchange table (CuPy, JAX, Numba) looked
    for one three or four times, each lookup raising and swallowing an AttributeError: about
    half of cubridge's cost of a CuPy import."""
    ref = np.arange(4, dtype=np.float32)
    out = np.empty(4, np.float32)
    first = _CountedProducer(ref)
    np.testing.assert_array_equal(cb.from_dlpack(first).to_numpy(), ref)
    asked = _CountingMeta.misses.count("__dlpack_c_exchange_api__")
    assert asked >= 1
    for _ in range(5):
        p = _CountedProducer(ref)
        assert cb.from_dlpack(p).data_ptr == ref.ctypes.data
        cb.add(p, _CountedProducer(ref), out=_CountedProducer(out))
        np.testing.assert_array_equal(out, ref + ref)
    assert _CountingMeta.misses.count("__dlpack_c_exchange_api__") == asked


class _Misannounced:
    """Announces a CUDA device but exports host memory (or the reverse): the stream it was
    handed (or not) was chosen for the wrong device."""

    def __init__(self, arr, announced):
        self.arr, self.announced = arr, announced

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return self.arr.__dlpack__(max_version=max_version)

    def __dlpack_device__(self):
        return self.announced


def test_a_capsule_on_another_device_than_announced_is_refused():
    ref = np.arange(3, dtype=np.float32)
    with pytest.raises(ValueError, match=r"announced DLPack device \(2, 0\).*cpu"):
        cb.from_dlpack(_Misannounced(ref, (2, 0)))
    # Pinned memory announced, host memory exported: host memory either way (PyTorch's pinned
    # tensors do this).
    assert cb.from_dlpack(_Misannounced(ref, (3, 0))).data_ptr == ref.ctypes.data


class _DeviceFails:
    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return np.arange(3, dtype=np.float32).__dlpack__(max_version=max_version)

    def __dlpack_device__(self):
        raise RuntimeError("no device today")


def test_a_failing_dlpack_device_is_not_taken_for_a_host_producer():
    """The stream handed to a producer depends on the device it announces: an error there is
    the producer's answer, not an announcement of host memory."""
    with pytest.raises(BufferError, match="refused: no device today"):
        cb.from_dlpack(_DeviceFails())


class _Bytes(bytearray):
    """A buffer-protocol type whose instances may carry a ``__dlpack__`` of their own."""


def test_dlpack_on_some_instances_of_a_type_only():
    """What cubridge learns of a type once (whether it has ``__dlpack__``) must not hide an
    instance attribute, nor lend one instance's protocol to another."""
    plain = _Bytes(b"\x01\x02\x03\x04")
    floats = np.array([1.5, -2.0], dtype=np.float32)
    special = _Bytes(8)
    special.__dlpack__ = lambda *, stream=None, max_version=None, **kw: floats.__dlpack__(
        max_version=max_version
    )
    for obj, ref in [(plain, np.frombuffer(bytes(plain), np.uint8)), (special, floats)] * 2:
        got = cb.from_dlpack(obj)
        assert got.dtype == ref.dtype
        np.testing.assert_array_equal(got.to_numpy(), ref)
        np.testing.assert_array_equal(cb.add(obj, 0).to_numpy(), ref)


class _NdarraySub(np.ndarray):
    exports = 0

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        type(self).exports += 1
        return np.asarray(self).__dlpack__(max_version=max_version)


def test_numpy_subclasses_are_asked_through_their_own_dlpack():
    """numpy's own arrays are read from numpy's array object, by one type comparison; a
    subclass is not numpy's array and may export otherwise."""
    ref = np.arange(5, dtype=np.float64)
    sub = ref.view(_NdarraySub)
    for _ in range(3):
        assert cb.from_dlpack(ref).data_ptr == ref.ctypes.data
        got = cb.from_dlpack(sub)
        assert got.data_ptr == ref.ctypes.data
        np.testing.assert_array_equal(got.to_numpy(), ref)
        np.testing.assert_array_equal(cb.add(sub, ref).to_numpy(), ref + ref)
    assert _NdarraySub.exports == 6


def test_a_producer_class_changed_after_its_first_import_is_followed():
    """Methods replaced on, removed from and put back on a producer's class after cubridge
    has met the class: each import follows the class as it is now."""

    class Morphing(bytearray):
        pass

    floats = np.array([1.0, 2.0], dtype=np.float32)
    shorts = np.array([7, -8, 9], dtype=np.int16)

    def as_floats(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return floats.__dlpack__(max_version=max_version)

    def as_shorts(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return shorts.__dlpack__(max_version=max_version)

    obj = Morphing(b"\x05\x06")
    cases = [
        (as_floats, floats),
        (as_shorts, shorts),
        (None, np.array([5, 6], np.uint8)),  # no __dlpack__: the buffer protocol
        (as_floats, floats),
    ]
    for method, ref in cases:
        if method is None:
            del Morphing.__dlpack__
        else:
            Morphing.__dlpack__ = method
        for _ in range(2):
            got = cb.from_dlpack(obj)
            assert got.dtype == ref.dtype
            np.testing.assert_array_equal(got.to_numpy(), ref)
            out = np.zeros_like(ref)
            cb.add(obj, ref, out=out)
            np.testing.assert_array_equal(out, ref + ref)


def test_asarray_sequences_scalars_and_dtypes():
    assert cb.asarray([[1, 2], [3, 4]]).dtype == "int64"
    assert cb.asarray([1.5, 2]).dtype == "float32"
    assert cb.asarray(True).shape == ()
    assert cb.asarray([1j]).dtype == "complex64"
    assert cb.asarray([]).shape == (0,)
    np.testing.assert_array_equal(
        cb.asarray([[1, 2], [3, 4]], dtype="float64").to_numpy(), [[1.0, 2.0], [3.0, 4.0]]
    )
    with pytest.raises(ValueError, match="inconsistent"):
        cb.asarray([[1, 2], [3]])
    with pytest.raises(TypeError):
        cb.asarray([1, "x"])
    with pytest.raises(TypeError):
        cb.asarray(object())


def test_lists_of_numpy_scalars_keep_their_dtype():
    """`asarray([np.float64(1e300)])` gave float32 [inf], and [np.float64(0.1)] was rounded,
    while numpy and torch give float64."""
    for values in (
        [np.float64(1e300)],
        [np.float64(0.1), 0.2],
        [np.int32(1), np.float32(2.5)],
        [np.int8(1), 2],
        [np.float32(1.5), 2.5],
        [[np.complex64(1j)], [2.0]],
        [np.uint8(200), True],
    ):
        got = cb.asarray(values)
        want = np.asarray(values)
        assert got.dtype == str(want.dtype), values
        np.testing.assert_array_equal(got.to_numpy(), want)
    # Python values alone keep the Array API's float32 default.
    assert cb.asarray([0.1, 2]).dtype == "float32"


def test_sequences_are_cast_to_a_given_dtype_as_numpy_does():
    """`asarray([0, 1, 0], dtype='bool')` and `asarray([1.5], dtype='int32')` were TypeErrors
    while the same values as an ndarray were cast."""
    for values, dtype in (
        ([0, 1, 0], "bool"),
        ([1.5, -2.7, 0.2], "int32"),
        ([0.0, 0.5], "bool"),
        ([[1.9], [3.0]], "uint8"),
        ([True, 2.5], "int16"),
    ):
        got = cb.asarray(values, dtype=dtype).to_numpy()
        np.testing.assert_array_equal(got, np.asarray(values, dtype=dtype))
        assert got.dtype == np.dtype(dtype)
    with pytest.raises(OverflowError):
        cb.asarray([300], dtype="int8")
    with pytest.raises(OverflowError):
        cb.asarray([1e30], dtype="int64")
    with pytest.raises(ValueError):
        cb.asarray([float("nan")], dtype="int32")
    with pytest.raises(TypeError):
        cb.asarray([1j], dtype="float32")


def test_asarray_copy_rules():
    ref = np.arange(4, dtype=np.int32)
    assert cb.asarray(ref).data_ptr == ref.ctypes.data
    c = cb.asarray(ref, copy=True)
    assert c.data_ptr != ref.ctypes.data
    np.testing.assert_array_equal(c.to_numpy(), ref)
    cast = cb.asarray(ref, dtype="float64")
    assert cast.dtype == "float64"
    np.testing.assert_array_equal(cast.to_numpy(), ref.astype(np.float64))
    with pytest.raises(ValueError, match="copy=False"):
        cb.asarray(ref, dtype="float64", copy=False)
    with pytest.raises(ValueError, match="copy=False"):
        cb.asarray([1, 2], copy=False)
    with pytest.raises(cb.CudaUnavailableError) if not cb.cuda.is_available() else _noop():
        cb.asarray(ref, device="cuda")


class _noop:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_from_dlpack_device_argument():
    ref = np.arange(3.0)
    a = cb.from_dlpack(ref, device="cpu")
    assert a.data_ptr == ref.ctypes.data
    with pytest.raises(ValueError, match="unknown device"):
        cb.from_dlpack(ref, device="tpu")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_conversions_into_half_precision_round_once(dtype):
    """float64 values, Python floats and large integers went into float16 and bfloat16 through
    float32 or with their low bits dropped, rounding twice: asarray([1 + 2**-11 + 2**-40],
    dtype="float16") was 1.0 (numpy: 1.001), and 65520 - 2**-20 became inf (numpy: 65504)."""
    for values, source in ((NEAR_TIES[dtype], "float64"), (INT_NEAR_TIES[dtype], "int64")):
        want = [rounded(v, dtype) for v in values]
        if dtype == "float16":  # numpy rounds these once too
            with np.errstate(over="ignore"):
                np.testing.assert_array_equal(np.asarray(values, dtype=np.float16), want)
        from_list = cb.asarray(values, dtype=dtype)
        from_array = cb.asarray(np.asarray(values, dtype=source), dtype=dtype)
        for got in (from_list, from_array):
            assert got.dtype == dtype
            np.testing.assert_array_equal(float_values(got), want, err_msg=str(values))


# Integers past 128 bits (and just past i128), with bits far below the leading ones that decide
# a rounding into float32 or bfloat16.
WIDE_INTS = [10**40, -(10**40), 2**127, 2**127 + 2**103 + 1, -(2**127 + 2**119 + 1),
             2**128 - 2**103, 3**600, 2**1024 - 2**971]  # fmt: skip


def test_integers_past_128_bits_convert_to_floating_dtypes():
    """asarray([10**40], dtype="float64") and add(float64 array, 10**40) refused integers
    wider than 128 bits, which numpy converts to the nearest float."""
    for dtype in ("float64", "float32", "float16", "bfloat16"):
        want = [rounded(v, dtype) for v in WIDE_INTS]
        with np.errstate(over="ignore"):
            if dtype == "float64":
                assert want == [float(v) for v in WIDE_INTS]
                np.testing.assert_array_equal(np.asarray(WIDE_INTS, dtype=np.float64), want)
        np.testing.assert_array_equal(float_values(cb.asarray(WIDE_INTS, dtype=dtype)), want)
    got = cb.asarray(WIDE_INTS, dtype="complex128").to_numpy()
    np.testing.assert_array_equal(got, np.asarray(WIDE_INTS, dtype=np.complex128))
    np.testing.assert_array_equal(cb.asarray([10**40], dtype="bool").to_numpy(), [True])
    # Past float64's range numpy refuses, and so does cubridge; integer dtypes refuse them all.
    for dtype in ("float64", "float32", "complex128"):
        with pytest.raises(OverflowError):
            np.asarray([2**1024 - 2**970], dtype=dtype)
        with pytest.raises(OverflowError):
            cb.asarray([2**1024 - 2**970], dtype=dtype)
    for dtype in ("int64", "uint64", "int8"):
        with pytest.raises(OverflowError):
            cb.asarray([10**40], dtype=dtype)
    with pytest.raises(OverflowError):
        cb.asarray([10**40])  # no dtype holds it (numpy makes an object array)


class _Squares(collections.abc.Sequence):
    """A sequence that is neither a list nor a tuple."""

    def __len__(self):
        return 3

    def __getitem__(self, i):
        if not 0 <= i < 3:
            raise IndexError(i)
        return i * i


def test_asarray_takes_any_sequence_and_arrays_among_its_elements():
    """range, collections.deque, other sequences, and lists of 0-d arrays (cubridge's,
    torch's) were refused, where numpy and torch take them."""
    cases = [
        range(5),
        range(3, -7, -2),
        collections.deque([1, -2]),
        [range(2), (3, 4)],
        _Squares(),
        [_Squares(), [1, 2, 3]],
        [np.arange(3, dtype=np.int16), [4, 5, 6]],
        [np.float32(1), np.array(2.5, dtype=np.float32), 3],
        [cb.asarray(1.5, dtype="float64"), cb.asarray(2, dtype="int8")],
        [[cb.asarray(np.arange(2, dtype=np.uint8))], [[7, 8]]],
    ]
    if torch is not None:
        cases.append([torch.tensor(1.5), torch.tensor(2, dtype=torch.int16)])
        cases.append([torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)])
    for values in cases:
        want = np.asarray(values)
        got = cb.asarray(values)
        assert got.dtype == str(want.dtype), (values, got.dtype, want.dtype)
        np.testing.assert_array_equal(got.to_numpy(), want, err_msg=repr(values))
    assert cb.asarray(range(4), dtype="float16").to_numpy().tolist() == [0, 1, 2, 3]
    floats = cb.asarray(collections.deque([1.5, 2.5]))  # Python floats alone: float32
    np.testing.assert_array_equal(floats.to_numpy(), np.array([1.5, 2.5], dtype=np.float32))
    if torch is not None:  # a dtype numpy has not
        got = cb.asarray([torch.tensor(1.5, dtype=torch.bfloat16), torch.ones(1)[0].bfloat16() * 2])
        assert got.dtype == "bfloat16"
        np.testing.assert_array_equal(float_values(got), [1.5, 2.0])
    # Text is no sequence of numbers; ragged arrays are refused as ragged lists are.
    for bad, error in (("ab", TypeError), (["ab"], TypeError), ([np.arange(2), [1]], ValueError)):
        with pytest.raises(error):
            cb.asarray(bad)


def test_python_values_into_integer_and_bool_dtypes_convert_as_numpy():
    """An infinite float into an integer dtype raised ValueError where numpy (and Python's
    int()) raise OverflowError; a complex value into bool was a TypeError where numpy takes
    its truth."""
    for dtype in ("int8", "uint64"):
        for v in (float("inf"), float("-inf")):
            with pytest.raises(OverflowError):
                np.asarray([v], dtype=dtype)
            with pytest.raises(OverflowError):
                cb.asarray([v], dtype=dtype)
        with pytest.raises(ValueError):
            cb.asarray([float("nan")], dtype=dtype)
    values = [1j, 0j, complex(0.0, -0.0), complex(float("nan"), 0)]
    np.testing.assert_array_equal(
        cb.asarray(values, dtype="bool").to_numpy(), np.asarray(values, dtype=bool)
    )
