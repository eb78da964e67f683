"""Errors are typed and clear: the exception classes, CUDA on a machine without it, bad
arguments, capsule misuse."""

import re

import cubridge as cb
import numpy as np
import pytest


def test_exception_hierarchy():
    for exc in (cb.CudaError, cb.CompileError, cb.CudaUnavailableError):
        assert issubclass(exc, RuntimeError)


@pytest.mark.skipif(cb.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_requests_without_cuda_raise_cuda_unavailable():
    assert cb.cuda.device_count() == 0
    for device in ("cuda", "cuda:0", "cuda_host", "cuda_managed"):
        with pytest.raises(cb.CudaUnavailableError, match="CUDA is not available"):
            cb.zeros((2,), device=device)
    with pytest.raises(cb.CudaUnavailableError):
        cb.arange(3).to_device("cuda:0")
    # The CPU path keeps working after the refusals.
    np.testing.assert_array_equal(cb.add(np.ones(2), np.ones(2)).to_numpy(), [2.0, 2.0])


def test_bad_creation_arguments():
    with pytest.raises(ValueError, match="negative"):
        cb.zeros((2, -1))
    with pytest.raises(TypeError, match="unsupported dtype"):
        cb.zeros((2,), dtype="float8")
    with pytest.raises(ValueError, match="unknown device"):
        cb.zeros((2,), device="gpu")
    with pytest.raises(TypeError):
        cb.zeros("abc")
    with pytest.raises(TypeError):
        cb.full((2,), 1.5, dtype="int32")
    with pytest.raises(ValueError):
        cb.arange(0, 1, 0)
    with pytest.raises(MemoryError):
        cb.empty((1 << 62,), dtype="int8")


def test_memory_errors_name_the_bytes_asked_for_and_the_device():
    n = 1 << 60
    with pytest.raises(MemoryError, match=f"could not allocate {4 * n} bytes on cpu"):
        cb.empty((n,), dtype="int32")


def test_dtype_and_device_objects():
    assert cb.float32 == "float32" and str(cb.float32) == "float32"
    assert cb.dtype(np.float16) == cb.float16
    assert cb.dtype(np.dtype("int8")) == "int8"
    assert hash(cb.int64) == hash("int64")
    assert {cb.bool: 1}["bool"] == 1
    d = cb.zeros(1).device
    assert d == "cpu" and str(d) == "cpu" and d.type == "cpu" and d.index is None
    assert cb.Device("cuda:3").index == 3
    assert repr(cb.zeros((2, 3))) == "cubridge.Array(shape=(2, 3), dtype=float32, device=cpu)"


class TorchLikeDevice:
    """What cubridge reads of a torch.device: a string `type` and an int or None `index`."""

    def __init__(self, type, index=None):
        self.type, self.index = type, index

    def __repr__(self):
        return f"TorchLikeDevice({self.type!r}, {self.index!r})"


class CupyLikeDevice:
    """What cubridge reads of a cupy.cuda.Device: its module and its `id`."""

    __module__ = "cupy.cuda.device"

    def __init__(self, id):
        self.id = id

    def __repr__(self):
        return f"CupyLikeDevice({self.id})"


def _torch_devices():
    torch = pytest.importorskip("torch")
    return [(torch.device("cuda", 1), "cuda:1"), (torch.device("cpu"), "cpu")]


DEVICE_FORMS = [
    (0, "cuda:0"),
    (3, "cuda:3"),
    ("cuda:2", "cuda:2"),
    ("cpu", "cpu"),
    ("cuda_host", "cuda_host"),
    (cb.Device("cuda:1"), "cuda:1"),
    (TorchLikeDevice("cuda", 2), "cuda:2"),
    (TorchLikeDevice("cpu", 0), "cpu"),
    (CupyLikeDevice(1), "cuda:1"),
]
BAD_DEVICES = [-1, True, 1.5, "gpu", "0", [0], TorchLikeDevice("meta"), np.float32(0), 1 << 40]


def test_every_device_form_that_torch_and_cupy_users_pass_names_its_device():
    for form, name in DEVICE_FORMS + _torch_devices():
        d = cb.Device(form)
        assert d == name and str(d) == name, (form, name)


@pytest.mark.parametrize("bad", BAD_DEVICES, ids=repr)
def test_device_errors_list_the_accepted_forms(bad):
    with pytest.raises((ValueError, TypeError), match="unknown device") as info:
        cb.Device(bad)
    for form in ('"cuda:N"', "an int N", "torch.device", "cupy.cuda.Device", '"cpu"'):
        assert form in str(info.value)
    with pytest.raises((ValueError, TypeError), match="unknown device"):
        cb.zeros(2, device=bad)


def _device_takers():
    """Every call that takes a device, as f(device)."""
    k = cb.RawKernel('extern "C" __global__ void f() {}', "f")
    return {
        "memory_stats": cb.cuda.memory_stats,
        "empty_cache": cb.cuda.empty_cache,
        "synchronize": cb.cuda.synchronize,
        "mem_info": cb.cuda.mem_info,
        "Stream": cb.cuda.Stream,
        "compile": k.compile,
        "to_device": cb.arange(3).to_device,
        "asarray": lambda d: cb.asarray(np.arange(3), device=d),
        "from_dlpack": lambda d: cb.from_dlpack(np.arange(3), device=d),
        "zeros": lambda d: cb.zeros(3, device=d),
        "empty": lambda d: cb.empty(3, device=d),
        "full": lambda d: cb.full(3, 1, device=d),
        "arange": lambda d: cb.arange(3, device=d),
    }


@pytest.mark.skipif(cb.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("taker", list(_device_takers()))
def test_every_device_argument_reads_every_form(taker):
    """Without CUDA, a CUDA device in any form reaches the driver check (CudaUnavailableError),
    never a parse error; the cuda functions' default (None) is the current CUDA device."""
    call = _device_takers()[taker]
    forms = [f for f, name in DEVICE_FORMS + _torch_devices() if name.startswith("cuda:")]
    if taker in ("memory_stats", "empty_cache", "synchronize", "mem_info", "Stream", "compile"):
        forms.append(None)
    for form in forms:
        with pytest.raises(cb.CudaUnavailableError):
            call(form)


NUMPY_ALIASES = [
    np.longlong, np.ulonglong, np.intc, np.uintc, np.int_, np.intp, np.double, np.single,
    np.half, np.csingle, np.cdouble, np.bool_, np.byte, np.ubyte, np.short, np.ushort,
]  # fmt: skip


@pytest.mark.parametrize("alias", NUMPY_ALIASES, ids=lambda t: t.__name__)
def test_numpy_dtypes_of_any_spelling_are_dtypes(alias):
    """numpy's dtype and scalar type of every alias are accepted as dtypes and compare equal to
    cubridge's (both ways round), as numpy's own dtype does; other dtypes compare unequal."""
    want = np.dtype(alias)
    a = cb.zeros(3, dtype=alias)
    assert np.asarray(a).dtype == want
    for other in (alias, want, want.name):
        assert a.dtype == other and other == a.dtype and not (a.dtype != other)
    assert cb.dtype(alias) == cb.dtype(want.name)
    wrong = np.float32 if want != np.float32 else np.float64
    assert a.dtype != wrong and a.dtype != np.dtype(wrong) and wrong != a.dtype


DTYPE_NAMES = (
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 "
    "float16 bfloat16 float32 float64 complex64 complex128"
).split()


@pytest.mark.parametrize("bad", ["float8", "f4", "", object()])
def test_dtype_errors_list_the_accepted_names(bad):
    with pytest.raises(TypeError, match="unsupported dtype") as info:
        cb.zeros(2, dtype=bad)
    message = str(info.value)
    missing = [n for n in DTYPE_NAMES if not re.search(rf"\b{n}\b", message)]
    assert not missing, message
    # Every name the message offers is accepted.
    for name in DTYPE_NAMES:
        assert cb.dtype(name).name == name


def test_dtype_equality_refuses_what_numpy_tells_apart():
    assert cb.float32 != np.dtype(">f4")
    assert cb.float32 != "f4" and cb.float32 != object()
    for bad in (np.dtype(">f4"), np.datetime64, np.dtype("U3")):
        with pytest.raises(TypeError, match="unsupported dtype"):
            cb.zeros(2, dtype=bad)


def test_array_attributes():
    a = cb.zeros((2, 3), dtype="float64")
    assert (a.shape, a.strides, a.ndim, a.size, a.nbytes) == ((2, 3), (3, 1), 2, 6, 48)
    assert len(a) == 2
    with pytest.raises(TypeError):
        len(cb.zeros(()))
    assert a.data_ptr % 64 == 0


def test_capsule_consumed_twice_raises():
    cap = np.arange(3).__dlpack__()
    cb.from_dlpack(cap)
    with pytest.raises(ValueError, match="consumed"):
        cb.from_dlpack(cap)


def test_to_numpy_bfloat16_explains():
    with pytest.raises(TypeError, match="bfloat16"):
        cb.zeros(2, dtype="bfloat16").to_numpy()
