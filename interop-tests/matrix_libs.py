"""The interop matrix's definition: which cells exist, how each library makes, hands over, takes
in and reads back an array, and the limits of other libraries (and of the protocols) that a cell
may run into.

test_matrix.py runs the cells; matrix_report.py turns a run into MATRIX.md. Both take the list of
cells from `cells()`, so a cell that a run did not reach shows as "not run", never as a pass.

Words used throughout:
- producer: the library whose array is handed over; consumer: the library that takes it in.
- protocol: how it is handed over. `dlpack-legacy` and `dlpack-versioned` pin the capsule kind
  whatever the consumer asks for; `exchange-table` hands over the producer object itself to a
  consumer that must read `__dlpack_c_exchange_api__` (its `__dlpack__` is disabled meanwhile);
  `cai` exposes only `__cuda_array_interface__`; `buffer` is a `memoryview`.
- a limit: something another library (or a protocol) cannot do. A cell that meets one is
  recorded as "not supported by X" only when the library raises the error declared here (or the
  declared copy/legacy-capsule behaviour is seen); anything else is a failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import re

import numpy as np

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - jax brings it; without it bfloat16 cells do not run
    ml_dtypes = None

import cubridge as cb
from conftest import sample

LIBRARIES = ["cubridge", "numpy", "torch", "cupy", "jax", "numba"]
PROTOCOLS = ["dlpack-legacy", "dlpack-versioned", "exchange-table", "cai", "buffer"]
DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
]  # fmt: skip
LAYOUT_DTYPES = ["float32", "float16"]
LAYOUTS = ["contiguous", "transposed", "sliced", "negative", "broadcast", "0-d", "empty"]
DEVICES = ["cpu", "cuda:0", "cuda:1", "cuda_host", "cuda_managed"]
STREAM_MODES = ["default", "side", "none"]
CUDA_DEVICES = {"cuda:0", "cuda:1", "cuda_managed"}
HOST_DEVICES = {"cpu", "cuda_host", "cuda_managed"}

# Each layout: the base array a producer allocates, and what it does to it. Every layout but
# 0-d and empty ends at shape (3, 4).
LAYOUT_BASE = {
    "contiguous": (3, 4),
    "transposed": (4, 3),
    "sliced": (5, 7),
    "negative": (3, 4),
    "broadcast": (4,),
    "0-d": (),
    "empty": (0, 4),
}


def numpy_layout(base, layout):
    """The reference: what each layout means, in numpy."""
    if layout == "transposed":
        return base.T
    if layout == "sliced":
        return base[1:4, 2:6]
    if layout == "negative":
        return base[:, ::-1]
    if layout == "broadcast":
        return np.lib.stride_tricks.as_strided(base, (3, 4), (0, base.itemsize))
    return base


def np_dtype(name):
    if name == "bfloat16":
        if ml_dtypes is None:
            # Only bfloat16 cells need it: they skip, the rest of the matrix runs.
            import pytest

            pytest.skip("ml_dtypes is not installed, so numpy has no bfloat16")
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def is_bfloat16(dtype):
    """Whether a numpy dtype is ml_dtypes' bfloat16 (never, without ml_dtypes)."""
    return ml_dtypes is not None and dtype == np.dtype(ml_dtypes.bfloat16)


def reference_base(dtype, shape, seed=0):
    """The suite's deterministic values (conftest.sample); bfloat16 ones are float32 values
    rounded once, so every producer can build them exactly."""
    if dtype == "bfloat16":
        return sample(shape, "float32", seed).astype(np_dtype("bfloat16"))
    return sample(shape, dtype, seed)


def comparable(a):
    """A numpy array whose == is exact for every dtype (bfloat16 widened, exactly, to float32)."""
    a = np.asarray(a)
    if is_bfloat16(a.dtype):
        return a.astype(np.float32)
    return a


# ---------------------------------------------------------------------------------------------
# Cells


@dataclasses.dataclass(frozen=True)
class Cell:
    """One claim: `producer`'s array reaches `consumer` through `protocol`, zero-copy and intact
    (kind "transfer" and "stream"), cubridge.add reads x and y and writes out (kind "add"), a
    user's cubridge.ElementwiseKernel does the same (kind "kernel"), a cubridge.RawKernel
    reads x and writes y of one producer (kind "raw"), a reduction (`op` "sum": cubridge.sum,
    "kernel": a user's cubridge.ReductionKernel) reads x and writes out (kind "reduce"), or a
    cubridge.RawModule's template kernel runs on one producer's arrays and reads a `__device__`
    variable that `consumer` wrote in place (kind "module")."""

    kind: str  # "transfer", "stream", "add", "kernel", "raw", "reduce" or "module"
    group: str  # which slice of the matrix: dtypes, layouts, devices, streams, add-*, ...
    producer: str  # for add and kernel: "x,y,out" producers; for reduce: "x,out"
    consumer: str
    protocol: str
    dtype: str
    layout: str
    device: str
    stream: str = "default"
    op: str = "-"  # for reduce: "sum" or "kernel"

    @property
    def id(self):
        parts = [self.group, f"{self.producer}->{self.consumer}", self.protocol, self.dtype]
        parts += [self.layout, self.device]
        if self.kind == "stream" or self.group in ("kernel-streams", "reduce-streams"):
            parts.append(f"stream={self.stream}")
        if self.op != "-":
            parts.append(f"op={self.op}")
        return "|".join(parts)

    def as_dict(self):
        return dataclasses.asdict(self)


CPU_ONLY = {"numpy"}
DEVICE_ONLY = {"cupy", "numba"}


