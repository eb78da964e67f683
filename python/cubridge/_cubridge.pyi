"""Type stubs for the compiled extension (checked against it by `make lint`'s stubtest and by
interop-tests/test_stubs.py)."""

import os
from collections.abc import Sequence
from typing import Any, ClassVar, SupportsIndex, TypeVar, final, overload

from typing_extensions import CapsuleType

__version__: str

class CudaError(RuntimeError):
    code: int

class CompileError(RuntimeError):
    code: int | None

class CudaUnavailableError(RuntimeError): ...

@final
class dtype:
    def __new__(cls, name: str | dtype | Any) -> dtype: ...
    @property
    def name(self) -> str: ...
    @property
    def itemsize(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Device:
    def __new__(cls, name: _Device) -> Device: ...
    @property
    def type(self) -> str: ...
    @property
    def index(self) -> int | None: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

_Shape = SupportsIndex | tuple[SupportsIndex, ...] | list[SupportsIndex]
_DType = str | dtype | Any
# Any: a torch.device or a cupy.cuda.Device
_Device = str | int | Device | Any | None

@final
class Array:
    __dlpack_c_exchange_api__: ClassVar[CapsuleType]
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> dtype: ...
    @property
    def device(self) -> Device: ...
    @property
    def ndim(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def readonly(self) -> bool: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def stream(self) -> int: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...
    def __len__(self) -> int: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __dlpack__(
        self,
        *,
        stream: Any | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> CapsuleType: ...
    def as_strided(
        self, shape: Sequence[int], strides: Sequence[int], offset: int = 0
    ) -> Array: ...
    @property
    def T(self) -> Array: ...
    def to_numpy(self) -> Any: ...
    def __array__(self, dtype: Any | None = None, copy: bool | None = None) -> Any: ...
    def to_device(self, device: _Device) -> Array: ...
    def __bool__(self) -> bool: ...
    def __float__(self) -> float: ...
    def __int__(self) -> int: ...
    def __complex__(self) -> complex: ...
    def __add__(self, other: Any, /) -> Array: ...
    def __radd__(self, other: Any, /) -> Array: ...
    def __iadd__(self, other: Any, /) -> Array: ...

def empty(shape: _Shape, *, dtype: _DType | None = None, device: _Device = None) -> Array: ...
def zeros(shape: _Shape, *, dtype: _DType | None = None, device: _Device = None) -> Array: ...
def full(
    shape: _Shape,
    fill_value: bool | int | float | complex | Any,
    *,
    dtype: _DType | None = None,
    device: _Device = None,
) -> Array: ...
def arange(
    start: int | float,
    /,
    stop: int | float | None = None,
    step: int | float | None = None,
    *,
    dtype: _DType | None = None,
    device: _Device = None,
) -> Array: ...
def from_dlpack(x: Any, /, *, device: _Device = None, copy: bool | None = None) -> Array: ...
def asarray(
    obj: Any, /, *, dtype: _DType | None = None, device: _Device = None, copy: bool | None = None
) -> Array: ...

_Out = TypeVar("_Out")

@overload
def add(a: Any, b: Any, /, *, out: None = None, stream: Any | None = None) -> Array: ...
@overload
def add(a: Any, b: Any, /, *, out: _Out, stream: Any | None = None) -> _Out: ...
@overload
def sum(
    x: Any,
    /,
    *,
    axis: int | Sequence[int] | None = None,
    dtype: Any | None = None,
    keepdims: bool = False,
    out: None = None,
    stream: Any | None = None,
) -> Array: ...
@overload
def sum(
    x: Any,
    /,
    *,
    axis: int | Sequence[int] | None = None,
    dtype: Any | None = None,
    keepdims: bool = False,
    out: _Out,
    stream: Any | None = None,
) -> _Out: ...
@overload
def prod(
    x: Any,
    /,
    *,
    axis: int | Sequence[int] | None = None,
    dtype: Any | None = None,
    keepdims: bool = False,
    out: None = None,
    stream: Any | None = None,
) -> Array: ...
@overload
def prod(
    x: Any,
    /,
    *,
    axis: int | Sequence[int] | None = None,
    dtype: Any | None = None,
    keepdims: bool = False,
    out: _Out,
    stream: Any | None = None,
) -> _Out: ...
@overload
def max(
    x: Any,
    /,
    *,
    axis: int | Sequence[int] | None = None,
    keepdims: bool = False,
    out: None = None,
    stream: Any | None = None,
) -> Array: ...
@overload
def max(
    x: Any,
    /,
    *,
    axis: int | Sequence[int] | None = None,
    keepdims: bool = False,
    out: _Out,
    stream: Any | None = None,
) -> _Out: ...
@overload
def min(
    x: Any,
    /,
    *,
    axis: int | Sequence[int] | None = None,
    keepdims: bool = False,
    out: None = None,
    stream: Any | None = None,
) -> Array: ...
@overload
def min(
    x: Any,
    /,
    *,
    axis: int | Sequence[int] | None = None,
    keepdims: bool = False,
    out: _Out,
    stream: Any | None = None,
) -> _Out: ...
@overload
def argmax(
    x: Any,
    /,
    *,
    axis: int | None = None,
    keepdims: bool = False,
    out: None = None,
    stream: Any | None = None,
) -> Array: ...
@overload
def argmax(
    x: Any,
    /,
    *,
    axis: int | None = None,
    keepdims: bool = False,
    out: _Out,
    stream: Any | None = None,
) -> _Out: ...
@overload
def argmin(
    x: Any,
    /,
    *,
    axis: int | None = None,
    keepdims: bool = False,
    out: None = None,
    stream: Any | None = None,
) -> Array: ...
@overload
def argmin(
    x: Any,
    /,
    *,
    axis: int | None = None,
    keepdims: bool = False,
    out: _Out,
    stream: Any | None = None,
) -> _Out: ...

@final
class Stream:
    def __new__(cls, device: _Device = None) -> Stream: ...
    @property
    def ptr(self) -> int: ...
    @property
    def device(self) -> int: ...
    def synchronize(self) -> None: ...
    def __cuda_stream__(self) -> tuple[int, int]: ...

def cuda_is_available() -> bool: ...
def cuda_device_count() -> int: ...
def cuda_synchronize(device: _Device = None) -> None: ...
def cuda_mem_info(device: _Device = None) -> tuple[int, int]: ...
def cuda_empty_cache(device: _Device = None) -> None: ...
def cuda_memory_stats(device: _Device = None) -> dict[str, int]: ...
def cuda_record_stream(array: Any, stream: Any) -> None: ...
def cuda_shipped_kernels() -> list[tuple[str, int]]: ...
def cuda_loaded_programs() -> list[tuple[str, int]]: ...
def cuda_wait_for_compiles() -> None: ...
def _add_nvrtc_search_dirs(dirs: list[str]) -> None: ...
def cuda_set_shareable(on: bool) -> None: ...
def _host_bytes(array: Array) -> bytes: ...
def _host_rebuild(
    data: bytes, dtype: Any, shape: list[int], device: Any, readonly: bool
) -> Array: ...
def _ipc_export(
    array: Array,
) -> tuple[bytes, int, int, list[int], list[int], str, bool]: ...
def _ipc_import(
    wire: bytes,
    fd: int,
    offset: int,
    shape: list[int],
    strides: list[int],
    dtype: Any,
    readonly: bool,
) -> Array: ...
def _ipc_reap() -> None: ...
def _ipc_needs_pool(wire: bytes) -> bool: ...

_runtime: object

@final
class ElementwiseKernel:
    """An elementwise kernel in CuPy's syntax, run on CUDA arrays of any producer.

    As in CuPy, ``size=`` gives the number of indices where every array is raw (and is refused
    otherwise), raw outputs left out are allocated with ``size`` elements, and a kernel may have
    no outputs (``out_params=""``), writing through raw inputs; it then returns ``()``.
    """

    def __new__(
        cls,
        in_params: str,
        out_params: str,
        operation: str,
        name: str = "kernel",
        *,
        preamble: str = "",
    ) -> ElementwiseKernel: ...
    @property
    def name(self) -> str: ...
    def __call__(
        self,
        *args: Any,
        out: Any | None = None,
        stream: Any | None = None,
        size: int | None = None,
    ) -> Any: ...

@final
class ReductionKernel:
    """A reduction in CuPy's syntax, run on CUDA arrays of any producer.

    ``map_expr`` maps each element (of the inputs, and ``_J``, its C-order index along the
    reduced axes) to ``reduce_type`` (default: the first output's type); ``reduce_expr`` combines
    two such values ``a`` and ``b``; ``post_map_expr`` writes the outputs from the result ``a``.
    Beyond CuPy: ``raw`` inputs, several outputs given as ``out=``, and errors that name the
    malformed part of a declaration. Deterministic: the same input on the same device gives the
    same bits on every run and stream.
    """

    def __new__(
        cls,
        in_params: str,
        out_params: str,
        map_expr: str,
        reduce_expr: str,
        post_map_expr: str,
        identity: Any | None,
        name: str = "reduce_kernel",
        reduce_type: str | None = None,
        reduce_dims: bool = True,
        preamble: str = "",
        options: Sequence[str] | None = None,
    ) -> ReductionKernel: ...
    @property
    def name(self) -> str: ...
    def __call__(
        self,
        *args: Any,
        out: Any | None = None,
        axis: int | Sequence[int] | None = None,
        keepdims: bool = False,
        stream: Any | None = None,
    ) -> Any: ...

@final
class RawKernel:
    """A CUDA kernel from source (``extern "C"``), launched on arrays of any producer.

    Each array is passed as a pointer, which the kernel may write. cubridge cannot see which
    pointers it writes, so an array whose producer does not allow writes (a tensor that requires
    grad, a JAX array, a read-only numpy array or DLPack export, or cubridge's import of one) is
    refused with ValueError; pass ``readonly_ok=True`` when the kernel only reads the read-only
    arrays it is given.

    Relocatable device code (options ``-rdc=true`` or ``-dc``: device-side launches) is linked
    with the CUDA device runtime, ``libcudadevrt.a``, looked for where NVRTC is (the ``nvidia``
    pip packages, ``CUDA_HOME/lib64``); the linked code is what the disk cache keeps.
    """

    def __new__(cls, source: str, name: str, options: Sequence[str] | None = None) -> RawKernel: ...
    @property
    def name(self) -> str: ...
    def compile(self, device: _Device = None) -> None: ...
    def __call__(
        self,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        args: tuple[Any, ...] | list[Any],
        *,
        shared_mem: int = 0,
        stream: Any | None = None,
        readonly_ok: bool = False,
    ) -> None: ...

@final
class RawModule:
    """A CUDA module: CUDA C++ ``code`` compiled by NVRTC, or a precompiled cubin, PTX or fatbin
    file at ``path`` (exactly one). Compiled and loaded at its first ``get_function``,
    ``get_global`` or ``compile()``, once per device; the compiled code and the lowered names of
    its ``name_expressions`` are kept in the disk cache. ``options`` and ``name_expressions``
    are refused with ``path``.
    """

    def __new__(
        cls,
        code: str | None = None,
        path: str | os.PathLike[str] | None = None,
        options: Sequence[str] | None = (),
        name_expressions: Sequence[str] | None = None,
    ) -> RawModule: ...
    def compile(self, device: _Device = None) -> None: ...
    def get_function(self, name: str) -> RawKernel: ...
    def get_global(
        self, name: str, dtype: _DType | None = None, shape: int | Sequence[int] | None = None
    ) -> Array: ...
