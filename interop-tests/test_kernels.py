"""Users' kernels: cubridge.ElementwiseKernel and cubridge.RawKernel. Declarations are checked on
every machine; kernels run (marked ``cuda``) on torch, CuPy and cubridge arrays, every result
compared with numpy or torch."""

import gc
import os
import time

import cubridge as cb
import numpy as np
import pytest
from conftest import NUMPY_DTYPES, _try_import, jnp, run_child, sample, torch

cupy = _try_import("cupy")
HAS_GPU = cb.cuda.is_available() and torch is not None and torch.cuda.is_available()
cuda = [pytest.mark.cuda, pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")]
needs_cupy = pytest.mark.skipif(cupy is None, reason="cupy is not installed")


# --- declarations (every machine) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("ins", "outs", "message"),
    [
        ("float x", "float32 z", "is not a type"),
        ("float32", "float32 z", "TYPE NAME"),
        ("float32 i", "float32 z", "cannot name a parameter"),
        ("float32 x", "float32 x", "declared twice"),
        ("T x, float32 T", "T z", "also a parameter"),
    ],
)
def test_bad_declarations_are_refused_when_made(ins, outs, message):
    with pytest.raises(ValueError, match=message):
        cb.ElementwiseKernel(ins, outs, "z = x", "k")


def test_kernel_names_must_be_identifiers():
    with pytest.raises(ValueError, match="C identifier"):
        cb.ElementwiseKernel("float32 x", "float32 z", "z = x", "my kernel")
    with pytest.raises(ValueError, match="not a kernel name"):
        cb.RawKernel("", "two words")