def producer_devices(lib):
    return {
        "cubridge": set(DEVICES),
        "numpy": {"cpu"},
        "torch": {"cpu", "cuda:0", "cuda:1", "cuda_host"},
        "cupy": {"cuda:0", "cuda:1", "cuda_managed"},
        "numba": {"cuda:0", "cuda:1", "cuda_managed"},
        "jax": {"cpu", "cuda:0", "cuda:1"},
    }[lib]


def not_applicable(cell):
    """Why a cell cannot exist (a library does not play that part at all), or None."""
    p, c, proto, dev = cell.producer, cell.consumer, cell.protocol, cell.device
    if dev not in producer_devices(p):
        return {
            "numpy": "numpy arrays live on the host",
            "jax": "jax has no pinned or managed arrays",
            "torch": "torch has no managed-memory allocator",
        }.get(p, f"{p} arrays live on CUDA devices")
    if c in CPU_ONLY and dev in {"cuda:0", "cuda:1"}:
        return f"{c} reads host memory only"
    if c in DEVICE_ONLY and dev in {"cpu", "cuda_host"}:
        return f"{c} arrays live on CUDA devices"
    if proto == "cai" and dev not in CUDA_DEVICES:
        return "the CUDA array interface describes device memory"
    if proto == "cai" and c in CPU_ONLY:
        return f"{c} does not read the CUDA array interface"
    if proto == "buffer" and dev not in HOST_DEVICES:
        return "the buffer protocol describes host memory"
    if proto == "buffer" and c in DEVICE_ONLY:
        return f"{c} copies host memory to the device"
    if proto == "exchange-table" and p == "cubridge" and c == "cubridge":
        return "cubridge takes its own arrays directly (its table is tested through ctypes)"
    if p == "jax" and cell.layout in {"transposed", "sliced", "negative", "broadcast"}:
        return "jax arrays are always compact: a jax transpose or slice is a new array"
    if p == "numba" and cell.layout == "broadcast":
        return "numba has no broadcast view of a device array"
    return None


def add_not_applicable(cell):
    """For cells whose producer is "inputs...,out" (add, kernel, reduce)."""
    *ins, pz = cell.producer.split(",")
    for p in (*ins, pz):
        if cell.device not in producer_devices(p):
            return f"{p} has no arrays on {cell.device}"
    if pz == "jax":
        return "jax arrays are immutable: not an `out`"
    for p in ins:
        if p == "jax" and cell.layout in {"transposed", "sliced", "negative", "broadcast"}:
            return "jax arrays are always compact"
        if p == "numba" and cell.layout == "broadcast":
            return "numba has no broadcast view of a device array"
    return None


def _transfers(group, dtypes, layouts, devices, protocols=PROTOCOLS):
    for device in devices:
        for dtype in dtypes:
            for layout in layouts:
                for p in LIBRARIES:
                    for c in LIBRARIES:
                        for proto in protocols:
                            yield Cell("transfer", group, p, c, proto, dtype, layout, device)


def cells():
    """Every cell of the matrix, applicable or not, in a fixed order."""
    out = []
    out += _transfers("dtypes", DTYPES, ["contiguous"], ["cpu", "cuda:0"])
    out += _transfers("layouts", LAYOUT_DTYPES, LAYOUTS, ["cpu", "cuda:0"])
    out += _transfers(
        "devices", ["float32"], ["contiguous"], ["cuda:1", "cuda_host", "cuda_managed"]
    )
    cuda_libs = ["cubridge", "torch", "cupy", "numba", "jax"]
    for mode in STREAM_MODES:
        for p in cuda_libs:
            for c in cuda_libs:
                for proto in ["dlpack-versioned", "cai"]:
                    if mode == "none" and proto == "cai":
                        continue  # -1 ("no ordering") is a DLPack request
                    out.append(
                        Cell(
                            "stream",
                            "streams",
                            p,
                            c,
                            proto,
                            "float32",
                            "contiguous",
                            "cuda:0",
                            mode,
                        )
                    )
    for device, libs in [("cpu", ["cubridge", "numpy", "torch", "jax"]), ("cuda:0", cuda_libs)]:
        for x in libs:
            for y in libs:
                for z in libs:
                    out.append(
                        Cell(
                            "add",
                            "add-producers",
                            f"{x},{y},{z}",
                            "cubridge",
                            "-",
                            "float32",
                            "contiguous",
                            device,
                        )
                    )
        for p in libs:
            z = "cubridge" if p == "jax" else p
            for dtype in DTYPES:
                out.append(
                    Cell(
                        "add",
                        "add-dtypes",
                        f"{p},{p},{z}",
                        "cubridge",
                        "-",
                        dtype,
                        "contiguous",
                        device,
                    )
                )
            for layout in LAYOUTS:
                out.append(
                    Cell(
                        "add",
                        "add-layouts",
                        f"{p},{p},{z}",
                        "cubridge",
                        "-",
                        "float32",
                        layout,
                        device,
                    )
                )
    out += _kernel_cells(cuda_libs)
    out += _reduce_cells(cuda_libs)
    out += _module_cells()
    return out


