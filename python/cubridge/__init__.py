"""cubridge: zero-copy array exchange between Python array libraries and Rust, with kernels that
run directly on memory cubridge does not own.

Arrays cross through DLPack (``__dlpack__``), the buffer protocol and, for CUDA memory, the CUDA
array interface; ``cubridge.add``, and users' own ``ElementwiseKernel`` and ``RawKernel``, run on
any of them in place.
"""

from . import _pickle, cuda  # noqa: F401 - _pickle registers how arrays pickle
from ._cubridge import (
    Array,
    CompileError,
    CudaError,
    CudaUnavailableError,
    Device,
    ElementwiseKernel,
    RawKernel,
    RawModule,
    ReductionKernel,
    __version__,
    add,
    arange,
    argmax,
    argmin,
    asarray,
    dtype,
    empty,
    from_dlpack,
    full,
    max,  # noqa: A004 - the Array API's name
    min,  # noqa: A004 - the Array API's name
    prod,
    sum,  # noqa: A004 - the Array API's name
    zeros,
)

bool = dtype("bool")  # noqa: A001 - the Array API's name for the dtype
int8 = dtype("int8")
int16 = dtype("int16")
int32 = dtype("int32")
int64 = dtype("int64")
uint8 = dtype("uint8")
uint16 = dtype("uint16")
uint32 = dtype("uint32")
uint64 = dtype("uint64")
float16 = dtype("float16")
bfloat16 = dtype("bfloat16")
float32 = dtype("float32")
float64 = dtype("float64")
complex64 = dtype("complex64")
complex128 = dtype("complex128")

__all__ = [
    "Array",
    "CompileError",
    "CudaError",
    "CudaUnavailableError",
    "Device",
    "ElementwiseKernel",
    "RawKernel",
    "RawModule",
    "ReductionKernel",
    "__version__",
    "add",
    "arange",
    "argmax",
    "argmin",
    "asarray",
    "bfloat16",
    "bool",
    "complex128",
    "complex64",
    "cuda",
    "dtype",
    "empty",
    "float16",
    "float32",
    "float64",
    "from_dlpack",
    "full",
    "int16",
    "int32",
    "int64",
    "int8",
    "max",
    "min",
    "prod",
    "sum",
    "uint16",
    "uint32",
    "uint64",
    "uint8",
    "zeros",
]
