"""The cross-framework interop matrix (see matrix_libs.py for what each cell claims and how).

Every cell proves its claim or ends as one of:
- passed: values equal numpy's reference, bit for bit; the consumer's data pointer is the
  producer's (zero-copy; not observable for empty arrays); the producer's objects are deleted and
  their memory reused by new arrays before the consumer reads (ownership);
- xfailed "not supported by X": X (another library, or a protocol) raised the error declared for
  that limit in matrix_libs.LIMITS, or showed the declared behaviour (a copy, a legacy capsule);
- skipped: the library or the GPU is not on this machine (the report shows "not run");
- failed: anything else.

`--matrix-json PATH` writes every cell's outcome for matrix_report.py.
"""

import gc
import statistics
import time
import weakref
import zlib

import cubridge as cb
import matrix_libs as m
import numpy as np
import pytest

ALL = m.cells()


@pytest.fixture(autouse=True)
def _cell_device(request):
    """Each CUDA cell runs with its device current for torch and CuPy, as its user would run it
    (see matrix_libs.current_device); cubridge's own calls leave the current device as they found
    it (test_cuda.py checks that on its own)."""
    callspec = getattr(request.node, "callspec", None)
    cell = callspec.params.get("cell") if callspec else None
    if cell is None or not cell.device.startswith("cuda"):
        yield
        return
    index = m.gpu_index(cell.device)
    if 0 < m.cuda_count() <= index:
        # As the cell itself would skip (Lib.missing), before making a missing device current.
        pytest.skip(f"{cell.device} needs {index + 1} GPUs")
    with m.current_device(index):
        yield


def _params(kind):
    out = []
    for cell in ALL:
        if cell.kind != kind or m.why_not_applicable(cell):
            continue
        marks = [pytest.mark.cuda] if cell.device != "cpu" else []
        out.append(pytest.param(cell, id=cell.id, marks=marks))
    return out


def _skip_if_missing(cell, *libs):
    for name in libs:
        reason = m.LIBS[name].missing(cell.device)
        if reason:
            pytest.skip(reason)