def _kernel_cells(libs):
    """Users' kernels on cuda:0: an ElementwiseKernel over every producer triple, dtype, layout
    and producer stream, and a RawKernel on each producer's arrays."""
    dev = "cuda:0"
    out = [
        Cell("kernel", "kernel-producers", f"{x},{y},{z}", "cubridge", "-", "float32",
             "contiguous", dev)
        for x in libs for y in libs for z in libs
    ]  # fmt: skip
    for p in libs:
        z = "cubridge" if p == "jax" else p
        out += [
            Cell("kernel", "kernel-dtypes", f"{p},{p},{z}", "cubridge", "-", d, "contiguous", dev)
            for d in DTYPES
        ]
        out += [
            Cell("kernel", "kernel-layouts", f"{p},{p},{z}", "cubridge", "-", "float32", lay, dev)
            for lay in LAYOUTS
        ]
    for p in ["torch", "cupy"]:
        for mode in ["default", "side"]:
            out.append(
                Cell("kernel", "kernel-streams", f"{p},{p},cubridge", "cubridge", "-", "float32",
                     "contiguous", dev, mode)
            )  # fmt: skip
    for p in ["cubridge", "torch", "cupy", "numba"]:
        for d in ["float16", "float32", "float64", "int32", "int64"]:
            out.append(Cell("raw", "raw-kernels", p, "cubridge", "-", d, "contiguous", dev))
    return out


REDUCE_KERNEL_DTYPES = ["float16", "bfloat16", "float32", "float64"]


def _reduce_cells(cuda_libs):
    """Reductions: cubridge.sum over an axis ("sum", also on the host) and a user's
    ReductionKernel ("kernel", CUDA only), x and out each from its own producer on every device
    (cuda:1 too), and x and out of one producer by dtype, layout and producer stream."""
    host_libs = ["cubridge", "numpy", "torch", "jax"]
    out = []

    def cell(group, producers, dtype, layout, device, op, stream="default"):
        return Cell("reduce", group, producers, "cubridge", "-", dtype, layout, device, stream, op)

    for device, libs in [("cpu", host_libs), ("cuda:0", cuda_libs), ("cuda:1", cuda_libs)]:
        ops = ["sum"] if device == "cpu" else ["sum", "kernel"]
        out += [cell("reduce-producers", f"{x},{z}", "float32", "contiguous", device, op)
                for op in ops for x in libs for z in libs]  # fmt: skip
        if device == "cuda:1":
            continue
        for p in libs:
            z = "cubridge" if p == "jax" else p
            out += [cell("reduce-dtypes", f"{p},{z}", d, "contiguous", device, "sum")
                    for d in DTYPES]  # fmt: skip
            if device != "cpu":
                out += [cell("reduce-dtypes", f"{p},{z}", d, "contiguous", device, "kernel")
                        for d in REDUCE_KERNEL_DTYPES]  # fmt: skip
            out += [cell("reduce-layouts", f"{p},{z}", "float32", lay, device, op)
                    for op in ops for lay in LAYOUTS]  # fmt: skip
    for p in ["torch", "cupy"]:
        out += [cell("reduce-streams", f"{p},cubridge", "float32", "contiguous", "cuda:0", op,
                     mode) for op in ["sum", "kernel"] for mode in ["default", "side"]]  # fmt: skip
    return out


MODULE_DTYPES = ["float32", "float64", "int32"]
# How each library takes in a RawModule's `__device__` variable (a cubridge Array), as its
# users would: jax only reads it (its arrays are immutable).
GLOBAL_PROTOCOLS = {"torch": "dlpack", "cupy": "cai", "numba": "cai", "jax": "dlpack"}


def _module_cells():
    """RawModule: its template kernel on each producer's arrays, the `__device__` variable
    written by cubridge ("module-kernels"); and the variable taken in zero-copy by each other
    library, written (read, for jax) there and read by the kernel ("module-globals")."""
    out = []
    for device, dtypes in [("cuda:0", MODULE_DTYPES), ("cuda:1", ["float32"])]:
        for d in dtypes:
            out += [Cell("module", "module-kernels", p, "cubridge", "-", d, "contiguous", device)
                    for p in ["cubridge", "torch", "cupy", "numba"]]  # fmt: skip
            out += [Cell("module", "module-globals", "cubridge", c, proto, d, "contiguous",
                         device) for c, proto in GLOBAL_PROTOCOLS.items()]  # fmt: skip
    return out


def why_not_applicable(cell):
    if cell.kind in ("add", "kernel", "reduce"):
        return add_not_applicable(cell)
    if cell.kind == "module":
        for lib in {cell.producer, cell.consumer} - {"cubridge"}:
            if cell.device not in producer_devices(lib):
                return f"{lib} has no arrays on {cell.device}"
        return None
    if cell.kind == "stream" and cell.producer == "jax" and cell.stream != "default":
        return "jax offers no stream to write on: its work runs on streams of its own"
    if cell.kind == "raw":
        if cell.device not in producer_devices(cell.producer):
            return f"{cell.producer} has no arrays on {cell.device}"
        return None
    return not_applicable(cell)


# ---------------------------------------------------------------------------------------------
# Limits: what another library, or a protocol, cannot do. cubridge never appears as a holder.


class Copied(Exception):
    """The consumer's array does not share the producer's memory."""


class WrongShape(Exception):
    """The consumer's array has another shape than the producer's."""


class WrongDtype(Exception):
    """The consumer's array has another dtype than the producer's."""


class NoStreamWait(Exception):
    """The consumer read values from before the producer's pending write."""


class LegacyCapsule(Exception):
    """Asked for a versioned DLPack capsule, the producer returned a legacy one."""


class NoStream(Exception):
    """A CUDA array interface without a `stream` entry: consumers cannot order after it."""


class NotKeptAlive(Exception):
    """The consumer's array outlived the object that exported a CUDA array interface: the
    consumer holds no reference to it, so the memory may be freed and reused under it."""


@dataclasses.dataclass(frozen=True)
class Limit:
    holder: str  # who cannot: a library or a protocol (never cubridge)
    lib: str  # whose step raises
    role: str  # "producer" or "consumer"
    errors: tuple  # exception classes (names, matched against the class and its bases)
    match: str  # regex on the message
    reason: str
    when: object = None  # predicate on the cell

    def applies(self, cell, lib, role, exc):
        if lib != self.lib or role != self.role:
            return False
        if self.when is not None and not self.when(cell):
            return False
        names = {k.__name__ for k in type(exc).__mro__}
        if not names & set(self.errors):
            return False
        return re.search(self.match, str(exc), re.S) is not None


