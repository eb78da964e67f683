"""Exporting cubridge arrays: DLPack (legacy and versioned capsules), the buffer protocol, and
the consumers numpy, torch and jax. Values are checked against numpy; zero-copy by pointers."""

import ctypes
import gc

import cubridge as cb
import numpy as np
import pytest
from conftest import (
    ALL_DTYPES,
    NUMPY_DTYPES,
    _try_import,
    jax,
    jnp,
    needs_jax,
    needs_torch,
    run_child,
    sample,
    torch,
)


def capsule_name(capsule):
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    return get_name(capsule).decode()


def test_dlpack_device_and_capsule_kinds():
    a = cb.zeros((2, 3))
    assert a.__dlpack_device__() == (1, 0)
    assert capsule_name(a.__dlpack__()) == "dltensor"
    assert capsule_name(a.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
    assert capsule_name(a.__dlpack__(max_version=(2, 5))) == "dltensor_versioned"
    assert capsule_name(a.__dlpack__(max_version=(0, 8))) == "dltensor"
    # Every call is a fresh capsule.
    assert a.__dlpack__() is not a.__dlpack__()


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_reads_every_dtype_zero_copy(dtype):
    ref = sample((3, 4), dtype)
    a = cb.asarray(ref)
    n = np.from_dlpack(a)
    assert n.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(n, ref)
    assert n.ctypes.data == a.data_ptr
    # The buffer protocol shares the same memory.
    assert np.asarray(a).ctypes.data == a.data_ptr
    assert memoryview(a).nbytes == ref.nbytes


@needs_torch
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_torch_reads_every_dtype_zero_copy(dtype):
    from conftest import torch_sample

    ref = torch_sample((3, 4), dtype)
    a = cb.from_dlpack(ref.clone())
    t = torch.from_dlpack(a)
    assert t.dtype == ref.dtype
    assert torch.equal(t, ref)
    assert t.data_ptr() == a.data_ptr


@needs_jax
@pytest.mark.parametrize("dtype", [d for d in NUMPY_DTYPES if d not in ("uint16",)] + ["uint16"])
def test_jax_reads_every_numpy_dtype(dtype):
    ref = sample((2, 5), dtype)
    a = cb.asarray(ref)
    j = jnp.from_dlpack(a)
    np.testing.assert_array_equal(np.asarray(j), ref)


@needs_jax
def test_jax_reads_bfloat16():
    a = cb.asarray([1.5, -2.0, 3.25], dtype="bfloat16")
    j = jnp.from_dlpack(a)
    assert j.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(j.astype(jnp.float32)), [1.5, -2.0, 3.25])


