"""Hand-made DLPack capsules, built with ctypes, for feeding cubridge descriptors that no real
producer would make. Each capsule's deleter counts its calls, so tests can check that cubridge
calls it exactly once whatever it thinks of the descriptor."""

import ctypes

c_int64_p = ctypes.POINTER(ctypes.c_int64)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", c_int64_p),
        ("strides", c_int64_p),
        ("byte_offset", ctypes.c_uint64),
    ]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class Made:
    """A capsule and everything its descriptor points at, kept alive by this object."""

    def __init__(self):
        self.deleted = 0
        self.keep = []
        self.capsule = None


# Every live Made, so that ctypes memory outlives cubridge's use of it.
_live = {}


def make_capsule(
    *,
    data=None,
    ndim=1,
    shape=(4,),
    strides=None,
    code=2,
    bits=32,
    lanes=1,
    device_type=1,
    device_id=0,
    byte_offset=0,
    versioned=False,
    version=(1, 3),
    flags=0,
    name=None,
    shape_is_null=False,
):
    """A DLPack capsule with exactly these fields. `data` is a ctypes buffer or None (NULL);
    `shape`/`strides` are sequences (strides None means a NULL pointer)."""
    made = Made()
    shape_arr = None if shape_is_null else (ctypes.c_int64 * max(len(shape), 1))(*shape)
    strides_arr = None if strides is None else (ctypes.c_int64 * max(len(strides), 1))(*strides)
    made.keep += [data, shape_arr, strides_arr]

    def on_delete(_ptr):
        made.deleted += 1

    deleter = DELETER(on_delete)
    made.keep.append(deleter)
    tensor = DLTensor(
        data=ctypes.addressof(data) if data is not None else None,
        device=DLDevice(device_type, device_id),
        ndim=ndim,
        dtype=DLDataType(code, bits, lanes),
        shape=ctypes.cast(shape_arr, c_int64_p) if shape_arr is not None else None,
        strides=ctypes.cast(strides_arr, c_int64_p) if strides_arr is not None else None,
        byte_offset=byte_offset,
    )
    if versioned:
        managed = DLManagedTensorVersioned(
            version=DLPackVersion(*version),
            manager_ctx=None,
            deleter=deleter,
            flags=flags,
            dl_tensor=tensor,
        )
        default_name = b"dltensor_versioned"
    else:
        managed = DLManagedTensor(dl_tensor=tensor, manager_ctx=None, deleter=deleter)
        default_name = b"dltensor"
    made.keep.append(managed)
    made.capsule = _capsule_new(ctypes.addressof(managed), name or default_name, None)
    _live[id(made)] = made
    return made


def float_buffer(n=16):
    """A zeroed, 64-byte aligned float32 buffer of `n` elements (as a ctypes object)."""
    raw = (ctypes.c_float * (n + 16))()
    offset = (-ctypes.addressof(raw)) % 64 // 4
    view = (ctypes.c_float * n).from_buffer(raw, offset * 4)
    return view


# The DLPack 1.3 C exchange table (dlpack.h's DLPackExchangeAPI), for calling a producer's
# functions the way a C consumer would.
_MANAGED_P = ctypes.POINTER(DLManagedTensorVersioned)
SET_ERROR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)


class DLPackExchangeAPIHeader(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("prev_api", ctypes.c_void_p)]


class DLPackExchangeAPI(ctypes.Structure):
    _fields_ = [
        ("header", DLPackExchangeAPIHeader),
        (
            "managed_tensor_allocator",
            ctypes.CFUNCTYPE(
                ctypes.c_int,
                ctypes.POINTER(DLTensor),
                ctypes.POINTER(_MANAGED_P),
                ctypes.c_void_p,
                SET_ERROR,
            ),
        ),
        (
            "managed_tensor_from_py_object_no_sync",
            ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(_MANAGED_P)),
        ),
        (
            "managed_tensor_to_py_object_no_sync",
            ctypes.PYFUNCTYPE(ctypes.c_int, _MANAGED_P, ctypes.POINTER(ctypes.py_object)),
        ),
        ("dltensor_from_py_object_no_sync", ctypes.c_void_p),
        (
            "current_work_stream",
            ctypes.CFUNCTYPE(
                ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p)
            ),
        ),
    ]


def exchange_api(cls):
    """The DLPackExchangeAPI a type publishes in its `__dlpack_c_exchange_api__` capsule."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    address = get(cls.__dlpack_c_exchange_api__, b"dlpack_exchange_api")
    return DLPackExchangeAPI.from_address(address)