def _dtype_is(*names):
    return lambda cell: cell.dtype in names


def _proto_is(*names):
    return lambda cell: cell.protocol in names


def _layout_is(*names):
    return lambda cell: cell.layout in names


NOT_BUFFER_PROTOCOL = ("TypeError",)
CAI = "the CUDA array interface"
CAI_BF16 = "numpy typestrs have no bfloat16: it is refused, or sent as raw '<V2' bytes"
LIMITS = [
    # numpy
    Limit(
        "numpy",
        "numpy",
        "producer",
        ("BufferError",),
        "DLPack only supports",
        "numpy's DLPack export has no bfloat16",
        _dtype_is("bfloat16"),
    ),
    Limit(
        "numpy",
        "numpy",
        "consumer",
        ("RuntimeError", "BufferError"),
        "Unsupported dtype",
        "numpy has no bfloat16",
        _dtype_is("bfloat16"),
    ),
    Limit(
        "numpy",
        "numpy",
        "consumer",
        ("BufferError", "RuntimeError"),
        "[Uu]nsupported device",
        "numpy reads DLPack host memory of device types 1, 3 and 13 only",
    ),
    Limit(
        "numpy",
        "cubridge",
        "consumer",
        ("BufferError",),
        "DLPack only supports",
        "numpy's DLPack export has no bfloat16",
        _dtype_is("bfloat16"),
    ),
    # the buffer protocol and the CUDA array interface
    Limit(
        "the buffer protocol",
        "numpy",
        "producer",
        ("ValueError",),
        "cannot include dtype",
        "PEP 3118 has no bfloat16 format",
        _dtype_is("bfloat16"),
    ),
    Limit(
        "the buffer protocol",
        "cubridge",
        "producer",
        ("BufferError",),
        "bfloat16",
        "PEP 3118 has no bfloat16 format",
        _dtype_is("bfloat16"),
    ),
    Limit(
        "the buffer protocol",
        "jax",
        "producer",
        ("BufferError", "Exception"),
        "BF16",
        "PEP 3118 has no bfloat16 format",
        _dtype_is("bfloat16"),
    ),
    Limit(
        CAI,
        "cubridge",
        "producer",
        ("AttributeError",),
        "no typestr for bfloat16",
        CAI_BF16,
        _dtype_is("bfloat16"),
    ),
    Limit(
        CAI,
        "cubridge",
        "consumer",
        ("TypeError",),
        'typestr "<V2"',
        CAI_BF16,
        _dtype_is("bfloat16"),
    ),
    Limit(CAI, "torch", "consumer", ("TypeError",), "numpy.void", CAI_BF16, _dtype_is("bfloat16")),
    Limit(CAI, "cupy", "consumer", ("WrongDtype",), "", CAI_BF16, _dtype_is("bfloat16")),
    Limit(CAI, "numba", "consumer", ("WrongDtype",), "", CAI_BF16, _dtype_is("bfloat16")),
    # torch
    Limit(
        "torch",
        "torch",
        "producer",
        ("RuntimeError",),
        "[Nn]egative strides",
        "torch tensors cannot have negative strides",
        _layout_is("negative"),
    ),
    Limit(
        "torch",
        "torch",
        "consumer",
        ("RuntimeError", "BufferError", "ValueError"),
        "[Nn]egative strides|[Ss]torage size calculation overflowed",
        "torch tensors cannot have negative strides (torch.from_dlpack is not handed such a "
        "descriptor: torch 2.11 aborts the process on one; torch.as_strided's error stands "
        "for it)",
        _layout_is("negative"),
    ),
    Limit(
        "torch",
        "torch",
        "producer",
        NOT_BUFFER_PROTOCOL,
        "bytes-like object is required",
        "torch tensors do not implement the buffer protocol",
        _proto_is("buffer"),
    ),
    Limit(
        "torch",
        "torch",
        "consumer",
        ("WrongShape",),
        "",
        "torch.asarray reads a buffer as flat bytes: the shape is lost",
        _proto_is("buffer"),
    ),
    Limit(
        "torch",
        "torch",
        "consumer",
        ("ValueError",),
        "buffer length \\(0\\)",
        "torch.asarray refuses empty buffers",
        _proto_is("buffer"),
    ),
    Limit(
        "torch",
        "torch",
        "consumer",
        ("BufferError",),
        "Unsupported device_type: (3|13)",
        "torch.from_dlpack reads neither pinned (3) nor managed (13) DLPack memory",
    ),
    Limit(
        "torch",
        "torch",
        "consumer",
        ("NoStreamWait",),
        "",
        "torch.as_tensor does not wait on a CUDA array interface's stream: it read the values "
        "from before the producer's pending write",
        _proto_is("cai"),
    ),
    Limit(
        "torch",
        "torch",
        "producer",
        ("NoStream",),
        "",
        "torch's CUDA array interface (version 2) has no stream: consumers cannot order after "
        "work pending on a non-default stream",
        _proto_is("cai"),
    ),
    Limit(
        "torch",
        "torch",
        "consumer",
        ("ValueError",),
        "must be a multiple of element size",
        "torch.asarray reads a buffer as flat bytes of its default dtype: the element type of "
        "a 0-d buffer is lost",
        _proto_is("buffer"),
    ),
    Limit(
        "torch",
        "torch",
        "consumer",
        ("Copied",),
        "",
        "torch.as_tensor copies managed memory handed over by the CUDA array interface",
        lambda cell: cell.protocol == "cai" and cell.device == "cuda_managed",
    ),
    Limit(
        "torch",
        "torch",
        "consumer",
        ("RuntimeError",),
        "could not retrieve (a contiguous )?buffer",
        "torch.asarray reads only contiguous buffers",
        _proto_is("buffer"),
    ),
    Limit(
        "torch",
        "torch",
        "consumer",
        ("TypeError", "RuntimeError", "AttributeError"),
        "invalid capsule|__dlpack__",
        "torch.from_dlpack does not read the C exchange table",
        _proto_is("exchange-table"),
    ),
    # jax
    Limit(
        "jax",
        "jax",
        "producer",
        ("LegacyCapsule",),
        "",
        "jax returns legacy capsules when asked for versioned ones",
        _proto_is("dlpack-versioned"),
    ),
    Limit(
        "jax",
        "jax",
        "consumer",
        ("Exception",),
        'name "dltensor", got "dltensor_versioned"',
        "jax reads legacy capsules only",
        _proto_is("dlpack-versioned"),
    ),
    Limit(
        "jax",
        "jax",
        "consumer",
        ("Copied",),
        "",
        "jax copies host memory it is handed (alignment and layout rules of its CPU client)",
    ),
    Limit(
        "jax",
        "jax",
        "consumer",
        ("Exception",),
        "trivial \\(compact\\) striding",
        "jax reads only compact (transposed at most) DLPack strides",
        _layout_is("negative", "broadcast", "sliced"),
    ),
    Limit(
        "jax",
        "jax",
        "consumer",
        ("TypeError",),
        "__dlpack__",
        "jax.numpy.from_dlpack does not read the C exchange table",
        _proto_is("exchange-table"),
    ),
    Limit(
        "jax",
        "jax",
        "producer",
        ("NoStream",),
        "",
        "jax's CUDA array interface (version 2) has no stream, and jax writes asynchronously "
        "(a device_put's copy may still run): no consumer can order after it; take jax arrays "
        "by DLPack, which orders them",
        _proto_is("cai"),
    ),
    Limit(
        "jax",
        "jax",
        "consumer",
        ("TypeError",),
        r"unsupported device type \(DLDeviceType: (3|13)",
        "jax.numpy.from_dlpack reads neither pinned (3) nor managed (13) DLPack memory",
    ),
    Limit(
        CAI,
        "jax",
        "consumer",
        ("JaxRuntimeError",),
        r"Unknown NumPy dtype dtype\('V2'\)",
        CAI_BF16,
        _dtype_is("bfloat16"),
    ),
    Limit(
        "jax",
        "jax",
        "consumer",
        ("NoStreamWait",),
        "",
        "jax.numpy.asarray does not wait on a CUDA array interface's stream: it read the values "
        "from before the producer's pending write",
        _proto_is("cai"),
    ),
    Limit(
        "jax",
        "jax",
        "consumer",
        ("NotKeptAlive",),
        "",
        "jax.numpy.asarray of a CUDA array interface keeps no reference to the exporting object: "
        "the memory can be freed and reused under the jax array (take jax arrays in by DLPack)",
        _proto_is("cai"),
    ),
    Limit(
        "jax",
        "jax",
        "consumer",
        ("JaxRuntimeError",),
        "GetStreamFromExternalStream failed to find stream",
        "jax.numpy.asarray refuses a CUDA array interface whose stream is not one of jax's own",
        _proto_is("cai"),
    ),
    Limit(
        "torch",
        "torch",
        "consumer",
        ("TypeError",),
        "read only flag is not supported",
        "torch.as_tensor refuses a read-only CUDA array interface (jax's are: jax arrays are "
        "immutable)",
        _proto_is("cai"),
    ),
]
LIMITS += [
    Limit(
        "numba",
        "numba",
        "producer",
        ("NumbaNotImplementedError",),
        "bfloat16",
        "numba has no bfloat16 dtype",
        _dtype_is("bfloat16"),
    ),
    Limit(
        "cupy",
        "cupy",
        "producer",
        ("TypeError",),
        "Accessing a CuPy",
        "cupy arrays refuse the buffer protocol, managed memory included",
        _proto_is("buffer"),
    ),
    Limit(
        "numba",
        "cupy",
        "consumer",
        ("TypeError",),
        "CPU arrays cannot be directly imported",
        "numba's managed arrays are numpy arrays whose DLPack says CPU, which cupy refuses",
    ),
    Limit(
        "numba",
        "numba",
        "producer",
        ("AttributeError",),
        "row_stack",
        "numba's device-array transpose calls numpy.row_stack, which numpy 2.4 removed",
        _layout_is("transposed"),
    ),
    Limit(
        "numba",
        "numba",
        "consumer",
        ("NotImplementedError",),
        "negative strides",
        "numba cannot copy a device array with negative strides to the host",
        _layout_is("negative"),
    ),
    Limit(
        "cupy",
        "cubridge",
        "consumer",
        ("ValueError",),
        "extent overflows",
        "cupy 14 writes negative strides wrongly into DLPack descriptors, which cubridge "
        "refuses (cubridge reads cupy's CUDA array interface instead when it is offered)",
        lambda cell: cell.producer == "cupy" and cell.layout == "negative",
    ),
    Limit(
        "numba",
        "numba",
        "consumer",
        ("AttributeError",),
        "from_dlpack",
        "numba reads only the CUDA array interface",
        _proto_is("dlpack-legacy", "dlpack-versioned"),
    ),
    Limit(
        "numba",
        "numba",
        "producer",
        ("AttributeError",),
        "__dlpack",
        "numba device arrays offer no DLPack export",
        _proto_is("dlpack-legacy", "dlpack-versioned"),
    ),
]
for _lib in ("numpy", "jax", "cupy", "numba", "torch"):
    LIMITS.append(
        Limit(
            _lib,
            _lib,
            "producer",
            ("AttributeError",),
            "__dlpack_c_exchange_api__",
            f"{_lib} offers no C exchange table",
            _proto_is("exchange-table"),
        )
    )