@pytest.mark.skipif(cb.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_kernels_are_made_but_raise_when_called():
    k = cb.ElementwiseKernel("T x", "T z", "z = x", "copy_kernel")
    assert k.name == "copy_kernel"
    with pytest.raises(cb.CudaUnavailableError, match="copy_kernel runs on CUDA"):
        k(np.ones(3, np.float32))
    r = cb.RawKernel('extern "C" __global__ void f(float* x) {}', "f")
    with pytest.raises(cb.CudaUnavailableError):
        r(1, 32, (np.ones(3, np.float32),))


def test_raw_kernel_refuses_python_scalars():
    r = cb.RawKernel('extern "C" __global__ void f(int n) {}', "f")
    with pytest.raises(TypeError, match=r"numpy.int32\(n\)"):
        r(1, 32, (3,))


def _read_only_numpy():
    ro = np.arange(4, dtype=np.float32)
    ro.flags.writeable = False
    return ro


# Arrays whose producers do not allow writes, each made as it reaches a kernel: a read-only numpy
# array, a READ_ONLY DLPack capsule, a tensor that requires grad, a JAX array, and cubridge's
# imports of them.
READ_ONLY = {
    "numpy": _read_only_numpy,
    "cubridge": lambda: cb.asarray(_read_only_numpy()),
    "capsule": lambda: cb.asarray(_read_only_numpy()).__dlpack__(max_version=(1, 0)),
    "from capsule": lambda: cb.from_dlpack(
        cb.asarray(_read_only_numpy()).__dlpack__(max_version=(1, 0))
    ),
    "torch": lambda: torch.nn.Parameter(torch.arange(4.0)),
    "cubridge of torch": lambda: cb.asarray(torch.nn.Parameter(torch.arange(4.0))),
    "jax": lambda: jnp.arange(4, dtype=jnp.float32),
    "cubridge of jax": lambda: cb.asarray(jnp.arange(4, dtype=jnp.float32)),
}


@pytest.mark.parametrize("name", list(READ_ONLY))
def test_raw_kernel_refuses_read_only_arrays_unless_told(name):
    """A raw kernel may write any array it is given: a read-only one, however it comes (the
    producer's object or cubridge's import of it), is refused with a ValueError that says how to
    pass it on purpose; readonly_ok=True passes it (here the call then needs CUDA)."""
    if ("torch" in name and torch is None) or ("jax" in name and jnp is None):
        pytest.skip(f"{name} needs a library that is not installed")
    make = READ_ONLY[name]
    r = cb.RawKernel('extern "C" __global__ void f(const float* x, float* y) {}', "f")
    with pytest.raises(ValueError, match=r"argument 0 is read-only.*readonly_ok=True"):
        r(1, 32, (make(), np.zeros(4, np.float32)))
    with pytest.raises(ValueError, match="argument 1 is read-only"):
        r(1, 32, (np.zeros(4, np.float32), make()))
    if not cb.cuda.is_available():
        with pytest.raises(cb.CudaUnavailableError):
            r(1, 32, (make(), np.zeros(4, np.float32)), readonly_ok=True)


def _size_rule_kernel(ins, outs):
    """A kernel that does nothing, with each input and output raw (True) or not, as CuPy's tests
    of `size=` make them."""

    def params(raws, prefix):
        return ", ".join(
            f"{'raw ' if raw else ''}float32 {prefix}{k}" for k, raw in enumerate(raws)
        )

    return cb.ElementwiseKernel(params(ins, "x"), params(outs, "y"), "", "size_rule")


# CuPy's rules for `size=` (its TestElementwiseKernelSize): given (inputs raw?, outputs raw?),
# the arguments ("a" a 2-element array, "7" a scalar; an argument past the inputs is an output)
# and size=, the call runs ("ok"), needs size= ("needs size") or refuses it ("no size"). A raw
# output left out is allocated only with size=.
SIZE_RULES = [
    ((True, True), (False,), "a a", 2, "ok"),
    ((True, True), (False,), "a a", None, "needs size"),
    ((True, True), (True,), "a a", 2, "ok"),
    ((True, True), (True,), "a a", None, "needs size"),
    ((False, False), (False,), "a a", 2, "no size"),
    ((False, False), (True,), "a a", 2, "no size"),
    ((False, False), (True,), "a a", None, "raw output"),
    ((True, False), (False,), "a a", 2, "no size"),
    ((False, True), (False,), "a a", 2, "no size"),
    ((True, False), (True,), "a a", 2, "no size"),
    ((False, True), (True,), "a a", 2, "no size"),
    ((False, False), (False,), "a 7", 2, "no size"),
    ((False, False), (False,), "7 a", 2, "no size"),
    ((False, False), (True,), "a 7", 2, "no size"),
    ((False, False, True), (False,), "a 7 a", 2, "no size"),
    ((False, False, True), (True,), "a 7 a", 2, "no size"),
    ((True, False), (False,), "a 7", 2, "ok"),
    ((True, False), (False,), "a 7", None, "needs size"),
    ((False, True), (False,), "7 a", 2, "ok"),
    ((False, True), (False,), "7 a", None, "needs size"),
    ((True, False), (True,), "a 7", 2, "ok"),
    ((False, True), (True,), "7 a", None, "needs size"),
    ((True,), (False,), "a a", None, "ok"),
    ((True,), (False,), "a a", 2, "no size"),
    ((False,), (False,), "a a", None, "ok"),
    ((False,), (False,), "7 a", 2, "no size"),
    ((), (False,), "a", None, "ok"),
    ((), (False,), "a", 2, "no size"),
    ((), (True,), "a", 2, "ok"),
    ((), (True,), "a", None, "needs size"),
    ((True,), (), "a", 2, "ok"),
    ((True,), (), "a", None, "needs size"),
    ((False,), (), "a", None, "ok"),
    ((False,), (), "a", 2, "no size"),
]


@pytest.mark.parametrize(("ins", "outs", "args", "size", "expect"), SIZE_RULES)
def test_size_follows_cupys_rules(ins, outs, args, size, expect):
    """size= is required where every array is raw and refused otherwise (ValueError, as CuPy);
    kernels without outputs are made and run. On a machine without CUDA an accepted call gets
    as far as needing it."""
    kernel = _size_rule_kernel(ins, outs)

    def array():
        if HAS_GPU:
            return torch.zeros(2, device="cuda")
        return np.zeros(2, np.float32)

    call = [array() if a == "a" else 7 for a in args.split()]

    def run():
        return kernel(*call, size=size)

    if expect == "ok" and HAS_GPU:
        run()
    elif expect == "ok":
        if cb.cuda.is_available():
            pytest.skip("CUDA without torch's: the accepted calls are run where both are")
        with pytest.raises(cb.CudaUnavailableError):
            run()
    else:
        message = {
            "needs size": "pass size=",
            "no size": "size=2 can be given only when every array is raw",
            "raw output": "raw output y0 has no shape of its own",
        }[expect]
        with pytest.raises(ValueError, match=message):
            run()


@pytest.mark.parametrize("bad", ["flaot32", "single", "f4", "int32_t", "size_t", "Tx"])
def test_misspelt_kernel_types_are_refused_when_made(bad):
    """ElementwiseKernel took misspelt types as type placeholders and failed later or never.
    Like CuPy, a type longer than one letter must be a dtype name."""
    with pytest.raises(ValueError, match=f"{bad}.*bfloat16"):
        cb.ElementwiseKernel(f"{bad} x", "float32 z", "z = x", "k")
    with pytest.raises(ValueError, match=bad):
        cb.ElementwiseKernel("float32 x", f"{bad} z", "z = x", "k")


def test_grids_too_large_say_so_and_name_the_limit():
    """A grid or block of 2**40 was reported as "must be positive"."""
    r = cb.RawKernel('extern "C" __global__ void f() {}', "f")
    with pytest.raises(ValueError, match=r"too large.*2147483647"):
        r(2**40, 32, ())
    with pytest.raises(ValueError, match=r"too large.*65535"):
        r((1, 70000), 32, ())
    with pytest.raises(ValueError, match="too large"):
        r(1, 2**40, ())
    with pytest.raises(ValueError, match="positive"):
        r(0, 32, ())
    with pytest.raises(ValueError, match="positive"):
        r(-(2**70), 32, ())
    with pytest.raises(ValueError, match="too large"):
        r([1, 2**70], 32, ())
    with pytest.raises(ValueError, match=r"grid -\d+ must be positive"):
        r(-(2**200), 32, ())
    with pytest.raises(ValueError, match=r"block \(1, \d+\) is too large"):
        r(1, (1, 2**200), ())
    # Any sequence of ints, as before: numpy arrays and ranges too.
    with pytest.raises(ValueError, match=r"grid \[4, 0\] must be positive"):
        r(np.array([4, 0]), 32, ())
    with pytest.raises(ValueError, match=r"block \[0\] must be positive"):
        r(1, range(0, 1), ())


@pytest.mark.parametrize(
    "grid, block, args, message",
    [
        (1.5, 32, (), "grid must be an int or a tuple"),
        ("1", 32, (), "grid must be an int or a tuple"),
        (1, (), (), "block must be an int or a tuple"),
        (1, (1, 1, 1, 1), (), "block must be an int or a tuple"),
        (1, (32, None), (), "block must be an int or a tuple"),
        (1, 32, 5, "args must be a tuple or a list"),
        (1, 32, iter(()), "args must be a tuple or a list"),
        (1, range(5), (), "block must be an int or a tuple"),
    ],
)
def test_malformed_launches_are_refused_with_what_is_wrong(grid, block, args, message):
    r = cb.RawKernel('extern "C" __global__ void f() {}', "f")
    with pytest.raises(TypeError, match=message):
        r(grid, block, args)


def test_raw_kernel_options_as_documented():
    """The README showed `RawKernel(source, name, options)` positionally, which raised
    TypeError."""
    src = 'extern "C" __global__ void f() {}'
    assert cb.RawKernel(src, "f", ("-DN=4",)).name == "f"
    assert cb.RawKernel(src, "f", options=["--use_fast_math"]).name == "f"


# --- ElementwiseKernel on the GPU ---------------------------------------------------------------

AXPY = cb.ElementwiseKernel(
    "T x, T y, float32 a", "T z", "z = (T)(a * (float)x + (float)y)", "axpy"
)
SUM = cb.ElementwiseKernel("T x, T y", "T z", "z = x + y", "sum_kernel")


def _t(x):
    return torch.from_numpy(np.ascontiguousarray(x)).cuda()


def _host(z):
    if isinstance(z, torch.Tensor):
        return z.cpu().numpy()
    return np.asarray(cb.asarray(z, device="cpu"))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
@pytest.mark.parametrize("dtype", [d for d in NUMPY_DTYPES if not d.startswith("uint")])
def test_every_dtype_on_torch_tensors(dtype):
    x, y = sample((1000,), dtype, 1), sample((1000,), dtype, 2)
    z = SUM(_t(x), _t(y))
    assert isinstance(z, cb.Array) and z.dtype == cb.dtype(dtype)
    if dtype == "float16":
        want = (x.astype(np.float32) + y.astype(np.float32)).astype(np.float16)
    else:
        want = x + y
    np.testing.assert_array_equal(_host(z), want)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("n", [1, 7, 4096 + 3, 1 << 20])
def test_axpy_matches_torch(dtype, n):
    td = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(n)
    x = torch.randn(n, device="cuda", generator=g).to(td)
    y = torch.randn(n, device="cuda", generator=g).to(td)
    z = AXPY(x, y, 2.5)
    # NVRTC fuses a * x + y in float32 into one rounding (an FMA), as nvcc and CuPy do, before
    # the cast to T: float64 holds the exact value, rounded once to float32, then to T.
    want = (2.5 * x.double() + y.double()).float().to(td)
    got = torch.from_dlpack(z)
    assert got.data_ptr() == z.data_ptr  # torch reads the result in place
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # Misaligned views take the one-element path, not the vector one.
    z2 = AXPY(x[1:], y[1:], 2.5)
    torch.testing.assert_close(torch.from_dlpack(z2), want[1:], rtol=0, atol=0)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
@pytest.mark.parametrize(
    "case", ["transposed", "broadcast-row", "broadcast-col", "negative", "9-d", "0-d"]
)
def test_layouts_against_numpy(case):
    rng = np.random.default_rng(0)
    if case == "9-d":
        # Nine dimensions merge into one when every operand is contiguous; reversed against a
        # contiguous one, none merge, and more than eight are refused with a reason.
        a = rng.standard_normal((2,) * 9).astype(np.float32)
        x = y = _t(a)
        rx = ry = a
        with pytest.raises(ValueError, match="at most 8"):
            SUM(x.permute(8, 7, 6, 5, 4, 3, 2, 1, 0), y)
    elif case == "0-d":
        rx = ry = np.float32(3.0) * np.ones((), np.float32)
        x, y = _t(rx), _t(ry)
    else:
        a = rng.standard_normal((37, 53)).astype(np.float32)
        b = rng.standard_normal((53, 37)).astype(np.float32)
        row = rng.standard_normal((53,)).astype(np.float32)
        col = rng.standard_normal((37, 1)).astype(np.float32)
        rx, ry = {
            "transposed": (a, b.T),
            "broadcast-row": (a, row),
            "broadcast-col": (a, col),
            "negative": (a[::-1, ::-2], b.T[::-1, ::-2]),
        }[case]
        x = _t(a)
        y = {
            "transposed": _t(b).T,
            "broadcast-row": _t(row),
            "broadcast-col": _t(col),
        }.get(case)
        if case == "negative":
            # torch has no negative strides: CuPy views of the same layouts, when present.
            if cupy is None:
                pytest.skip("cupy is not installed")
            x, y = cupy.asarray(a)[::-1, ::-2], cupy.asarray(b).T[::-1, ::-2]
    z = SUM(x, y)
    np.testing.assert_array_equal(_host(z), rx + ry)
    # Into a transposed foreign output, in place.
    out = torch.empty(tuple(reversed(z.shape)), device="cuda").T if z.ndim == 2 else None
    if out is not None:
        assert SUM(x, y, out=out) is out
        np.testing.assert_array_equal(out.cpu().numpy(), rx + ry)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64", "complex64"])
@pytest.mark.parametrize("shape", [(130, 194), (64, 64), (3, 1000), (1000, 3), (2, 2)])
def test_transposed_inputs_take_the_tiled_kernel_and_match_torch(
    dtype, shape, tmp_path, monkeypatch
):
    # A kernel of two inputs (a scalar between them) or one input, and one output that is only
    # assigned, takes add's tiled kernel for a transposed input: a program of its own, compiled
    # in the background when a transposed layout first needs it (an empty kernel cache shows
    # it; that first call runs the strided kernel), whose results must equal torch's at every
    # tile edge, padded or not, whichever input is transposed. The scalar is 2 and the one-input
    # kernel doubles, so every result is one rounding of an exact value, whatever the
    # arithmetic contracts.
    monkeypatch.setenv("CUBRIDGE_CACHE_DIR", str(tmp_path))
    tag = f"{dtype}_{shape[0]}x{shape[1]}"
    two = cb.ElementwiseKernel("T x, T a, T y", "T z", "z = x * a + y", f"tile2_{tag}")
    one = cb.ElementwiseKernel("T x", "T z", "z = x + x", f"tile1_{tag}")
    td = getattr(torch, dtype)
    wide = torch.complex128 if td.is_complex else torch.float64
    g = torch.Generator(device="cuda").manual_seed(sum(shape))
    rows, cols = shape

    def rand(r, c):
        return torch.randn(r, c, device="cuda", generator=g, dtype=wide).to(td)

    x, y = rand(rows, cols), rand(rows, cols)
    xt, yt = rand(cols, rows).T, rand(cols, rows).T
    two(x, 2, y)  # contiguous operands: the flat program
    one(x)
    flat = len(list(tmp_path.iterdir()))
    # The first transposed calls: the strided kernel, the tiled programs compiling meanwhile.
    want = (xt.to(wide) * 2 + y.to(wide)).to(td)
    torch.testing.assert_close(torch.from_dlpack(two(xt, 2, y)), want, rtol=0, atol=0)
    torch.testing.assert_close(torch.from_dlpack(one(xt)), xt + xt, rtol=0, atol=0)
    cb.cuda.wait_for_compiles()
    # Each kernel compiled its tiled program (and the strided one that ran meanwhile).
    assert len(list(tmp_path.iterdir())) >= flat + 4
    tiled = [n for n, _ in cb.cuda.loaded_programs() if n.endswith("_tiled32")]
    for kernel in (f"tile2_{tag}_", f"tile1_{tag}_"):
        assert any(n.startswith(kernel) for n in tiled), kernel
    for u, v in [(xt, y), (x, yt), (xt, yt)]:
        want = (u.to(wide) * 2 + v.to(wide)).to(td)
        got = torch.from_dlpack(two(u, 2, v))
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        # Into a transposed foreign output, in place.
        out = torch.empty(cols, rows, device="cuda", dtype=td).T
        assert two(u, 2, v, out=out) is out
        torch.testing.assert_close(out, want, rtol=0, atol=0)
    torch.testing.assert_close(torch.from_dlpack(one(xt)), xt + xt, rtol=0, atol=0)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_raw_parameters_index_and_size():
    rev = cb.ElementwiseKernel("raw T w", "T z", "z = w[_ind.size() - i - 1]", "reverse")
    w = torch.arange(10, dtype=torch.float32, device="cuda")
    z = torch.empty(10, device="cuda")
    assert rev(w, z) is z  # outputs may be passed positionally
    np.testing.assert_array_equal(z.cpu().numpy(), np.arange(10, dtype=np.float32)[::-1])
    # Only raw arrays: the loop's size comes from size=.
    fill = cb.ElementwiseKernel("raw T w", "raw T z", "z[i] = w[i] * 2", "double_raw")
    z2 = torch.zeros(4, 5, device="cuda").T  # a strided raw output
    fill(torch.arange(20.0, device="cuda").reshape(5, 4), z2, size=20)
    np.testing.assert_array_equal(z2.cpu().numpy().reshape(-1), 2 * np.arange(20, dtype=np.float32))
    with pytest.raises(ValueError, match="size="):
        fill(w, torch.zeros(10, device="cuda"))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_raw_outputs_are_allocated_with_size():
    """A raw output left out is allocated with size= elements, as CuPy's are."""
    n = 100
    raw_sum = cb.ElementwiseKernel("raw T x, raw T y", "raw T z", "z[i] = x[i] + y[i]", "raw_sum")
    x, y = sample((n,), "float32", 1), sample((n,), "float32", 2)
    z = raw_sum(_t(x), _t(y), size=n)
    assert z.shape == (n,) and z.dtype == cb.float32
    np.testing.assert_array_equal(_host(z), x + y)
    # With an element input setting the loop, the raw output has no size: it must be passed.
    gather = cb.ElementwiseKernel("T x", "raw T z", "z[i] = x", "raw_out")
    with pytest.raises(ValueError, match="raw output z"):
        gather(_t(x))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_kernels_without_outputs_write_raw_inputs_in_stream_order():
    """A kernel without outputs runs (returning an empty tuple, as CuPy's) and writes through its
    raw inputs; those writes are recorded, so work on another stream waits for them."""
    n = 1 << 20
    double_into = cb.ElementwiseKernel("T x, raw T y", "", "y[i] = x * 2", "double_into")
    x = torch.arange(n, dtype=torch.float32, device="cuda")
    y = cb.zeros(n, dtype=cb.float32, device="cuda")
    side = torch.cuda.Stream()
    cycles = int(0.1 * torch.cuda.get_device_properties(0).clock_rate * 1000)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(cycles)
        assert double_into(x, y) == ()  # on torch's current stream, behind the sleep
    # On the legacy default stream: waits for the write of y on the side stream.
    copied = cb.add(y, 0.0, stream=1)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(_host(copied), 2 * np.arange(n, dtype=np.float32))
    # Only raw arrays: size= sets the loop.
    fill = cb.ElementwiseKernel("raw T y, T v", "", "y[i] = v", "fill_raw")
    t = torch.zeros(10, device="cuda")
    assert fill(t, np.float32(3), size=4) == ()
    np.testing.assert_array_equal(t.cpu().numpy(), [3, 3, 3, 3, 0, 0, 0, 0, 0, 0])


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_the_index_counts_c_order_whatever_the_layouts():
    # `i` is the element's C-order position in the loop's shape, as in CuPy, also when the
    # output is a transposed view and the inputs are Fortran-ordered (a loop that followed the
    # output's memory order would count otherwise).
    pos = cb.ElementwiseKernel("T x", "T z", "z = x + (T)(i * 1000)", "with_index")
    x = torch.arange(12.0, device="cuda").reshape(4, 3).T  # (3, 4), Fortran-ordered
    z = torch.empty(4, 3, device="cuda").T  # (3, 4), transposed view
    assert pos(x, out=z) is z
    want = x.cpu().numpy() + 1000 * np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(z.cpu().numpy(), want)
    # Without `i`, the same kernel over the same layouts (the loop may follow memory order).
    plain = cb.ElementwiseKernel("T x", "T z", "z = x + (T)1000", "without_index")
    assert plain(x, out=z) is z
    np.testing.assert_array_equal(z.cpu().numpy(), x.cpu().numpy() + 1000)
    # A raw array read at `i` into a transposed output.
    gather = cb.ElementwiseKernel("raw T w, T x", "T z", "z = w[i] + x", "gather_index")
    w = torch.arange(12.0, device="cuda")
    gather(w, torch.zeros(3, 4, device="cuda"), out=z)
    np.testing.assert_array_equal(z.cpu().numpy(), np.arange(12, dtype=np.float32).reshape(3, 4))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_two_outputs_scalars_and_type_binding():
    k = cb.ElementwiseKernel("T x, T s", "T p, float64 q", "p = x * s; q = (double)x + s", "two")
    x = torch.arange(6, dtype=torch.int32, device="cuda")
    p, q = k(x, 3)  # the Python int takes x's type
    np.testing.assert_array_equal(_host(p), np.arange(6, dtype=np.int32) * 3)
    assert q.dtype == cb.float64
    np.testing.assert_array_equal(_host(q), np.arange(6) + 3.0)
    # A numpy scalar binds a type name that no array binds.
    fill = cb.ElementwiseKernel("T v", "T z", "z = v", "fill")
    z = fill(np.float64(2.5), size=4)
    assert z.dtype == cb.float64 and z.device.type == "cuda"
    np.testing.assert_array_equal(_host(z), np.full(4, 2.5))
    with pytest.raises(TypeError, match="two dtypes"):
        AXPY(x, x, np.float32(1.0), out=torch.empty(6, device="cuda"))  # T: int32 and float32
    with pytest.raises(TypeError, match="declared float32"):
        AXPY(x.float(), x.float(), torch.ones(6, device="cuda", dtype=torch.float64))
    with pytest.raises(TypeError):
        SUM(x, x.float())  # one type name, two dtypes
    with pytest.raises(TypeError):
        k(x.float(), 1.5 + 2j)  # a complex value into a real type


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
@needs_cupy
def test_cupy_and_cubridge_operands_and_outputs_in_place():
    x = cupy.arange(100, dtype=cupy.float32)
    y = cb.arange(100, dtype=cb.float32, device="cuda")
    out = cupy.zeros(100, dtype=cupy.float32)
    assert SUM(x, y, out=out) is out
    np.testing.assert_array_equal(cupy.asnumpy(out), 2 * np.arange(100, dtype=np.float32))
    # The same kernel object serves cupy, torch and cubridge outputs.
    t = torch.zeros(100, device="cuda")
    assert SUM(x, y, out=(t,)) is t
    np.testing.assert_array_equal(t.cpu().numpy(), 2 * np.arange(100, dtype=np.float32))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_errors_are_clear_and_launch_nothing():
    x = torch.ones(8, device="cuda")
    before = cb.cuda.memory_stats()["allocations"]
    bad = cb.ElementwiseKernel("T x", "T z", "z = x +* 1", "broken")
    with pytest.raises(cb.CompileError, match=r"line \d+: z = x \+\* 1"):
        bad(x)
    with pytest.raises(TypeError, match="takes 3 input"):
        AXPY(x, x)
    with pytest.raises(ValueError, match="elementwise kernels run on one CUDA device"):
        SUM(x, np.ones(8, np.float32) * np.arange(8, dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        SUM(x, x, out=torch.empty(4, device="cuda"))
    with pytest.raises(ValueError, match="out= gives 2"):
        SUM(x, x, out=(x, x))
    with pytest.raises(BufferError, match="requires grad"):
        SUM(x, x, out=torch.zeros(8, device="cuda", requires_grad=True))
    gc.collect()
    assert cb.cuda.memory_stats()["allocations"] == before


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_runs_on_the_current_torch_stream_after_its_writes():
    side = torch.cuda.Stream()
    cycles = int(0.1 * torch.cuda.get_device_properties(0).clock_rate * 1000)
    x = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(cycles)
        x.fill_(4.0)  # queued behind 0.1 s on the side stream
        z = SUM(x, x)  # runs on the side stream (torch's current one), after the fill
        y = torch.from_dlpack(z) + 0
    torch.cuda.synchronize()
    assert (y == 8.0).all()
    # An explicit stream= wins; the call does not wait for unrelated work on another stream.
    busy = torch.cuda.Stream()
    with torch.cuda.stream(busy):
        torch.cuda._sleep(cycles)
    start = time.perf_counter()
    z = SUM(x, x, stream=torch.cuda.default_stream())
    elapsed = time.perf_counter() - start
    assert elapsed < 0.05, f"the call waited {elapsed * 1e3:.1f} ms for an unrelated stream"
    torch.cuda.synchronize()
    assert (torch.from_dlpack(z) == 8.0).all()


COND = ("T x", "T z", "if (x > 0) z = x")
BRANCHES = ("T x", "T z, T w", "if (x > 0) z = x; else w = -x")


def _cupy_reference(spec, inputs, outs):
    """CuPy's ElementwiseKernel of the same declaration, run on CuPy views of copies of the same
    device memory (None where CuPy is not installed)."""
    if cupy is None:
        return None
    k = cupy.ElementwiseKernel(*spec, name="reference")
    ins = [cupy.asarray(x) for x in inputs]
    copies = [cupy.asarray(o).copy() for o in outs]
    k(*ins, *copies)
    return [cupy.asnumpy(c) for c in copies]


def _layouts(n_rows, n_cols):
    """Operands of each loop path, as (name, x, outs): vector (contiguous, aligned), flat
    (misaligned by one element), strided (a permuted 3-D view), and tiled (x transposed, the
    layout that takes the tiled kernel for an unconditional operation)."""
    g = torch.Generator(device="cuda").manual_seed(7)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", generator=g)

    def ones(*shape):
        return torch.ones(*shape, device="cuda")

    return [
        ("vector", rand(65536), lambda: ones(65536)),
        ("flat", rand(65536 + 1)[1:], lambda: ones(65536 + 1)[1:]),
        # (32, 16, 24) views of two different memory orders: no dimension merges.
        ("strided", rand(16, 24, 32).permute(2, 0, 1), lambda: ones(24, 32, 16).permute(1, 2, 0)),
        ("tiled", rand(n_cols, n_rows).T, lambda: ones(n_rows, n_cols)),
    ]


@pytest.mark.parametrize("path", ["vector", "flat", "strided", "tiled"])
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_conditional_assignment_keeps_unassigned_elements(path):
    """`if (x > 0) z = x` with out= a torch tensor of ones rewrote 32,898 of 65,536 elements with
    garbage on the vector path and 74,937 of 150,000 on the tiled one: the output was stored
    without being loaded. Every element x <= 0 keeps its 1, as in CuPy's kernel."""
    _, x, make_out = next(c for c in _layouts(300, 500) if c[0] == path)
    k = cb.ElementwiseKernel(*COND, f"cond_{path}")
    out = make_out()
    assert out.shape == x.shape
    before = out.clone()
    assert k(x, out=out) is out
    host_x, host_out = x.cpu().numpy(), out.cpu().numpy()
    np.testing.assert_array_equal(host_out, np.where(host_x > 0, host_x, before.cpu().numpy()))
    ref = _cupy_reference(COND, [x], [before])
    if ref is not None:
        np.testing.assert_array_equal(host_out, ref[0])


@pytest.mark.parametrize("path", ["vector", "flat", "strided"])
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_two_outputs_each_assigned_on_one_branch(path):
    """A two-output `if/else` kernel rewrote about a third of each output."""
    _, x, make_out = next(c for c in _layouts(300, 500) if c[0] == path)
    k = cb.ElementwiseKernel(*BRANCHES, f"branches_{path}")
    z, w = make_out(), make_out()
    w.mul_(2)
    z0, w0 = z.clone(), w.clone()
    got = k(x, out=(z, w))
    assert got[0] is z and got[1] is w
    hx = x.cpu().numpy()
    np.testing.assert_array_equal(z.cpu().numpy(), np.where(hx > 0, hx, z0.cpu().numpy()))
    np.testing.assert_array_equal(w.cpu().numpy(), np.where(hx > 0, w0.cpu().numpy(), -hx))
    ref = _cupy_reference(BRANCHES, [x], [z0, w0])
    if ref is not None:
        np.testing.assert_array_equal(z.cpu().numpy(), ref[0])
        np.testing.assert_array_equal(w.cpu().numpy(), ref[1])


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_plain_assignment_still_writes_every_element():
    """The unconditional `z = a * x + y` keeps its store-only path and writes every element of
    a poisoned output."""
    k = cb.ElementwiseKernel("T x, T y, T a", "T z", "z = a * x + y", "plain_axpy")
    g = torch.Generator(device="cuda").manual_seed(3)
    x, y = (torch.randn(1 << 16, device="cuda", generator=g) for _ in range(2))
    out = torch.full((1 << 16,), float("nan"), device="cuda")
    k(x, y, 2.0, out=out)
    torch.testing.assert_close(out, (2 * x.double() + y.double()).float(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_complex_kernels_have_the_operators_users_write(dtype):
    """`z = -x` and `z = 2.0f * x` failed to compile for complex64/complex128."""
    rng = np.random.default_rng(5)
    hx = (rng.standard_normal(256) + 1j * rng.standard_normal(256)).astype(dtype)
    hy = (rng.standard_normal(256) + 1j * rng.standard_normal(256)).astype(dtype)
    x, y = torch.from_numpy(hx).cuda(), torch.from_numpy(hy).cuda()
    lit = "2.0f" if dtype == "complex64" else "2.0"
    cases = {
        "z = -x": -hx,
        "z = +x": hx,
        f"z = {lit} * x": 2 * hx,
        f"z = {lit} + x": 2 + hx,
        f"z = {lit} - x": 2 - hx,
        f"z = {lit} / x": 2 / hx,
        "z = x * 2": hx * 2,
        "z = conj(x) * y": np.conj(hx) * hy,
        "z = T(norm(x), abs(y))": np.abs(hx) ** 2 + 1j * np.abs(hy),
        "z = x; z -= y; z *= T(0, 1)": (hx - hy) * 1j,
        "z = (x == x && x != y) ? x : y": hx,
    }
    for op, want in cases.items():
        k = cb.ElementwiseKernel("T x, T y", "T z", op, "complex_ops")
        got = torch.from_dlpack(k(x, y)).cpu().numpy()
        rtol = 1e-6 if dtype == "complex64" else 1e-14
        np.testing.assert_allclose(got, want.astype(dtype), rtol=rtol, err_msg=op)


# --- RawKernel ---------------------------------------------------------------------------------

SCALE = r"""
extern "C" __global__ void scale(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
extern "C" __global__ void reverse_shared(const float* x, float* y, int n) {
    extern __shared__ float tile[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) tile[i] = x[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = tile[n - 1 - i];
}
"""


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
@pytest.mark.parametrize("lib", ["torch", "cupy", "cubridge"])
def test_raw_kernel_on_each_producer(lib):
    if lib == "cupy" and cupy is None:
        pytest.skip("cupy is not installed")
    n = 1000
    ref = np.arange(n, dtype=np.float32)
    make = {
        "torch": lambda a: torch.from_numpy(a).cuda(),
        "cupy": lambda a: cupy.asarray(a) if cupy is not None else None,
        "cubridge": lambda a: cb.asarray(a, device="cuda"),
    }[lib]
    x, y = make(ref), make(np.zeros(n, np.float32))
    k = cb.RawKernel(SCALE, "scale")
    k((n + 255) // 256, 256, (x, y, np.float32(0.5), np.int32(n)))
    np.testing.assert_array_equal(np.asarray(_host(cb.asarray(y))), 0.5 * ref)
    # 64 KiB of dynamic shared memory: more than a block gets without opting in.
    m = 16384
    big = make(np.arange(m, dtype=np.float32))
    out = make(np.zeros(m, np.float32))
    cb.RawKernel(SCALE, "reverse_shared")(1, 256, [big, out, np.int32(m)], shared_mem=m * 4)
    np.testing.assert_array_equal(
        np.asarray(_host(cb.asarray(out))), np.arange(m, dtype=np.float32)[::-1]
    )


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_raw_kernel_errors_and_stream_order():
    x = torch.ones(8, device="cuda")
    k = cb.RawKernel(SCALE, "scale")
    with pytest.raises(ValueError, match="1024"):
        k(1, (64, 32), (x, x, np.float32(1), np.int32(8)))
    with pytest.raises(ValueError, match="positive"):
        k(0, 32, (x, x, np.float32(1), np.int32(8)))
    with pytest.raises(cb.CompileError, match="undefined") as compile_error:
        cb.RawKernel('extern "C" __global__ void f() { nope(); }', "f").compile()
    assert compile_error.value.code == 6  # NVRTC_ERROR_COMPILATION
    with pytest.raises(cb.CudaError, match="NOT_FOUND") as driver_error:
        cb.RawKernel(SCALE, "missing").compile()
    assert driver_error.value.code == 500  # CUDA_ERROR_NOT_FOUND
    with pytest.raises(ValueError, match="one CUDA device"):
        k(1, 32, (x, np.ones(8, np.float32), np.float32(1), np.int32(8)))
    # On a side stream behind a long kernel: the launch follows the write of x on that stream.
    side = torch.cuda.Stream()
    cycles = int(0.1 * torch.cuda.get_device_properties(0).clock_rate * 1000)
    y = torch.zeros(8, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(cycles)
        x.fill_(3.0)
        k(1, 32, (x, y, np.float32(2.0), np.int32(8)))
    torch.cuda.synchronize()
    assert (y == 6.0).all()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_raw_kernel_reads_read_only_arrays_when_told():
    """A tensor that requires grad, or cubridge's import of it, is refused as a raw kernel's
    argument (nothing runs) unless readonly_ok=True, and then read in place."""
    n = 1000
    w = torch.nn.Parameter(torch.arange(n, dtype=torch.float32, device="cuda"))
    y = torch.zeros(n, device="cuda")
    k = cb.RawKernel(SCALE, "scale")
    grid = (n + 255) // 256
    for x in (w, cb.asarray(w)):
        with pytest.raises(ValueError, match="readonly_ok=True"):
            k(grid, 256, (x, y, np.float32(2.0), np.int32(n)))
    torch.cuda.synchronize()
    assert (y == 0).all()
    for x in (w, cb.asarray(w)):
        y.zero_()
        k(grid, 256, (x, y, np.float32(2.0), np.int32(n)), readonly_ok=True)
        torch.testing.assert_close(y, 2 * w.detach(), rtol=0, atol=0)


# A kernel that launches a kernel (dynamic parallelism): relocatable device code.
DYNAMIC = r"""
extern "C" __global__ void child(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2 * y[i] + 1;
}
extern "C" __global__ void parent(float* y, int n) {
    if (blockIdx.x == 0 && threadIdx.x == 0) child<<<(n + 255) / 256, 256>>>(y, n);
}
"""


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
@pytest.mark.parametrize("option", ["-rdc=true", "--relocatable-device-code=true", "-dc"])
def test_relocatable_device_code_is_linked_with_the_device_runtime(option, tmp_path):
    """Relocatable code failed to load (CUDA_ERROR_NOT_FOUND): it is now linked with the CUDA
    device runtime, and the linked cubin is what the disk cache keeps, so a process without
    NVRTC loads it from there."""
    code = (
        "import numpy as np, torch, cubridge as cb\n"
        "n = 1000\n"
        "y = torch.arange(n, dtype=torch.float32, device='cuda')\n"
        f"k = cb.RawKernel({DYNAMIC!r}, 'parent', options=({option!r},))\n"
        "k(1, 32, (y, np.int32(n)))\n"
        "torch.cuda.synchronize()\n"
        "np.testing.assert_array_equal(y.cpu().numpy(), 2 * np.arange(n, dtype=np.float32) + 1)\n"
    )
    env = dict(os.environ, CUBRIDGE_CACHE_DIR=str(tmp_path))
    run_child(code, env)
    assert len(list(tmp_path.glob("*.bin"))) == 1
    run_child(code, dict(env, CUBRIDGE_NVRTC="0"))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_a_call_loads_only_the_variant_it_runs():
    """Each loop variant of a signature is a program of its own, loaded when a call first needs
    it: a contiguous call loads the vector kernel alone, a transposed one the tiled kernel, a
    strided one the strided kernel. add is an instance of the same engine."""
    triple = cb.ElementwiseKernel("T x", "T z", "z = x * 3", "only_needed")

    def loaded(prefix):
        return sorted(n for n, _ in cb.cuda.loaded_programs() if n.startswith(prefix))

    x = torch.arange(1024, dtype=torch.float32, device="cuda")
    z = triple(x)
    np.testing.assert_array_equal(torch.from_dlpack(z).cpu().numpy(), (x * 3).cpu().numpy())
    assert loaded("only_needed_") == ["only_needed_float32_float32_vector32"]
    t = x.view(32, 32).t()
    z = triple(t)
    np.testing.assert_array_equal(torch.from_dlpack(z).cpu().numpy(), (t * 3).cpu().numpy())
    z = triple(x[::2])
    np.testing.assert_array_equal(torch.from_dlpack(z).cpu().numpy(), (x[::2] * 3).cpu().numpy())
    cb.cuda.wait_for_compiles()  # the tiled program may compile in the background
    assert loaded("only_needed_") == [
        "only_needed_float32_float32_strided32",
        "only_needed_float32_float32_tiled32",
        "only_needed_float32_float32_vector32",
    ]
    # add's programs: int8 + int32 ships no kernel (it compiles) and runs contiguous here.
    a = torch.arange(100, dtype=torch.int8, device="cuda")
    b = torch.arange(100, dtype=torch.int32, device="cuda")
    r = cb.add(a, b)
    np.testing.assert_array_equal(torch.from_dlpack(r).cpu().numpy(), (a + b).cpu().numpy())
    assert len(loaded("add_int8_int32_int32_")) == 1


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_a_first_transposed_call_does_not_wait_for_the_tiled_compile(tmp_path, monkeypatch):
    """With an empty kernel cache, the first call on a transposed input compiles the strided
    kernel and runs it, while the tiled program (hundreds of milliseconds of NVRTC) compiles on
    a background thread; once it is loaded, calls take it. Every result equals torch's."""
    monkeypatch.setenv("CUBRIDGE_CACHE_DIR", str(tmp_path))
    name = f"background_{os.getpid()}_{time.monotonic_ns()}"  # a source NVRTC never saw
    k = cb.ElementwiseKernel("T x, T y", "T z", "z = x * 2 + y", name)  # one rounding

    def programs():
        return sorted(n.rsplit("_", 1)[1] for n, _ in cb.cuda.loaded_programs() if name in n)

    g = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(300, 500, device="cuda", generator=g).T
    y = torch.randn(500, 300, device="cuda", generator=g)
    want = (x.double() * 2 + y.double()).float()
    first = k(x, y)
    assert programs() == ["strided32"]  # the call returned before the tiled compile ended
    torch.testing.assert_close(torch.from_dlpack(first), want)
    cb.cuda.wait_for_compiles()
    assert programs() == ["strided32", "tiled32"]
    later = k(x, y)
    torch.testing.assert_close(torch.from_dlpack(later), want)
    assert torch.equal(torch.from_dlpack(later), torch.from_dlpack(first))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_a_process_that_exits_during_a_background_compile_exits_cleanly(tmp_path):
    """A new process whose one call is a transposed first call exits at once after it: the exit
    waits for the tiled program compiling in the background (NVRTC must not be torn down under
    it), so the process exits with 0 and the program is in the disk cache for the next one."""
    child = f"""
import torch, cubridge as cb
k = cb.ElementwiseKernel("T x, T y", "T z", "z = x * 2 + y", "exiting_{os.getpid()}")
x = torch.randn(300, 500, device="cuda").T
y = torch.randn(500, 300, device="cuda")
assert torch.equal(torch.from_dlpack(k(x, y)), x * 2 + y)
assert not any("tiled" in n for n, _ in cb.cuda.loaded_programs())
"""
    env = dict(os.environ, CUBRIDGE_CACHE_DIR=str(tmp_path), CUDA_CACHE_PATH=str(tmp_path / "nv"))
    run_child(child, env)
    files = [f for f in tmp_path.iterdir() if f.suffix == ".bin"]
    assert len(files) == 2, files  # the strided program and the tiled one


# --- RawModule ---------------------------------------------------------------------------------

MODULE = r"""
template <typename T> __global__ void axpb(const T* x, T* y, T a, T b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
__device__ float bias[4];
__constant__ int factor;
template <int N> __device__ int table[N];
extern "C" __global__ void apply(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * factor + bias[i % 4];
}
extern "C" __global__ void fill_table(int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) table<3>[i] = 10 * (i + 1);
}
"""
MODULE_NAMES = ["axpb<float>", "axpb<double>", "table<3>"]


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"code": MODULE, "path": "module.cubin"}],
    ids=["neither", "both"],
)
def test_raw_module_takes_code_or_path(kwargs):
    with pytest.raises(TypeError, match=r"exactly one of code= .* and path="):
        cb.RawModule(**kwargs)


def test_raw_module_arguments_are_strings():
    with pytest.raises(TypeError, match="name_expressions entries must be strings; entry 1"):
        cb.RawModule(code=MODULE, name_expressions=["axpb<float>", 3])
    with pytest.raises(TypeError, match="name_expressions must be a tuple or list"):
        cb.RawModule(code=MODULE, name_expressions="axpb<float>")
    with pytest.raises(TypeError, match="options must be a tuple or list"):
        cb.RawModule(code=MODULE, options="-DN=1")
    with pytest.raises(ValueError, match="not a name expression"):
        cb.RawModule(code=MODULE, name_expressions=[""])


def test_raw_module_refuses_what_cannot_apply_to_a_file(tmp_path):
    """NVRTC's options and name expressions cannot apply to a precompiled file: refused, naming
    them, rather than ignored; a file that is no module is refused naming the file."""
    ptx = tmp_path / "k.ptx"
    ptx.write_text(".version 8.0\n.target sm_80\n.address_size 64\n")
    with pytest.raises(ValueError, match=r'option "-DN=1" cannot apply to the precompiled file'):
        cb.RawModule(path=ptx, options=("-DN=1",))
    with pytest.raises(ValueError, match=r'name expression "f<int>" cannot apply'):
        cb.RawModule(path=str(ptx), name_expressions=["f<int>"])
    junk = tmp_path / "k.bin"
    junk.write_bytes(b"MZ\x90\x00 not a module")
    with pytest.raises(ValueError, match=r"k\.bin is not a cubin, PTX or fatbin"):
        cb.RawModule(path=junk)
    with pytest.raises(ValueError, match="cannot read"):
        cb.RawModule(path=tmp_path / "missing.cubin")
    cb.RawModule(path=ptx)  # loaded at first use


def test_raw_module_template_instances_must_be_name_expressions():
    """A template instance that NVRTC was not asked to instantiate is named in the error,
    before anything is compiled (on every machine)."""
    m = cb.RawModule(code=MODULE, name_expressions=MODULE_NAMES)
    with pytest.raises(ValueError, match=r"axpb<int> is a template instance that is not in"):
        m.get_function("axpb<int>")
    with pytest.raises(ValueError, match=r"table<4> is a template instance"):
        m.get_global("table<4>")


@pytest.mark.skipif(cb.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_modules_are_made_but_raise_when_used():
    m = cb.RawModule(code=MODULE, name_expressions=MODULE_NAMES)
    for use in (m.compile, lambda: m.get_function("apply"), lambda: m.get_global("bias")):
        with pytest.raises(cb.CudaUnavailableError):
            use()


def _raw_modules():
    return sum(1 for name, _ in cb.cuda.loaded_programs() if name == "raw_module")


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_raw_module_template_instances_run_on_torch():
    """Template instances through name_expressions and extern "C" kernels of one module, which
    is compiled lazily, once for the device, whatever is asked of it."""
    source = MODULE + "// template instances\n"
    before = _raw_modules()
    m = cb.RawModule(code=source, name_expressions=MODULE_NAMES)
    assert _raw_modules() == before
    n = 1000
    for dtype, instance, scalar in [
        (torch.float32, "axpb<float>", np.float32),
        (torch.float64, "axpb<double>", np.float64),
    ]:
        k = m.get_function(instance)
        x = torch.linspace(-3, 3, n, dtype=dtype, device="cuda")
        y = torch.zeros_like(x)
        k((n + 255) // 256, 256, (x, y, scalar(2.5), scalar(-1), np.int32(n)))
        # The kernel's a * x + b contracts to one fused multiply-add (one rounding), so the
        # reference is the exact value rounded once, not torch's two rounded operations.
        torch.testing.assert_close(y, (2.5 * x.double() - 1).to(dtype))
    m.compile()
    m.get_function("apply")
    m.get_global("bias")
    assert _raw_modules() == before + 1
    with pytest.raises(cb.CudaError, match=r"`missing`") as e:
        m.get_function("missing")
    assert e.value.code == 500  # CUDA_ERROR_NOT_FOUND
    with pytest.raises(cb.CudaError, match=r"`nothing`"):
        m.get_global("nothing")


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_raw_module_globals_are_written_and_read_in_place():
    """get_global is a uint8 Array over the variable's bytes (or a typed view of them) that
    torch and CuPy write and read in place, and that keeps the module."""
    m = cb.RawModule(code=MODULE, name_expressions=MODULE_NAMES)
    g = m.get_global("bias")
    assert (g.dtype, g.shape, str(g.device)) == (cb.uint8, (16,), "cuda:0")
    bias = torch.from_dlpack(g).view(torch.float32)
    bias.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    factor = m.get_global("factor", dtype="int32")
    assert factor.shape == (1,)
    # A copy from the host, as a __constant__ variable is written (kernels only read it).
    torch.from_dlpack(factor).copy_(torch.tensor([3], dtype=torch.int32))
    apply = m.get_function("apply")
    del m, g
    gc.collect()
    n = 10
    x = torch.arange(n, dtype=torch.float32, device="cuda")
    apply(1, 32, (x, np.int32(n)))
    expected = np.arange(n, dtype=np.float32) * 3 + np.tile([1, 2, 3, 4], 3)[:n]
    np.testing.assert_array_equal(x.cpu().numpy(), expected)
    np.testing.assert_array_equal(bias.cpu().numpy(), [1, 2, 3, 4])


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_raw_module_template_variables_and_typed_views():
    m = cb.RawModule(code=MODULE, name_expressions=MODULE_NAMES)
    m.get_function("fill_table")(1, 32, (np.int32(3),))
    torch.cuda.synchronize()
    table = m.get_global("table<3>", dtype=np.int32)
    np.testing.assert_array_equal(torch.from_dlpack(table).cpu().numpy(), [10, 20, 30])
    as_2d = m.get_global("bias", dtype="float32", shape=(2, 2))
    assert as_2d.shape == (2, 2)
    with pytest.raises(ValueError, match="12 bytes"):
        m.get_global("table<3>", dtype="float64")
    with pytest.raises(ValueError, match="does not fill it exactly"):
        m.get_global("bias", dtype="float32", shape=(3,))
    if cupy is not None:
        view = cupy.asarray(m.get_global("table<3>", dtype="int32"))
        view[1] = 7
        np.testing.assert_array_equal(torch.from_dlpack(table).cpu().numpy(), [10, 7, 30])


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_raw_module_links_relocatable_code():
    m = cb.RawModule(code=DYNAMIC, options=("-rdc=true",))
    n = 1000
    y = torch.arange(n, dtype=torch.float32, device="cuda")
    m.get_function("parent")(1, 32, (y, np.int32(n)))
    torch.cuda.synchronize()
    np.testing.assert_array_equal(y.cpu().numpy(), 2 * np.arange(n, dtype=np.float32) + 1)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_raw_module_warm_cache_compiles_nothing(tmp_path):
    """The module's image and its template instances' lowered names are in the disk cache: a
    new process finds both there with run-time compilation switched off."""
    code = (
        "import numpy as np, torch, cubridge as cb\n"
        f"m = cb.RawModule(code={MODULE!r}, name_expressions={MODULE_NAMES!r})\n"
        "x = torch.arange(8, dtype=torch.float64, device='cuda')\n"
        "y = torch.zeros_like(x)\n"
        "m.get_function('axpb<double>')(1, 32, (x, y, np.float64(2), np.float64(1), np.int32(8)))\n"
        "m.get_function('fill_table')(1, 32, (np.int32(3),))\n"
        "torch.cuda.synchronize()\n"
        "np.testing.assert_array_equal(y.cpu().numpy(), 2 * np.arange(8) + 1)\n"
        "t = torch.from_dlpack(m.get_global('table<3>', dtype='int32'))\n"
        "np.testing.assert_array_equal(t.cpu().numpy(), [10, 20, 30])\n"
    )
    env = dict(os.environ, CUBRIDGE_CACHE_DIR=str(tmp_path))
    run_child(code, env)
    assert len(list(tmp_path.glob("*.bin"))) == 1
    run_child(code, dict(env, CUBRIDGE_NVRTC="0"))


def _nvrtc_in_process():
    """The libnvrtc that cubridge loaded in this process (it matches the driver), by ctypes."""
    import ctypes

    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libnvrtc.so" in line}
    paths = [p for p in paths if "builtins" not in p]
    return ctypes.CDLL(paths[0]) if paths else None


def _nvrtc_image(lib, source, arch):
    """NVRTC's PTX (arch "compute_NN") or cubin ("sm_NN") for `source`, by NVRTC's C API."""
    import ctypes

    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"f.cu", 0, None, None) == 0
    opts = (ctypes.c_char_p * 1)(f"--gpu-architecture={arch}".encode())
    assert lib.nvrtcCompileProgram(prog, 1, opts) == 0
    size = ctypes.c_size_t()
    kind = "CUBIN" if arch.startswith("sm_") else "PTX"
    assert getattr(lib, f"nvrtcGet{kind}Size")(prog, ctypes.byref(size)) == 0
    buf = ctypes.create_string_buffer(size.value)
    assert getattr(lib, f"nvrtcGet{kind}")(prog, buf) == 0
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return buf.raw


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
@pytest.mark.parametrize("kind", ["ptx", "cubin"])
def test_raw_module_loads_precompiled_files(kind, tmp_path):
    """A PTX or cubin file (told by its first bytes) loads with path=; its kernels run and its
    variables are arrays, as a compiled module's."""
    source = (
        '__device__ int counter;\nextern "C" __global__ void inc(float* x, int n) {\n'
        "  int i = threadIdx.x; if (i < n) { x[i] += 1; atomicAdd(&counter, 1); } }\n"
    )
    # cubridge loads its NVRTC to compile a source that is in no cache.
    cb.RawKernel(f"{SCALE}// {os.getpid()} {time.time()}", "scale").compile()
    lib = _nvrtc_in_process()
    if lib is None:
        pytest.skip("no NVRTC loaded in this process")
    major, minor = torch.cuda.get_device_capability()
    arch = f"{'compute' if kind == 'ptx' else 'sm'}_{major}{minor}"
    path = tmp_path / f"inc.{kind}"
    image = _nvrtc_image(lib, source, arch)
    # PTX as a text file holds it, without NVRTC's terminating NUL (cubridge adds one).
    path.write_bytes(image.rstrip(b"\0") if kind == "ptx" else image)
    m = cb.RawModule(path=path)
    x = torch.zeros(20, device="cuda")
    m.get_function("inc")(1, 32, (x, np.int32(20)))
    torch.cuda.synchronize()
    np.testing.assert_array_equal(x.cpu().numpy(), np.ones(20, np.float32))
    counter = torch.from_dlpack(m.get_global("counter", dtype="int32"))
    assert counter.item() == 20