class Steps:
    """Runs each step as one library's; a declared limit of that library ends the cell as
    "not supported by X" (xfail), any other error fails it."""

    def __init__(self, cell, request):
        self.cell, self.request = cell, request

    def limit(self, lib, role, exc):
        lim = m.find_limit(self.cell, lib, role, exc)
        if lim is None:
            return
        self.request.node.user_properties.append(
            (
                "limit",
                {
                    "holder": lim.holder,
                    "reason": lim.reason,
                    "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                },
            )  # fmt: skip
        )
        pytest.xfail(f"not supported by {lim.holder}: {lim.reason}")

    def run(self, lib, role, fn, handle=None):
        try:
            return fn()
        except Exception as e:
            producer_error = getattr(handle, "producer_error", None)
            if producer_error is not None:
                self.limit(self.cell.producer, "producer", producer_error)
                raise AssertionError(f"{self.cell.producer}'s export failed") from producer_error
            self.limit(lib, role, e)
            raise


def _check(host, ref):
    assert host.shape == ref.shape, (host.shape, ref.shape)
    assert host.dtype == ref.dtype, (host.dtype, ref.dtype)
    np.testing.assert_array_equal(m.comparable(host), m.comparable(ref), strict=True)


@pytest.mark.parametrize("cell", _params("transfer"))
def test_transfer(cell, request):
    _skip_if_missing(cell, cell.producer, cell.consumer)
    if cell.dtype == "bfloat16" and m.ml_dtypes is None:
        pytest.skip("ml_dtypes is not installed")
    P, C, steps = m.LIBS[cell.producer], m.LIBS[cell.consumer], Steps(cell, request)
    base = m.reference_base(cell.dtype, m.LAYOUT_BASE[cell.layout])
    ref = m.numpy_layout(base, cell.layout)

    def produce():
        x = P.view(P.make(base, cell.device), cell.layout)
        return x, P.ptr(x), m.handle(x, cell.protocol, cell.producer, cell.consumer)

    x, ptr, h = steps.run(cell.producer, "producer", produce)
    if cell.device != "cpu" and m.LIBS["torch"].module is not None:
        # The producer's work is done before the hand-over (jax's and torch's run on after
        # their calls return): ordering against pending work is the stream cells' claim.
        m.LIBS["torch"].module.cuda.synchronize(m.gpu_index(cell.device))

    def consume(h=h):
        if (
            cell.consumer == "torch"
            and cell.layout == "negative"
            and cell.protocol != "exchange-table"
        ):
            refusal = C.refuse_negative_strides()  # torch 2.11 aborts on such a descriptor
            if refusal is not None:
                raise refusal
        return C.consume(h, cell.protocol, cell.device)

    got = steps.run(cell.consumer, "consumer", consume, h)

    def zero_copy():
        if ref.size and C.ptr(got) != ptr:
            raise m.Copied(f"{cell.consumer} holds {C.ptr(got):#x}, the producer {ptr:#x}")

    steps.run(cell.consumer, "consumer", zero_copy)

    def same_shape():
        if tuple(got.shape) != ref.shape:
            raise m.WrongShape(f"{cell.consumer} made shape {tuple(got.shape)} of {ref.shape}")

    steps.run(cell.consumer, "consumer", same_shape)
    if cell.device.startswith("cuda:"):
        index = C.device_index(got)
        assert index in (None, m.gpu_index(cell.device)), index
    # Ownership: the producer's objects go, and new arrays take their memory, before the read.
    # A CUDA array interface carries no owner: the consumer must hold the object that exported
    # it for as long as its array lives.
    exporter = weakref.ref(h) if cell.protocol == "cai" and ref.size else None
    del x, h
    if exporter is not None:
        gc.collect()
        steps.run(cell.consumer, "consumer", lambda: _holds(exporter, cell.consumer))
    reuse = P.scribble(base.nbytes, cell.device)
    host = steps.run(cell.consumer, "consumer", lambda: _read(C, got, ref))
    del reuse
    _check(host, ref)


def _holds(exporter, consumer):
    if exporter() is None:
        raise m.NotKeptAlive(f"{consumer}'s array outlived the object that exported its memory")


def _read(lib, got, ref):
    host = lib.read(got)
    if host.dtype != ref.dtype:
        raise m.WrongDtype(f"{lib.name} read {host.dtype}, the producer had {ref.dtype}")
    return host


SLEEP_CYCLES = 200_000_000  # about 0.1 s of one SM's clock: long enough to lose any race


def _sleep_on(stream_ptr, device, cycles=SLEEP_CYCLES):
    torch = m.LIBS["torch"].module
    if stream_ptr == 0:  # the legacy default stream
        ext = torch.cuda.default_stream(m.gpu_index(device))
    else:
        ext = torch.cuda.ExternalStream(stream_ptr, device=m.gpu_index(device))
    with torch.cuda.stream(ext):
        torch.cuda._sleep(cycles)
    return ext


# What a race's body returns when the long kernel ended before the race was run out.
_RACE_LOST = object()


def _written_behind_a_sleep(cell, steps, P, stream_ptr, src, ref, race, lost):
    """race(x, ext)'s result, x an array of -7 made for `stream`, into which src is being
    written there behind a long kernel that still runs (ext: the stream as torch names it), the
    producer's current stream `stream`. Where the kernel ends first (before race runs, or
    during a step of race's own: race then returns _RACE_LOST), a host slower than the kernel
    (many workers on few cores) tries again behind one eight times as long: the precondition
    of the race, not the consumer's behaviour. Lost twice: AssertionError naming where each
    try was lost; `lost` says what losing in race's own step means."""
    stream, ptr = stream_ptr
    dev, torch = cell.device, m.LIBS["torch"].module
    where = []
    for cycles in (SLEEP_CYCLES, 8 * SLEEP_CYCLES):
        x = steps.run(
            cell.producer, "producer", lambda: P.make_on(np.full_like(ref, -7.0), dev, stream)
        )
        P.settle(dev, stream, src)
        torch.cuda.synchronize(m.gpu_index(dev))
        with P.current(stream):
            ext = _sleep_on(ptr, dev, cycles)
            P.write(x, src, stream)
            before = ext.query()
            result = _RACE_LOST if before else race(x, ext)
        if result is not _RACE_LOST:
            return result
        where.append("before the hand-over" if before else lost)
        ext.synchronize()
    raise AssertionError(f"the long kernel ended first twice: {'; '.join(where)}")


@pytest.mark.parametrize("cell", _params("stream"))
def test_stream(cell, request):
    """Default: written on the legacy default stream behind a long kernel, handed over while
    that kernel still runs (a producer without streams, jax, makes its array and hands it over
    at once). Side: the same on a non-default stream. In both the consumer must see the written
    values. None: exported with stream=-1 (no ordering) while the
    kernel runs; the export must not wait for it, and after the user synchronizes the producer's
    stream the consumer sees the values."""
    _skip_if_missing(cell, cell.producer, cell.consumer, "torch")
    P, C, steps = m.LIBS[cell.producer], m.LIBS[cell.consumer], Steps(cell, request)
    ref = m.reference_base("float32", (1 << 16,))
    dev = cell.device

    default = P.default_stream(dev) if cell.stream == "default" else None

    def hand_over(x):
        if cell.protocol == "cai":
            cai = x.__cuda_array_interface__
            # Pending work on a stream the interface does not name: on a side stream, or, for
            # a producer without streams (jax), wherever its asynchronous write runs.
            pending = cell.stream == "side" or (cell.stream == "default" and default is None)
            if pending and cai.get("stream") is None:
                raise m.NoStream(f"version {cai.get('version')} interface without a stream")
            return m.CAIOnly(x)
        return m.VersionedOnly(x)

    if cell.stream == "default" and default is None:
        x = steps.run(cell.producer, "producer", lambda: P.make(ref, dev))
        h = steps.run(cell.producer, "producer", lambda: hand_over(x))
        got = steps.run(cell.consumer, "consumer", lambda: C.consume(h, cell.protocol, dev), h)
        _check(C.read(got), ref)
        return

    stream, ptr = default or P.new_stream(dev)
    src = P.make(ref, dev)

    def handed_over(x, ext):
        h = steps.run(cell.producer, "producer", lambda: hand_over(x))
        if ext.query():
            return _RACE_LOST
        got = steps.run(cell.consumer, "consumer", lambda: C.consume(h, cell.protocol, dev), h)
        return steps.run(cell.consumer, "consumer", lambda: _read_after(C, got, ref))

    def unordered(x, ext):
        capsule = steps.run(
            cell.producer, "producer", lambda: x.__dlpack__(stream=-1, max_version=(1, 0))
        )
        if ext.query():
            # Ended during the export: it waited, or the host was slower than the kernel.
            return _RACE_LOST
        h = m.Fixed(capsule, x.__dlpack_device__())
        # x too: the consumer's read comes after the synchronize, outside.
        return steps.run(cell.consumer, "consumer", lambda: C.consume(h, "dlpack", dev)), ext, x

    behind = (cell, steps, P, (stream, ptr), src, ref)
    if cell.stream in ("default", "side"):
        host = _written_behind_a_sleep(*behind, handed_over, "during the producer's hand-over")
    else:
        lost = "during the stream=-1 export: the producer waited for its stream"
        got, ext, x = _written_behind_a_sleep(*behind, unordered, lost)
        ext.synchronize()
        host = steps.run(cell.consumer, "consumer", lambda: _read_after(C, got, ref))
    _check(host, ref)


def _read_after(lib, got, ref):
    """The consumer's read of values written behind a long kernel: the old values (-7) mean it
    did not wait for that write."""
    host = _read(lib, got, ref)
    if (host == -7.0).any() and not (ref == -7.0).any():
        raise m.NoStreamWait(f"{lib.name} read {(host == -7.0).sum()} values from before the write")
    return host


def _start_sum(cell, request, *libs):
    """Skips a sum cell whose libraries (or ml_dtypes, for bfloat16) are missing; its Steps."""
    _skip_if_missing(cell, *libs)
    if cell.dtype == "bfloat16" and m.ml_dtypes is None:
        pytest.skip("ml_dtypes is not installed")
    return Steps(cell, request)


def _sum_operands(cell, layouts_group):
    """The bases of x and y (what producers make) and their numpy views (the reference): in
    the given layout for the layouts group, 2^16 elements for the stream cells, else (3, 4) and
    a broadcast (4,)."""
    if cell.group == layouts_group:
        bx = m.reference_base(cell.dtype, m.LAYOUT_BASE[cell.layout], seed=1)
        by = m.reference_base(cell.dtype, m.LAYOUT_BASE[cell.layout], seed=2)
        return bx, by, m.numpy_layout(bx, cell.layout), m.numpy_layout(by, cell.layout)
    shapes = [(1 << 16,), (1 << 16,)] if cell.group == "kernel-streams" else [(3, 4), (4,)]
    bx = m.reference_base(cell.dtype, shapes[0], seed=1)
    by = m.reference_base(cell.dtype, shapes[1], seed=2)
    return bx, by, bx, by


def _expected_sum(rx, ry):
    if rx.dtype.name in ("bfloat16", "float16"):
        return (rx.astype(np.float32) + ry.astype(np.float32)).astype(rx.dtype)
    return np.add(rx, ry)


@pytest.mark.parametrize("cell", _params("add"))
def test_add(cell, request):
    """cubridge.add(x, y, out=z) with x, y and z each from its own producer: z is written in
    place and equals numpy's sum."""
    px, py, pz = cell.producer.split(",")
    steps = _start_sum(cell, request, px, py, pz)
    bx, by, rx, ry = _sum_operands(cell, "add-layouts")
    expected = _expected_sum(rx, ry)
    layout = cell.layout if cell.group == "add-layouts" else "contiguous"
    x = steps.run(px, "producer", lambda: m.LIBS[px].view(m.LIBS[px].make(bx, cell.device), layout))
    y = steps.run(py, "producer", lambda: m.LIBS[py].view(m.LIBS[py].make(by, cell.device), layout))
    Z = m.LIBS[pz]
    z = Z.make(np.zeros(expected.shape, expected.dtype), cell.device)
    before = Z.ptr(z)
    steps.run("cubridge", "consumer", lambda: cb.add(x, y, out=z))
    assert Z.ptr(z) == before
    _check(Z.read(z), expected)


# Users' kernels (kinds "kernel" and "raw"): one kernel object each, compiled once per dtype.
KERNEL = cb.ElementwiseKernel("T x, T y", "T z", "z = x + y", "matrix_add")
RAW_SOURCE = r"""
#ifdef WITH_FP16
#include <cuda_fp16.h>
#endif
extern "C" __global__ void matrix_double(const ELEM* x, ELEM* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + x[i];
}
"""
RAW_TYPES = {
    "float16": "__half",
    "float32": "float",
    "float64": "double",
    "int32": "int",
    "int64": "long long",
}


@pytest.mark.parametrize("cell", _params("kernel"))
def test_kernel(cell, request):
    """A user's ElementwiseKernel `z = x + y` with x, y and out each from its own producer: out is
    written in place (or, for the stream cells, a new cubridge array) and equals numpy's sum. The
    stream cells write x on the producer's side stream behind a long kernel and call the kernel
    under that stream: the kernel must see the write."""
    px, py, pz = cell.producer.split(",")
    steps = _start_sum(cell, request, px, py, pz)
    bx, by, rx, ry = _sum_operands(cell, "kernel-layouts")
    expected = _expected_sum(rx, ry)
    layout = cell.layout if cell.group == "kernel-layouts" else "contiguous"
    X, Y = m.LIBS[px], m.LIBS[py]
    if cell.group == "kernel-streams":
        y = Y.make(by, cell.device)
        z = _behind_long_kernel(cell, steps, X, bx, lambda x: KERNEL(x, y))
        host = _read_after(m.LIBS["cubridge"], z, expected)
        _check(host, expected)
        return
    x = steps.run(px, "producer", lambda: X.view(X.make(bx, cell.device), layout))
    y = steps.run(py, "producer", lambda: Y.view(Y.make(by, cell.device), layout))
    Z = m.LIBS[pz]
    z = Z.make(np.zeros(expected.shape, expected.dtype), cell.device)
    before = Z.ptr(z)
    returned = steps.run("cubridge", "consumer", lambda: KERNEL(x, y, out=z))
    assert returned is z
    assert Z.ptr(z) == before
    _check(Z.read(z), expected)


def _behind_long_kernel(cell, steps, X, bx, call):
    """`call(x)`'s result, called under the producer's side stream, on which x (first -7) is
    written with `bx`'s values behind a long kernel: while that kernel runs (stream "side"), or
    once the stream has finished (stream "default")."""
    torch = m.LIBS["torch"].module
    stream, ptr = X.new_stream(cell.device)
    x = X.make_on(np.full_like(bx, -7.0), cell.device, stream)
    src = X.make(bx, cell.device)
    X.settle(cell.device, stream, src)
    torch.cuda.synchronize(m.gpu_index(cell.device))
    with X.current(stream):
        ext = _sleep_on(ptr, cell.device)
        X.write(x, src, stream)
        if cell.stream == "side":
            assert not ext.query(), "the side stream finished early: no race to lose"
        else:
            X.settle(cell.device, stream, x)
        return steps.run("cubridge", "consumer", lambda: call(x))


@pytest.mark.parametrize("cell", _params("raw"))
def test_raw(cell, request):
    """A cubridge.RawKernel reads x and writes y = x + x, both of one producer, in place."""
    _skip_if_missing(cell, cell.producer)
    P, steps = m.LIBS[cell.producer], Steps(cell, request)
    options = [f"-DELEM={RAW_TYPES[cell.dtype]}"]
    if cell.dtype == "float16":
        options.append("-DWITH_FP16")
    kernel = cb.RawKernel(RAW_SOURCE, "matrix_double", options=options)
    bx = m.reference_base(cell.dtype, (1000,), seed=3)
    x = steps.run(cell.producer, "producer", lambda: P.make(bx, cell.device))
    y = P.make(np.zeros_like(bx), cell.device)
    before = P.ptr(y)
    steps.run("cubridge", "consumer", lambda: kernel(4, 256, (x, y, np.int64(bx.size))))
    assert P.ptr(y) == before
    _check(P.read(y), (bx + bx).astype(bx.dtype))


# Reductions (kind "reduce"): the built-in sum, and a user's ReductionKernel, sqrt of the sum of
# squares (accumulated in float).
L2 = cb.ReductionKernel(
    "T x", "T y", "(float)x * (float)x", "a + b", "y = (T)sqrt(a)", "0", "matrix_l2", "float"
)
# Relative error allowed, against the sum of the magnitudes reduced into each result: cubridge
# and numpy add in different orders; the kernel accumulates float64 values in float.
REDUCE_RTOL = {"float16": 4e-3, "bfloat16": 1e-2, "float32": 1e-5, "complex64": 1e-5}
REDUCE_RTOL |= {"float64": 1e-13, "complex128": 1e-13, "kernel float64": 1e-6}


def _reduce_operand(cell):
    """x's base (what producers make), its numpy view (the reference) and the reduced axis:
    axis 0 of the layout's view for the layouts group (all axes of a 0-d array), else axis 1
    of (3, 4), or of (256, 256) for the stream cells."""
    if cell.group == "reduce-layouts":
        bx = m.reference_base(cell.dtype, m.LAYOUT_BASE[cell.layout], seed=4)
        rx = m.numpy_layout(bx, cell.layout)
        return bx, rx, (0 if rx.ndim else None)
    shape = (256, 256) if cell.group == "reduce-streams" else (3, 4)
    bx = m.reference_base(cell.dtype, shape, seed=4)
    return bx, bx, 1


def _expected_reduction(op, rx, axis):
    """numpy's result on the host copy, in numpy's result dtype; floats taken in float64 (or
    complex128) and rounded once."""
    if op == "kernel":
        wide = rx.astype(np.float64)
        return np.asarray(np.sqrt((wide * wide).sum(axis=axis))).astype(rx.dtype)
    want = np.asarray(np.sum(rx, axis=axis))
    if want.dtype.kind in "fc" or m.is_bfloat16(want.dtype):
        wide = np.complex128 if want.dtype.kind == "c" else np.float64
        want = np.asarray(rx.astype(wide).sum(axis=axis)).astype(want.dtype)
    return want


def _check_reduction(host, want, rx, axis, op):
    """Exact for integers; floats within the reduction's rounding."""
    assert host.shape == want.shape, (host.shape, want.shape)
    assert host.dtype == want.dtype, (host.dtype, want.dtype)
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(host, want, strict=True)
        return
    key = f"kernel {want.dtype.name}" if op == "kernel" else want.dtype.name
    rtol = REDUCE_RTOL.get(key, REDUCE_RTOL[want.dtype.name])
    magnitude = np.abs(m.comparable(rx).astype(np.complex128)).sum(axis=axis)
    err = np.abs(m.comparable(host).astype(np.complex128) - m.comparable(want))
    assert (err <= rtol * (1 + magnitude)).all(), (m.comparable(host), m.comparable(want))


@pytest.mark.parametrize("cell", _params("reduce"))
def test_reduce(cell, request):
    """cubridge.sum(x, axis=a, out=z), or the ReductionKernel L2 with out=z, with x and z each
    from its own producer: z is written in place (for the stream cells, a new cubridge array)
    and equals numpy's result on the host copy. The stream cells write x on the producer's side
    stream behind a long kernel and reduce under that stream: the reduction must see the write."""
    px, pz = cell.producer.split(",")
    steps = _start_sum(cell, request, px, pz)
    bx, rx, axis = _reduce_operand(cell)
    want = _expected_reduction(cell.op, rx, axis)
    reduce = cb.sum if cell.op == "sum" else L2
    X, Z = m.LIBS[px], m.LIBS[pz]
    if cell.group == "reduce-streams":
        got = _behind_long_kernel(cell, steps, X, bx, lambda x: reduce(x, axis=axis))
        host = _read(m.LIBS["cubridge"], got, want)
        stale = _expected_reduction(cell.op, np.full_like(bx, -7.0), axis)
        if np.allclose(host, stale):
            raise m.NoStreamWait("the reduction read x from before the producer's write")
        _check_reduction(host, want, rx, axis, cell.op)
        return
    layout = cell.layout if cell.group == "reduce-layouts" else "contiguous"
    x = steps.run(px, "producer", lambda: X.view(X.make(bx, cell.device), layout))
    z = Z.make(np.zeros(want.shape, want.dtype), cell.device)
    before = Z.ptr(z)
    returned = steps.run("cubridge", "consumer", lambda: reduce(x, axis=axis, out=z))
    assert returned is z
    assert Z.ptr(z) == before
    _check_reduction(Z.read(z), want, rx, axis, cell.op)


# Modules (kind "module"): a template kernel instance that reads a template `__device__`
# variable, both named in name_expressions; one module, loaded once per device.
MODULE_SOURCE = r"""
template <typename T> __device__ T matrix_offset[4];
template <typename T> __global__ void matrix_axpo(const T* x, T* y, T a, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + matrix_offset<T>[i % 4];
}
"""
MODULE_TYPES = {"float32": "float", "float64": "double", "int32": "int"}
MODULE = cb.RawModule(
    code=MODULE_SOURCE,
    name_expressions=[f"{f}<{t}>" for t in MODULE_TYPES.values()
                      for f in ("matrix_axpo", "matrix_offset")],
)  # fmt: skip


def _write_global(cell, steps, g, offset):
    """Writes `offset` into the variable `g`: by cubridge, or through the consumer's zero-copy
    view of it (jax only reads it, after cubridge wrote it)."""
    cubridge = m.LIBS["cubridge"]
    if cell.group == "module-kernels" or cell.consumer == "jax":
        cubridge.write(g, cb.asarray(offset, device=cell.device), None)
    if cell.group == "module-kernels":
        return
    C = m.LIBS[cell.consumer]
    view = steps.run(cell.consumer, "consumer", lambda: C.consume(g, cell.protocol, cell.device))
    if C.ptr(view) != g.data_ptr:
        raise m.Copied(f"{cell.consumer} holds {C.ptr(view):#x}, the variable {g.data_ptr:#x}")
    if cell.consumer == "jax":
        cb.cuda.synchronize(cell.device)
        _check(steps.run("jax", "consumer", lambda: C.read(view)), offset)
    else:
        src = C.make(offset, cell.device)
        stream = C.default_stream(cell.device)[0]
        steps.run(cell.consumer, "consumer", lambda: C.write(view, src, stream))
    cb.cuda.synchronize(cell.device)


@pytest.mark.parametrize("cell", _params("module"))
def test_module(cell, request):
    """The module's `matrix_axpo<T>` computes y = 2 x + offset<T>[i % 4] on x and y of one
    producer (y written in place); `offset<T>` (values new to each cell) is written by cubridge
    ("module-kernels") or through each library's zero-copy view of the variable
    ("module-globals"), and the kernel must read those values."""
    _skip_if_missing(cell, cell.producer, cell.consumer)
    P, steps = m.LIBS[cell.producer], Steps(cell, request)
    ctype = MODULE_TYPES[cell.dtype]
    offset = m.reference_base(cell.dtype, (4,), seed=zlib.crc32(cell.id.encode()))
    g = MODULE.get_global(f"matrix_offset<{ctype}>", dtype=cell.dtype)
    assert str(g.device) == cell.device, g.device  # the variable on the current device
    _write_global(cell, steps, g, offset)
    kernel = MODULE.get_function(f"matrix_axpo<{ctype}>")
    bx = m.reference_base(cell.dtype, (1000,), seed=5)
    two = bx.dtype.type(2)  # 2 x is exact, so a fused multiply-add rounds as numpy does
    x = steps.run(cell.producer, "producer", lambda: P.make(bx, cell.device))
    y = P.make(np.zeros_like(bx), cell.device)
    before = P.ptr(y)
    steps.run("cubridge", "consumer", lambda: kernel(4, 256, (x, y, two, np.int64(bx.size))))
    assert P.ptr(y) == before
    _check(P.read(y), (two * bx + np.resize(offset, bx.size)).astype(bx.dtype))


# What each exchange costs: for every producer and consumer on cuda:0 (float32, 2^10 and 2^24
# elements), by DLPack as users call it (`consumer.from_dlpack(x)`: the consumer asks for the
# capsule it reads, or takes the producer's C exchange table where it reads one) and by the CUDA
# array interface alone, the median time of one exchange (the consumer's import, the device work
# it queued, the consumer's array let go) and whether the consumer copied. Recorded for
# matrix_report.py; an exchange that the pair cannot make is skipped here (its cells say why).
COST_SIZES = [1 << 10, 1 << 24]
COST_PATHS = {
    "dlpack": ("dlpack-legacy", "dlpack-versioned", "exchange-table"),
    "cai": ("cai",),
}


def _cost_params():
    out = []
    for p in m.LIBRARIES:
        for c in m.LIBRARIES:
            for path, protocols in COST_PATHS.items():
                cells = [
                    m.Cell("transfer", "dtypes", p, c, proto, "float32", "contiguous", "cuda:0")
                    for proto in protocols
                ]
                if all(m.why_not_applicable(cell) for cell in cells):
                    continue
                for n in COST_SIZES:
                    out.append(
                        pytest.param(cells[-1], path, n, id=f"{p}->{c}|{path}|{n}",
                                     marks=[pytest.mark.cuda])
                    )  # fmt: skip
    return out


def _median_seconds(fn, reps):
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@pytest.mark.parametrize(("cell", "path", "n"), _cost_params())
def test_exchange_cost(cell, path, n, request):
    _skip_if_missing(cell, cell.producer, cell.consumer, "torch")
    P, C = m.LIBS[cell.producer], m.LIBS[cell.consumer]
    torch = m.LIBS["torch"].module
    x = P.make(m.reference_base("float32", (n,)), cell.device)
    ptr = P.ptr(x)

    def exchange():
        h = m.CAIOnly(x) if path == "cai" else x
        got = C.consume(h, path, cell.device)
        torch.cuda.synchronize()
        return got

    try:
        got = exchange()
    except Exception as e:  # noqa: BLE001 - the pair's cells say why it fails
        pytest.skip(f"the exchange is refused: {type(e).__name__}: {str(e)[:120]}")
    copied = C.ptr(got) != ptr
    del got
    reps = 300 if n <= 1 << 10 else 30
    for _ in range(10):
        exchange()
    sync = _median_seconds(torch.cuda.synchronize, reps)
    seconds = max(_median_seconds(exchange, reps) - sync, 0.0)
    request.node.user_properties.append(
        (
            "cost",
            {
                "producer": cell.producer,
                "consumer": cell.consumer,
                "protocol": path,
                "n": n,
                "median_us": round(seconds * 1e6, 2),
                "copied": bool(copied),
            },
        )
    )