for _lib in ("numpy", "cupy", "numba"):
    LIMITS.append(
        Limit(
            _lib,
            _lib,
            "consumer",
            ("TypeError", "AttributeError", "ValueError"),
            "(?i)dlpack",
            f"{_lib} does not read the C exchange table",
            _proto_is("exchange-table"),
        )
    )
assert not [lim for lim in LIMITS if lim.holder == "cubridge"]


def find_limit(cell, lib, role, exc):
    for lim in LIMITS:
        if lim.applies(cell, lib, role, exc):
            return lim
    return None


# ---------------------------------------------------------------------------------------------
# Protocol handles


def capsule_name(capsule):
    m = re.match(r'<capsule object "([^"]+)"', repr(capsule))
    return m.group(1) if m else None


class _Pinned:
    """A DLPack producer that pins the capsule kind. The producer's own `__dlpack__` runs inside
    the consumer's call; an error it raises there is kept in `producer_error`, so that the cell
    blames the producer, not the consumer that passed it on."""

    def __init__(self, obj):
        self._device = obj.__dlpack_device__()
        self._export = obj.__dlpack__
        self.producer_error = None

    def __dlpack_device__(self):
        return self._device

    def _call(self, **kwargs):
        try:
            return self._export(**kwargs)
        except Exception as e:
            self.producer_error = e
            raise