@pytest.mark.parametrize(
    "view",
    [
        lambda x: x.T,
        lambda x: x[1:, ::2],
        lambda x: x[::-1],
        lambda x: x[:, ::-2],
        lambda x: np.broadcast_to(x[:1], (3, 4)),
        lambda x: x[1:2, 2:3].reshape(()),
        lambda x: x[:0],
    ],
    ids=["transposed", "sliced", "negative", "negative2", "broadcast", "0d", "empty"],
)
def test_strided_views_export_their_strides(view):
    base = sample((3, 4), "int32")
    v = view(base)
    a = cb.asarray(v)
    assert a.shape == v.shape
    assert a.strides == tuple(s // 4 for s in v.strides)
    n = np.from_dlpack(a)
    np.testing.assert_array_equal(n, v)
    if v.size:
        assert n.ctypes.data == v.ctypes.data


def test_export_outlives_the_array():
    a = cb.arange(10, dtype="int64")
    ptr = a.data_ptr
    n = np.from_dlpack(a)
    del a
    gc.collect()
    np.testing.assert_array_equal(n, np.arange(10))
    assert n.ctypes.data == ptr


def test_capsule_outlives_the_array_and_is_single_use():
    a = cb.arange(4, dtype="float64")
    cap = a.__dlpack__(max_version=(1, 0))
    del a
    gc.collect()
    v = cb.from_dlpack(cap)
    assert capsule_name(cap) == "used_dltensor_versioned"
    np.testing.assert_array_equal(np.from_dlpack(v), np.arange(4.0))
    with pytest.raises(ValueError, match="consumed"):
        cb.from_dlpack(cap)


def test_unconsumed_capsule_is_freed():
    a = cb.zeros((1000,))
    for _ in range(100):
        a.__dlpack__()
        a.__dlpack__(max_version=(1, 0))
    gc.collect()


def test_copy_true_makes_a_flagged_copy():
    a = cb.arange(5, dtype="int32")
    n = np.from_dlpack(a, copy=True)
    assert n.ctypes.data != a.data_ptr
    np.testing.assert_array_equal(n, np.arange(5))
    # The versioned capsule carries IS_COPIED: cubridge's own import reports it through copy=False.
    cap = a.__dlpack__(max_version=(1, 0), copy=True)
    v = cb.from_dlpack(cap)
    assert v.data_ptr != a.data_ptr


def test_dl_device_cpu_is_zero_copy_and_other_devices_refuse_without_copy():
    a = cb.arange(3, dtype="float32")
    n = np.from_dlpack(a, device="cpu")
    assert n.ctypes.data == a.data_ptr
    with pytest.raises(BufferError):
        a.__dlpack__(dl_device=(2, 0), copy=False)
    with pytest.raises(BufferError):
        a.__dlpack__(dl_device=(10, 0))  # ROCm


def test_dl_device_that_cannot_be_served_is_a_buffer_error():
    """The DLPack standard's refusal for a device the producer cannot serve: a device type
    cubridge has not, a CUDA device that does not exist, CUDA where there is none."""
    a = cb.arange(3, dtype="float32")
    for device in [(4, 0), (2, 1 << 20)]:
        with pytest.raises(BufferError):
            a.__dlpack__(dl_device=device)
        with pytest.raises(BufferError):
            a.__dlpack__(dl_device=device, max_version=(1, 0))
    if not cb.cuda.is_available():
        for device in [(2, 0), (3, 0), (13, 0)]:
            with pytest.raises(BufferError):
                a.__dlpack__(dl_device=device)


@pytest.mark.parametrize("stream", [object(), 1.5, "1", [1]], ids=repr)
def test_dlpack_stream_of_another_type_is_a_type_error(stream):
    """As torch's: a stream is None or an int (the DLPack standard's tests expect it)."""
    with pytest.raises(TypeError, match="stream"):
        cb.arange(3).__dlpack__(stream=stream)
    with pytest.raises(TypeError, match="stream"):
        cb.arange(3).__dlpack__(stream=stream, max_version=(1, 0))


def test_read_only_views_export_read_only():
    ref = np.arange(6, dtype=np.int16)
    ref.flags.writeable = False
    a = cb.asarray(ref)
    assert a.readonly
    with pytest.raises(BufferError):
        a.__dlpack__()  # the legacy ABI cannot carry the flag
    n = np.from_dlpack(a)  # numpy asks for a versioned capsule
    assert not n.flags.writeable
    assert memoryview(a).readonly
    with pytest.raises((BufferError, TypeError), match="read-only|not writable"):
        # A writable buffer request is refused.
        ctypes.c_char.from_buffer(a)


def test_buffer_protocol_formats_and_bfloat16():
    for dtype in NUMPY_DTYPES:
        m = memoryview(cb.zeros((2,), dtype=dtype))
        assert np.asarray(m).dtype == np.dtype(dtype)
    with pytest.raises(BufferError, match="bfloat16"):
        memoryview(cb.zeros((2,), dtype="bfloat16"))


def test_bfloat16_arrays_reach_numpy_through_ml_dtypes_or_a_clear_error():
    """`np.asarray(a)` of a bfloat16 Array gave a 0-d object array."""
    a = cb.asarray([1.0, -2.5, 3.0], dtype="bfloat16")
    ml_dtypes = _try_import("ml_dtypes")
    if ml_dtypes is not None:
        n = np.asarray(a)
        assert n.dtype == ml_dtypes.bfloat16 and n.shape == (3,)
        np.testing.assert_array_equal(n.astype(np.float32), [1.0, -2.5, 3.0])
    code = (
        "import sys\n"
        "sys.modules['ml_dtypes'] = None\n"
        "import numpy as np, cubridge as cb\n"
        "a = cb.asarray([1.0], dtype='bfloat16')\n"
        "try:\n"
        "    np.asarray(a)\n"
        "    print('converted')\n"
        "except TypeError as e:\n"
        "    print('TypeError', 'bfloat16' in str(e))\n"
    )
    assert run_child(code).stdout.strip() == "TypeError True"
    # Other dtypes still come through the buffer protocol, sharing memory.
    x = cb.arange(4, dtype="int16")
    assert np.asarray(x).dtype == np.int16 and np.asarray(x).ctypes.data == x.data_ptr


def test_memoryview_writes_reach_the_array():
    a = cb.zeros((4,), dtype="int32")
    np.asarray(a)[2] = 7
    np.testing.assert_array_equal(a.to_numpy(), [0, 0, 7, 0])


@needs_torch
def test_torch_tensor_keeps_cubridge_memory_alive():
    a = cb.arange(8, dtype="float32")
    t = torch.from_dlpack(a)
    del a
    gc.collect()
    assert torch.equal(t, torch.arange(8, dtype=torch.float32))


@needs_jax
def test_jax_array_from_cubridge_survives_deletion():
    a = cb.arange(8, dtype="int32")
    j = jnp.from_dlpack(a)
    del a
    gc.collect()
    assert jax.device_get(j).tolist() == list(range(8))


def test_the_c_exchange_table_exports_imports_and_allocates():
    from dlpack_ctypes import (
        _MANAGED_P,
        SET_ERROR,
        DLDataType,
        DLDevice,
        DLTensor,
        exchange_api,
    )

    api = exchange_api(cb.Array)
    assert (api.header.version.major, api.header.version.minor) >= (1, 3)
    assert api.dltensor_from_py_object_no_sync is None  # no borrowed view is published

    x = cb.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    out = _MANAGED_P()
    assert api.managed_tensor_from_py_object_no_sync(x, ctypes.byref(out)) == 0
    t = out.contents.dl_tensor
    assert t.data == np.asarray(x).ctypes.data  # zero-copy
    assert (t.ndim, t.shape[0], t.shape[1], t.strides[0], t.strides[1]) == (2, 3, 4, 4, 1)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (2, 32, 1)
    # The managed tensor keeps the memory alive after the array is gone.
    data = t.data
    del x
    gc.collect()
    view = np.ctypeslib.as_array(ctypes.cast(data, ctypes.POINTER(ctypes.c_float)), (12,))
    np.testing.assert_array_equal(view, np.arange(12, dtype=np.float32))

    # Back into a cubridge.Array, which takes over the managed tensor (its deleter runs once,
    # when the array goes).
    obj = ctypes.py_object()
    assert api.managed_tensor_to_py_object_no_sync(out, ctypes.byref(obj)) == 0
    back = obj.value
    assert isinstance(back, cb.Array) and back.shape == (3, 4) and back.dtype == "float32"
    np.testing.assert_array_equal(np.asarray(back), np.arange(12).reshape(3, 4))

    stream = ctypes.c_void_p(1234)
    assert api.current_work_stream(1, 0, ctypes.byref(stream)) == 0
    assert stream.value is None  # the legacy default stream (NULL)

    # The allocator makes a new cubridge array of the prototype's shape, dtype and device, and
    # reports what it cannot make through the consumer's error callback.
    errors = []
    on_error = SET_ERROR(lambda ctx, kind, message: errors.append((kind, message)))
    shape = (ctypes.c_int64 * 2)(5, 7)
    prototype = DLTensor(None, DLDevice(1, 0), 2, DLDataType(0, 16, 1), shape, None, 0)
    fresh = _MANAGED_P()
    assert (
        api.managed_tensor_allocator(ctypes.byref(prototype), ctypes.byref(fresh), None, on_error)
        == 0
    )
    t = fresh.contents.dl_tensor
    assert (t.ndim, t.shape[0], t.shape[1], t.dtype.code, t.dtype.bits) == (2, 5, 7, 0, 16)
    assert t.data % 64 == 0 and errors == []
    fresh.contents.deleter(ctypes.cast(fresh, ctypes.c_void_p))
    prototype.dtype = DLDataType(2, 8, 1)  # no 8-bit float in cubridge
    assert (
        api.managed_tensor_allocator(ctypes.byref(prototype), ctypes.byref(fresh), None, on_error)
        == -1
    )
    assert not fresh and len(errors) == 1 and b"8" in errors[0][1]

    # Malformed prototypes are refused through the callback, not read: a NULL shape, a negative
    # extent, more than 64 dimensions.
    prototype.dtype = DLDataType(2, 32, 1)
    bad = [
        DLTensor(None, DLDevice(1, 0), 2, DLDataType(2, 32, 1), None, None, 0),
        DLTensor(None, DLDevice(1, 0), 2, DLDataType(2, 32, 1), (ctypes.c_int64 * 2)(3, -1), None, 0),
        DLTensor(None, DLDevice(1, 0), 65, DLDataType(2, 32, 1), (ctypes.c_int64 * 65)(*[1] * 65), None, 0),
    ]  # fmt: skip
    for k, proto in enumerate(bad):
        rc = api.managed_tensor_allocator(ctypes.byref(proto), ctypes.byref(fresh), None, on_error)
        assert rc == -1 and not fresh and len(errors) == 2 + k, (k, errors)


def test_as_strided_and_transpose_are_views_checked_against_numpy():
    base = np.arange(35, dtype=np.int16).reshape(5, 7)
    a = cb.asarray(base, copy=True)
    cases = [((3, 4), (7, 1), 9), ((3, 4), (7, -1), 12), ((3, 4), (0, 1), 0), ((), (), 34),
             ((0, 4), (7, 1), 5), ((4, 3), (1, 7), 0)]  # fmt: skip
    for shape, strides, offset in cases:
        v = a.as_strided(shape, strides, offset)
        expected = (
            np.lib.stride_tricks.as_strided(
                base.reshape(-1)[offset:], shape, [s * 2 for s in strides]
            )
            if not any(s < 0 for s in strides)
            else base[1:4, 5:1:-1]
        )
        np.testing.assert_array_equal(np.from_dlpack(v), expected)
        assert v.shape == shape and v.strides == strides
        if v.size:
            assert v.data_ptr == a.data_ptr + 2 * offset
    t = a.T
    assert t.shape == (7, 5) and t.strides == (1, 7) and t.data_ptr == a.data_ptr
    np.testing.assert_array_equal(np.from_dlpack(t), base.T)
    # A view keeps the memory alive and refuses to reach outside it.
    view = a.as_strided((3,), (1,), 32)
    del a
    np.testing.assert_array_equal(view.to_numpy(), [32, 33, 34])
    for shape, strides, offset in [((36,), (1,), 0), ((2,), (1,), -1), ((3,), (1,), 1),
                                   ((2,), (-1,), 0), ((-1,), (1,), 0), ((2, 2), (1,), 0)]:  # fmt: skip
        with pytest.raises(ValueError):
            view.as_strided(shape, strides, offset)