class LegacyOnly(_Pinned):
    """Hands over the producer's legacy capsule whatever the consumer asks for."""

    def __dlpack__(self, stream=None, **_ignored):
        capsule = self._call() if stream is None else self._call(stream=stream)
        if capsule_name(capsule) != "dltensor":
            self.producer_error = AssertionError(f"a {capsule_name(capsule)!r} capsule")
            raise self.producer_error
        return capsule


class VersionedOnly(_Pinned):
    """Hands over a versioned capsule whatever the consumer asks for."""

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        kwargs = {"max_version": max_version if max_version and max_version >= (1, 0) else (1, 0)}
        if stream is not None:
            kwargs["stream"] = stream
        if dl_device is not None:
            kwargs["dl_device"] = dl_device
        if copy is not None:
            kwargs["copy"] = copy
        capsule = self._call(**kwargs)
        if capsule_name(capsule) != "dltensor_versioned":
            self.producer_error = LegacyCapsule(
                f"asked for versioned, got {capsule_name(capsule)!r}"
            )
            raise self.producer_error
        return capsule


class TableOnly:
    """Offers only the producer's C exchange table (for consumers that do not read it, which then
    say so; the table's functions are never called through this object)."""

    def __init__(self, obj):
        self.__dlpack_c_exchange_api__ = type(obj).__dlpack_c_exchange_api__


class CAIOnly:
    """Offers only the producer's CUDA array interface. Like the producer's own object, it keeps
    the memory alive for as long as a consumer holds it (the interface itself carries no owner)."""

    def __init__(self, obj):
        self.__cuda_array_interface__ = obj.__cuda_array_interface__
        self._owner = obj


class Fixed:
    """Hands over a capsule made earlier, whatever the consumer asks for."""

    def __init__(self, capsule, device):
        self._capsule, self._device = capsule, device

    def __dlpack_device__(self):
        return self._device

    def __dlpack__(self, **_ignored):
        return self._capsule


@contextlib.contextmanager
def torch_dlpack_disabled():
    """torch.Tensor.__dlpack__ raises meanwhile, so an import that works used the table."""
    torch = importlib.import_module("torch")
    saved = torch.Tensor.__dlpack__

    def refuse(*_a, **_k):
        raise AssertionError("__dlpack__ was called: the C exchange table was not used")

    torch.Tensor.__dlpack__ = refuse
    try:
        yield
    finally:
        torch.Tensor.__dlpack__ = saved


def handle(obj, protocol, producer, consumer):
    """What the consumer is given. Runs as the producer's step (its errors are its limits)."""
    if protocol == "dlpack-legacy":
        return LegacyOnly(obj)
    if protocol == "dlpack-versioned":
        return VersionedOnly(obj)
    if protocol == "exchange-table":
        table = type(obj).__dlpack_c_exchange_api__
        assert capsule_name(table) == "dlpack_exchange_api", table
        return obj if consumer == "cubridge" else TableOnly(obj)
    if protocol == "cai":
        return CAIOnly(obj)
    if protocol == "buffer":
        return memoryview(obj)
    raise ValueError(protocol)


# ---------------------------------------------------------------------------------------------
# Libraries


def _import(name):
    try:
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - any import failure means "not available here"
        return None


@contextlib.contextmanager
def current_device(index):
    """Runs a cell as a user of its device would: with that device current for torch and CuPy
    (both read the CUDA runtime's current device, and torch's `__dlpack__(stream=...)` refuses a
    tensor of another device), and device 0 current again afterwards, whatever a library left
    current (jax's runtime leaves the context of the last device it used current on the calling
    thread)."""
    torch = _import("torch")
    if torch is None or not torch.cuda.is_available():
        yield
        return
    torch.cuda.set_device(index)
    try:
        yield
    finally:
        torch.cuda.set_device(0)


def gpu_index(device):
    return int(device.split(":")[1]) if device.startswith("cuda:") else 0


def cuda_count():
    return cb.cuda.device_count() if cb.cuda.is_available() else 0


class Lib:
    name = ""
    module = None

    def missing(self, device):
        """Why this library cannot run here on `device` (a reason to skip), or None."""
        if self.module is None:
            return f"{self.name} is not installed"
        if device != "cpu" and cuda_count() == 0:
            return "no CUDA device"
        if device == "cuda:1" and cuda_count() < 2:
            return "cuda:1 needs two GPUs"
        return None

    def view(self, x, layout):
        """The layout's view of the base array `x`, with the library's own operations."""
        if layout == "transposed":
            return x.T
        if layout == "sliced":
            return x[1:4, 2:6]
        if layout == "negative":
            return x[:, ::-1]
        if layout == "broadcast":
            return self.broadcast(x)
        return x

    def scribble(self, nbytes, device):
        """New arrays of the producer's, filled with 0x5A, to reuse memory just freed."""
        return [self.make(np.full(max(nbytes, 1), 0x5A, np.uint8), device) for _ in range(4)]

    def device_index(self, x):
        return None

    @contextlib.contextmanager
    def current(self, stream):
        yield

    def make_on(self, base, device, stream):
        """`make`, for an array whose work belongs to `stream` (numba keeps that per array)."""
        return self.make(base, device)

    def default_stream(self, device):
        """(stream, handle) of the legacy default stream as this library names it, or None for
        a library that offers no stream to write on."""
        return None

    def settle(self, device, stream, src):
        """Finishes one-time and deferred work before a timed window (see Cubridge.settle)."""


class Cubridge(Lib):
    name = "cubridge"
    module = cb

    def make(self, base, device):
        if is_bfloat16(base.dtype):
            return cb.asarray(base.astype(np.float32), dtype="bfloat16", device=device)
        return cb.asarray(base, device=device, copy=True)

    def view(self, x, layout):
        if layout == "transposed":
            return x.T
        if layout == "sliced":
            return x.as_strided((3, 4), (7, 1), 9)
        if layout == "negative":
            return x.as_strided((3, 4), (4, -1), 3)
        if layout == "broadcast":
            return x.as_strided((3, 4), (0, 1), 0)
        return x

    def ptr(self, x):
        return x.data_ptr

    def read(self, x):
        if str(x.dtype) == "bfloat16":
            return cb.asarray(x, dtype="float32").to_numpy().astype(np_dtype("bfloat16"))
        return x.to_numpy()

    def consume(self, h, protocol, device):
        if protocol in ("cai", "buffer"):
            return cb.asarray(h, copy=False)
        if protocol == "exchange-table":
            with torch_dlpack_disabled():
                return cb.from_dlpack(h)
        return cb.from_dlpack(h)

    def device_index(self, x):
        d = str(x.device)
        return int(d.split(":")[1]) if d.startswith("cuda:") else None

    def zeros_like_ref(self, ref, device):
        return self.make(np.zeros(ref.shape, ref.dtype), device)

    def new_stream(self, device):
        s = cb.cuda.Stream(device)
        return s, s.ptr

    class _Legacy:
        """The legacy default stream, as a stream argument (`ptr` 0) that can be waited for."""

        ptr = 0

        def __init__(self, device):
            self.device = device

        def synchronize(self):
            cb.cuda.synchronize(self.device)

    def default_stream(self, device):
        return self._Legacy(device), 0

    _zeros = {}

    def _zero(self, dtype, device):
        key = (str(dtype), str(device))
        if key not in self._zeros:
            self._zeros[key] = cb.zeros((), dtype=dtype, device=device)
        return self._zeros[key]

    def settle(self, device, stream, src):
        # A precaution: cubridge releases buffers whose kernels have run on its next launch,
        # and cuMemFree waits for the whole device, so a release left over from an earlier cell
        # must not fall inside the window (it would wait out the long kernel). Two writes into
        # a scratch array release them first. (Allocations in the window wait too: cb.zeros
        # clears memory with a synchronous memset, hence the cached zero above.)
        zero = self._zero(src.dtype, device)
        scratch = cb.empty(src.shape, dtype=src.dtype, device=device)
        for _ in range(2):
            cb.add(src, zero, out=scratch, stream=stream)
            stream.synchronize()
        self._zeros[("scratch", device)] = scratch  # freed by the next cell's settle, not here

    def write(self, dst, src, stream):
        # The zero is kept: freeing device memory waits for the device, which would end the
        # race this write is part of.
        cb.add(src, self._zero(dst.dtype, dst.device), out=dst, stream=stream)


class Numpy(Lib):
    name = "numpy"
    module = np

    def make(self, base, device):
        return np.array(base, copy=True)

    def broadcast(self, x):
        return np.lib.stride_tricks.as_strided(x, (3, 4), (0, x.itemsize))

    def ptr(self, x):
        return x.__array_interface__["data"][0]

    def read(self, x):
        return np.array(x, copy=True)

    def consume(self, h, protocol, device):
        if protocol == "buffer":
            return np.asarray(h)
        return np.from_dlpack(h)


class Torch(Lib):
    name = "torch"
    module = _import("torch")

    def _dtype(self, np_dt):
        t = self.module
        if is_bfloat16(np_dt):
            return t.bfloat16
        return {np.dtype(bool): t.bool}.get(np_dt) or getattr(t, np_dt.name)

    def make(self, base, device):
        t = self.module
        if is_bfloat16(base.dtype):
            host = t.from_numpy(np.array(base, order="C").view(np.uint16)).view(t.bfloat16)
        else:
            host = t.from_numpy(np.array(base, order="C"))
        if device == "cuda_host":
            return host.clone().pin_memory()
        return host.to(device).clone()

    def view(self, x, layout):
        if layout == "negative":
            # torch's own answer to a negative stride
            return x.as_strided((3, 4), (4, -1), x.storage_offset() + 3)
        return super().view(x, layout)

    def broadcast(self, x):
        return x.expand(3, 4)

    def ptr(self, x):
        return x.data_ptr()

    def refuse_negative_strides(self):
        """torch's own error for a negative stride, or None if this torch allows them."""
        try:
            self.module.empty(4).as_strided((4,), (-1,), 3)
        except RuntimeError as e:
            return e
        return None

    def read(self, x):
        t = self.module
        x = x.cpu()
        if x.dtype == t.bfloat16:
            return x.view(t.uint16).numpy().view(np_dtype("bfloat16"))
        return x.numpy().copy()

    def consume(self, h, protocol, device):
        t = self.module
        if protocol == "cai":
            return t.as_tensor(h, device=device if device.startswith("cuda:") else "cuda")
        if protocol == "buffer":
            return t.asarray(h)
        return t.from_dlpack(h)

    def device_index(self, x):
        return x.device.index if x.device.type == "cuda" else None

    def new_stream(self, device):
        s = self.module.cuda.Stream(device=gpu_index(device))
        return s, s.cuda_stream

    def default_stream(self, device):
        s = self.module.cuda.default_stream(gpu_index(device))
        return s, s.cuda_stream

    @contextlib.contextmanager
    def current(self, stream):
        with self.module.cuda.stream(stream):
            yield

    def write(self, dst, src, stream):
        with self.module.cuda.stream(stream):
            dst.copy_(src)


class Cupy(Lib):
    name = "cupy"
    module = _import("cupy")

    def make(self, base, device):
        cp = self.module
        if device == "cuda_managed":
            with cp.cuda.using_allocator(cp.cuda.malloc_managed):
                x = cp.empty(base.shape, base.dtype)
            x.set(np.array(base, order="C"))
            return x
        with cp.cuda.Device(gpu_index(device)):
            return cp.array(base, copy=True)

    def broadcast(self, x):
        return self.module.broadcast_to(x, (3, 4))

    def ptr(self, x):
        return x.data.ptr

    def read(self, x):
        return x.get()

    def consume(self, h, protocol, device):
        cp = self.module
        with cp.cuda.Device(gpu_index(device)):
            if protocol == "cai":
                return cp.asarray(h)
            return cp.from_dlpack(h)

    def device_index(self, x):
        return x.device.id

    def new_stream(self, device):
        with self.module.cuda.Device(gpu_index(device)):
            s = self.module.cuda.Stream(non_blocking=True)
        return s, s.ptr

    def default_stream(self, device):
        return self.module.cuda.Stream.null, 0

    @contextlib.contextmanager
    def current(self, stream):
        with stream:
            yield

    def write(self, dst, src, stream):
        with stream:
            dst[...] = src


class Jax(Lib):
    name = "jax"
    module = _import("jax")

    def missing(self, device):
        reason = super().missing(device)
        if reason is None and device != "cpu":
            try:
                self.module.devices("gpu")
            except RuntimeError as e:
                return f"jax has no CUDA backend here ({str(e)[:60]})"
        return reason

    def _device(self, device):
        if device == "cpu":
            return self.module.devices("cpu")[0]
        return self.module.devices("gpu")[gpu_index(device)]

    def make(self, base, device):
        return self.module.device_put(np.array(base), self._device(device))

    def ptr(self, x):
        return x.unsafe_buffer_pointer()

    def read(self, x):
        return np.array(x)

    def consume(self, h, protocol, device):
        jnp = importlib.import_module("jax.numpy")
        if protocol == "buffer":
            # Host memory: on jax's CPU device, whatever platform jax runs on by default (on a
            # GPU one, jax.numpy.asarray(copy=False) refuses host memory).
            with self.module.default_device(self.module.devices("cpu")[0]):
                return jnp.asarray(h, copy=False)
        if protocol == "cai":
            with self.module.default_device(self._device(device)):
                return jnp.asarray(h, copy=False)
        return jnp.from_dlpack(h)


class Numba(Lib):
    name = "numba"
    module = _import("numba.cuda") if _import("numba") is not None else None

    def make(self, base, device):
        cuda = self.module
        importlib.import_module("numba").from_dtype(base.dtype)  # numba's error for bfloat16
        if device == "cuda_managed":
            x = cuda.managed_array(base.shape, base.dtype)
            x[...] = base
            return x
        with cuda.gpus[gpu_index(device)]:
            return cuda.to_device(np.array(base, order="C"))

    def ptr(self, x):
        return x.__cuda_array_interface__["data"][0]

    def read(self, x):
        if isinstance(x, np.ndarray):  # managed arrays are numpy arrays too
            return np.array(x, copy=True)
        return x.copy_to_host()

    def consume(self, h, protocol, device):
        cuda = self.module
        with cuda.gpus[gpu_index(device)]:
            if protocol == "cai":
                return cuda.as_cuda_array(h)
            return cuda.from_dlpack(h)

    def new_stream(self, device):
        with self.module.gpus[gpu_index(device)]:
            s = self.module.stream()
        handle = s.handle
        return s, int(getattr(handle, "value", handle) or 0)

    def default_stream(self, device):
        with self.module.gpus[gpu_index(device)]:
            return self.module.legacy_default_stream(), 0

    def make_on(self, base, device, stream):
        with self.module.gpus[gpu_index(device)]:
            x = self.module.to_device(np.array(base, order="C"), stream=stream)
        stream.synchronize()
        return x

    def write(self, dst, src, stream):
        dst.copy_to_device(src, stream=stream)


LIBS = {lib.name: lib for lib in (Cubridge(), Numpy(), Torch(), Cupy(), Jax(), Numba())}
