"""Reductions: users' cubridge.ReductionKernel (CuPy's syntax and semantics) and the built-in
sum, prod, max, min, argmax and argmin. Declarations and the host path run on every machine;
kernels run (marked ``cuda``) on torch and CuPy arrays. Every result is compared with numpy (or
CuPy on copies), never with cubridge's own output."""

import cubridge as cb
import numpy as np
import pytest
from conftest import NUMPY_DTYPES, _try_import, sample, torch
from hypothesis import given, settings
from hypothesis import strategies as st

cupy = _try_import("cupy")
HAS_GPU = cb.cuda.is_available() and torch is not None and torch.cuda.is_available()
cuda = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
needs_cupy = pytest.mark.skipif(cupy is None, reason="cupy is not installed")

OPS = ["sum", "prod", "max", "min", "argmax", "argmin"]
# Relative tolerance of float results (sums are exact for integers), scaled by the sum of
# magnitudes: cubridge and numpy add in different orders.
RTOL = {"float16": 4e-3, "float32": 2e-6, "float64": 1e-13, "complex64": 2e-6}
RTOL["complex128"] = RTOL["float64"]


def reference(op, x, axis, keepdims, dtype=None):
    """numpy's result of `op`, with float sums taken in float64 and rounded once."""
    if op in ("argmax", "argmin"):
        return getattr(np, op)(x, axis=axis, keepdims=keepdims)
    if op in ("max", "min"):
        return getattr(np, op)(x, axis=axis, keepdims=keepdims)
    f = getattr(np, op)
    want = f(x, axis=axis, keepdims=keepdims, dtype=dtype)
    if want.dtype.kind in "fc":
        wide = np.complex128 if want.dtype.kind == "c" else np.float64
        want = f(x.astype(wide), axis=axis, keepdims=keepdims).astype(want.dtype)
    return np.asarray(want)


def check(op, got, want, x, axis):
    got = np.asarray(cb.asarray(got, device="cpu")) if not isinstance(got, np.ndarray) else got
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape
    if want.dtype.kind in "fc" and op in ("sum", "prod"):
        scale = np.abs(x.astype(np.complex128)).sum() if op == "sum" else 1.0
        rtol = RTOL[str(want.dtype)]
        if op == "prod" and want.size:
            # Each product rounds once per factor: its relative error walks like sqrt(n) roundings
            # of the accumulating type (float32 for float16 too), several deviations allowed.
            eps = 2.3e-16 if want.dtype in (np.float64, np.complex128) else 1.2e-7
            rtol = max(rtol, 8 * eps * np.sqrt(x.size / want.size))
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * max(1.0, scale))
    else:
        np.testing.assert_array_equal(got, want)


# --- declarations (every machine) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("ins", "outs", "code", "part"),
    [
        ("float x", "T y", {}, "in_params"),
        ("T x", "", {}, "out_params"),
        ("T x", "T a", {}, "out_params"),
        ("T x, raw T b", "T y", {}, "in_params"),
        ("T x", "T y", {"map_expr": " "}, "map_expr"),
        ("T x", "T y", {"reduce_expr": ""}, "reduce_expr"),
        ("T x", "T y", {"reduce_type": "float; int"}, "reduce_type"),
        ("T x", "T y", {"identity": "0; x"}, "identity"),
        ("T x", "T y", {"name": "two words"}, "name"),
    ],
)
def test_every_malformed_part_of_a_declaration_is_named(ins, outs, code, part):
    args = {"map_expr": "x", "reduce_expr": "a + b", "post_map_expr": "y = a", "identity": "0"}
    args.update(code)
    name = args.pop("name", "k")
    with pytest.raises(ValueError, match=part):
        cb.ReductionKernel(ins, outs, name=name, **args)


@pytest.mark.skipif(cb.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_a_reduction_kernel_is_made_but_raises_when_called():
    k = cb.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "plain_sum")
    assert k.name == "plain_sum"
    with pytest.raises(cb.CudaUnavailableError, match="plain_sum"):
        k(np.ones(3, np.float32))


# --- built-ins on host memory ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2)])
def test_host_builtins_match_numpy(op, dtype, axis):
    if op.startswith("arg") and isinstance(axis, tuple):
        pytest.skip("argmax takes one axis")
    x = sample((3, 4, 5), dtype, 1)
    for keepdims in (False, True):
        got = getattr(cb, op)(x, axis=axis, keepdims=keepdims)
        check(op, got, reference(op, x, axis, keepdims), x, axis)


def test_host_sums_of_integers_are_exact_and_take_numpys_dtypes():
    x = np.array([2**62, 2**62, 2**62, -(2**62)], np.int64)
    assert cb.sum(x).to_numpy() == x.sum()  # wraps as numpy's
    y = np.full(1000, 255, np.uint8)
    r = cb.sum(y)
    assert r.dtype == cb.uint64 and r.to_numpy() == 255_000
    assert cb.sum(np.ones(5, bool)).to_numpy() == 5
    assert cb.sum(np.ones(3, np.int8), dtype="float32").dtype == cb.float32


def test_host_float16_sums_accumulate_in_float32_and_round_once():
    x = np.array([2048, 1, 1, 1, 1], np.float16)
    # float16 alone leaves 2048 + 1 at 2048 each time; float32 keeps 2052.
    assert cb.sum(x).to_numpy() == np.float16(2052)
    if torch is not None:
        b = torch.tensor([256.0, 1.0, 1.0], dtype=torch.bfloat16)
        r = torch.from_dlpack(cb.sum(b))
        assert r.dtype == torch.bfloat16 and r.item() == 258.0


@pytest.mark.parametrize("op", ["max", "min", "argmax", "argmin"])
def test_host_nan_propagates_and_arg_takes_the_first(op):
    x = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 5.0, 5.0, -1.0]], np.float32)
    for axis in (None, 0, 1):
        check(op, getattr(cb, op)(x, axis=axis), reference(op, x, axis, False), x, axis)
    c = np.array([1 + 2j, 1 + 3j, 0 + 9j, 1 + 3j], np.complex64)
    check(op, getattr(cb, op)(c), reference(op, c, None, False), c, None)


def test_host_errors_and_out():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.raises(ValueError, match="no identity"):
        cb.max(np.zeros((0, 3), np.float32))
    with pytest.raises(ValueError, match="no identity"):
        cb.argmin(np.zeros((2, 0), np.float32), axis=1)
    assert cb.sum(np.zeros((0, 3), np.float32), axis=0).to_numpy().tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="out of bounds"):
        cb.sum(x, axis=2)
    with pytest.raises(ValueError, match="twice"):
        cb.sum(x, axis=(1, -1))
    with pytest.raises(ValueError, match="one axis"):
        cb.argmax(x, axis=(0, 1))
    with pytest.raises(TypeError, match="dtype"):
        cb.max(x, dtype="float64")
    out = np.zeros(4, np.float32)
    assert cb.sum(x, axis=0, out=out) is out
    np.testing.assert_array_equal(out, x.sum(axis=0))
    with pytest.raises(ValueError, match="shape"):
        cb.sum(x, axis=1, out=out)
    t = x.T  # a transposed view, read in place
    np.testing.assert_array_equal(cb.max(t, axis=0).to_numpy(), t.max(axis=0))


@given(
    data=st.data(),
    shape=st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple),
    dtype=st.sampled_from(NUMPY_DTYPES),
    op=st.sampled_from(OPS),
    keepdims=st.booleans(),
)
def test_host_reductions_match_numpy_over_any_axes(data, shape, dtype, op, keepdims):
    x = sample(shape, dtype, 3)
    if data.draw(st.booleans()) and x.ndim:
        x = x[..., ::-1]  # a reversed view
    if op.startswith("arg"):
        axis = data.draw(st.sampled_from([None, *range(-x.ndim, x.ndim)]))
    else:
        axes = data.draw(st.lists(st.sampled_from(range(x.ndim)), unique=True)) if x.ndim else []
        axis = data.draw(st.sampled_from([None, tuple(axes)]))
    try:
        want = reference(op, x, axis, keepdims)
    except ValueError:
        with pytest.raises(ValueError):
            getattr(cb, op)(x, axis=axis, keepdims=keepdims)
        return
    check(op, getattr(cb, op)(x, axis=axis, keepdims=keepdims), want, x, axis)


# --- CUDA ------------------------------------------------------------------------------------


def _t(x):
    return torch.from_numpy(np.ascontiguousarray(x)).cuda()


def _host(z):
    if isinstance(z, torch.Tensor):
        return z.cpu().numpy()
    return np.asarray(cb.asarray(z, device="cpu"))


L2 = cb.ReductionKernel(
    "T x", "T y", "(float)x * (float)x", "a + b", "y = (T)sqrt(a)", "0", "l2norm", "float"
)
# argmax as CuPy users write it: a pair type in the preamble, _J as the index.
PAIR = """
struct vi { float v; long long i; };
__device__ vi pick(vi a, vi b) {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
}
"""
ARGMAX = cb.ReductionKernel(
    "T x",
    "int64 y",
    "vi{(float)x, _J}",
    "pick(a, b)",
    "y = a.i",
    "vi{0, -1}",
    "my_argmax",
    "vi",
    preamble=PAIR,
)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("shape", [(1,), (1000,), (37, 53), (4, 5, 6), (1 << 20, 2), (3, 1 << 20)])
@pytest.mark.parametrize("axis", [None, 0, -1, (0, -1)])
def test_reduction_kernel_matches_numpy(shape, axis):
    x = sample(shape, "float32", 5)
    if isinstance(axis, tuple) and len(shape) == 1:
        # (0, -1) names the one axis twice: numpy and cubridge both refuse it.
        with pytest.raises(ValueError):
            L2(_t(x), axis=axis)
        with pytest.raises(ValueError):
            np.sum(x, axis=axis)
        return
    for keepdims in (False, True):
        y = L2(_t(x), axis=axis, keepdims=keepdims)
        want = np.sqrt((x.astype(np.float64) ** 2).sum(axis=axis, keepdims=keepdims))
        np.testing.assert_allclose(_host(y), want, rtol=1e-5)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_reduce_type_and_placeholders_bind_per_call(dtype):
    x = torch.randn(300, 70, device="cuda").to(getattr(torch, dtype))
    y = L2(x, axis=1)
    assert y.dtype == cb.dtype(dtype)
    want = x.double().pow(2).sum(1).sqrt().to(getattr(torch, dtype))
    torch.testing.assert_close(torch.from_dlpack(y), want, rtol=1e-2, atol=1e-2)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_index_J_counts_c_order_along_the_reduced_axes(axis):
    x = sample((40, 33), "float32", 7)
    t = _t(x)
    for view, ref in ((t, x), (t.T, x.T)):
        got = _host(ARGMAX(view, axis=axis))
        np.testing.assert_array_equal(got, np.argmax(ref, axis=axis))


@pytest.mark.cuda
@cuda
def test_raw_inputs_scalars_and_several_outputs_with_out():
    """Beyond CuPy: a raw input read at _J, and two outputs given as out=."""
    k = cb.ReductionKernel(
        "T x, raw T w, float32 s",
        "T total, int32 count",
        "(float)x * (float)w[_J] * s",
        "a + b",
        "total = (T)a; count = (int)(a > 0)",
        "0",
        "weighted",
        "float",
    )
    x = sample((64, 50), "float32", 8)
    w = sample((50,), "float32", 9)
    total, count = torch.empty(64, device="cuda"), torch.empty(64, dtype=torch.int32, device="cuda")
    got = k(_t(x), _t(w), 2.0, axis=1, out=(total, count))
    assert got[0] is total and got[1] is count
    want = (x.astype(np.float64) * w * 2).sum(axis=1)
    np.testing.assert_allclose(total.cpu().numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(count.cpu().numpy(), (want > 0).astype(np.int32))


@pytest.mark.cuda
@cuda
def test_empty_reductions_follow_the_identity():
    x = torch.empty(5, 0, device="cuda")
    np.testing.assert_array_equal(_host(L2(x, axis=1)), np.zeros(5, np.float32))
    k = cb.ReductionKernel("T x", "T y", "x", "a + b", "y = a", None, "no_identity")
    with pytest.raises(ValueError, match="no_identity which has no identity"):
        k(x, axis=1)
    with pytest.raises(ValueError, match="out of bounds"):
        L2(x, axis=2)


@pytest.mark.cuda
@cuda
@needs_cupy
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_equal_to_cupys_reduction_kernel_on_copies(axis):
    args = ("T x", "T y", "x * x", "a + b", "y = sqrt(a)", "0", "l2_cupy_check")
    ours, theirs = cb.ReductionKernel(*args), cupy.ReductionKernel(*args)
    x = sample((257, 130), "float64", 10)
    got = _host(ours(_t(x), axis=axis))
    want = cupy.asnumpy(theirs(cupy.asarray(x), axis=axis))
    np.testing.assert_allclose(got, want, rtol=1e-13)


CUDA_CASES = {
    "all": ((1 << 20,), None),
    "rows": ((300, 1000), -1),
    "tiny rows": ((100_000, 2), -1),
    "rows of four": ((100_000, 4), -1),
    "rows of sixteen": ((1000, 16), -1),
    "rows of eight, three axes": ((6, 50, 8), -1),
    "odd rows of two": ((999, 2), -1),
    "columns": ((1000, 300), 0),
    "few columns": ((1 << 18, 4), 0),
    "column packs": ((1003, 256), 0),
    "few column packs": ((1 << 16, 32), 0),
    "middle": ((6, 50, 7), 1),
    "two axes": ((6, 50, 7), (0, 2)),
}


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("case", list(CUDA_CASES))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [d for d in NUMPY_DTYPES if not d.startswith("uint")])
def test_cuda_builtins_match_numpy(op, dtype, case):
    shape, axis = CUDA_CASES[case]
    if op.startswith("arg") and isinstance(axis, tuple):
        pytest.skip("argmax takes one axis")
    x = sample(shape, dtype, 11)
    if op == "prod" and dtype.startswith(("float", "complex")):
        x = (1 + x / 1000).astype(dtype)  # products that neither vanish nor overflow
    got = getattr(cb, op)(_t(x), axis=axis, keepdims=True)
    check(op, got, reference(op, x, axis, True), x, axis)


@pytest.mark.cuda
@cuda
@settings(max_examples=max(20, settings.default.max_examples // 4))
@given(
    data=st.data(),
    shape=st.lists(st.integers(0, 40), min_size=1, max_size=3).map(tuple),
    dtype=st.sampled_from([d for d in NUMPY_DTYPES if not d.startswith("uint")]),
    op=st.sampled_from(OPS),
    keepdims=st.booleans(),
)
def test_cuda_reductions_match_numpy_over_any_axes_and_views(data, shape, dtype, op, keepdims):
    x = sample(shape, dtype, 13)
    t = _t(x)
    view = data.draw(st.sampled_from(["whole", "transposed", "every other"]))
    if view == "transposed":
        x, t = x.transpose(), t.permute(*reversed(range(t.ndim)))
    elif view == "every other":
        x, t = x[..., ::2], t[..., ::2]
    if op.startswith("arg"):
        axis = data.draw(st.sampled_from([None, *range(-x.ndim, x.ndim)]))
    else:
        axes = data.draw(st.lists(st.sampled_from(range(x.ndim)), unique=True))
        axis = data.draw(st.sampled_from([None, tuple(axes)]))
    if op == "prod" and dtype.startswith(("float", "complex")):
        x = (1 + x / 1000).astype(dtype)
        t = _t(x)
    try:
        want = reference(op, x, axis, keepdims)
    except ValueError:
        with pytest.raises(ValueError):
            getattr(cb, op)(t, axis=axis, keepdims=keepdims)
        return
    check(op, getattr(cb, op)(t, axis=axis, keepdims=keepdims), want, x, axis)


@pytest.mark.cuda
@cuda
def test_cuda_bfloat16_sums_accumulate_in_float32():
    x = torch.randn(1 << 20, device="cuda").to(torch.bfloat16)
    got = torch.from_dlpack(cb.sum(x))
    want = x.double().sum().to(torch.bfloat16)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=1e-2, atol=4.0)
    rows = torch.from_dlpack(cb.sum(x.view(1024, 1024), axis=1))
    torch.testing.assert_close(rows, x.view(1024, 1024).double().sum(1).to(torch.bfloat16))


@pytest.mark.cuda
@cuda
def test_cuda_nan_propagates_and_arg_takes_the_first():
    x = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 5.0, 5.0, -1.0]], np.float32)
    for op in ("max", "min", "argmax", "argmin"):
        for axis in (None, 0, 1):
            check(op, getattr(cb, op)(_t(x), axis=axis), reference(op, x, axis, False), x, axis)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("shape", [(1 << 22,), (64, 1 << 16), (1 << 16, 64), (4099, 32)])
def test_the_same_input_gives_the_same_bits_on_any_run_stream_or_alignment(shape):
    n = int(np.prod(shape))
    buf = torch.randn(n + 4, device="cuda")
    aligned = buf[:n].clone().view(shape)
    shifted = buf[1 : n + 1]
    shifted.copy_(aligned.view(-1))
    shifted = shifted.view(shape)  # the same values, off the 16-byte packs
    axis = None if len(shape) == 1 else (1 if shape[1] > shape[0] else 0)
    first = _host(cb.sum(aligned, axis=axis))
    side = torch.cuda.Stream()
    for _ in range(3):
        with torch.cuda.stream(side):
            again = cb.sum(aligned, axis=axis)
        torch.cuda.synchronize()
        assert _host(again).tobytes() == first.tobytes()
    assert _host(cb.sum(shifted, axis=axis)).tobytes() == first.tobytes()


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int8])
@pytest.mark.parametrize("n", [2, 4, 8, 16])
@pytest.mark.parametrize("rows", [1 << 16, 5000])
def test_short_rows_read_in_packs_give_the_bits_of_one_element_at_a_time(dtype, n, rows):
    # Rows one after another from an aligned address are read a pack at a time; the same
    # values off the packs, or with rows apart, are read one element at a time. The order of
    # operations is the same, so are the bits. (5000 float64 rows of 16 are split into chunks,
    # the same split whatever the address.)
    values = torch.randn(rows, n, device="cuda", dtype=torch.float64) * 100
    packed = values.to(dtype)
    buf = torch.zeros(rows * n + 1, device="cuda", dtype=dtype)
    shifted = buf[1:].view(rows, n)
    shifted.copy_(packed)
    apart = torch.zeros(rows, n + 1, device="cuda", dtype=dtype)[:, :n]
    apart.copy_(packed)
    for op in ("sum", "max", "argmax"):
        want = _host(getattr(cb, op)(packed, axis=-1)).tobytes()
        for view in (shifted, apart):
            assert _host(getattr(cb, op)(view, axis=-1)).tobytes() == want, (op, view.stride())


@pytest.mark.cuda
@cuda
def test_calls_that_differ_only_in_layout_alignment_or_out_are_planned_each_as_its_own():
    # A call that walks what the last one walked reuses its plan: each call here differs from
    # the one before in one thing only (strides, alignment, axes, the output's strides), twice
    # round, so that a plan kept past what it was made for gives a wrong result.
    x = sample((64, 256), "float32", 17)
    whole = _t(x)
    buf = torch.from_numpy(np.concatenate([[0], x.ravel()]).astype(np.float32)).cuda()
    shifted = buf[1:].view(64, 256)  # the same values, off the 16-byte packs
    views = [
        (whole, x, 1),
        (whole.t(), x.T, 1),
        (shifted, x, 1),
        (whole[:, ::2], x[:, ::2], 1),
        (whole, x, 0),
        (whole[:, ::2], x[:, ::2], 0),
    ]
    for _ in range(2):
        for t, h, axis in views:
            check("sum", cb.sum(t, axis=axis), reference("sum", h, axis, False), h, axis)
    # The same input into outputs of other strides.
    wide = torch.zeros(64, 2, device="cuda")
    for _ in range(2):
        for out in (torch.zeros(64, device="cuda"), wide[:, 0]):
            cb.sum(whole, axis=1, out=out)
            check("sum", out.cpu().numpy(), reference("sum", x, 1, False), x, 1)


@pytest.mark.cuda
@cuda
def test_runs_on_the_current_torch_stream_after_its_writes():
    side = torch.cuda.Stream()
    cycles = int(0.05 * torch.cuda.get_device_properties(0).clock_rate * 1000)
    x = torch.zeros(1 << 16, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(cycles)
        x.fill_(2.0)
        s = cb.sum(x)
        r = torch.from_dlpack(s)
    side.synchronize()
    assert r.item() == 2.0 * (1 << 16)


@pytest.mark.cuda
@cuda
def test_a_sum_does_not_wait_for_unrelated_work_on_another_stream():
    """A whole-array sum (two kernels and a scratch buffer of partial results) and a sum over
    rows, allocating their results, return while another stream still has 0.1 s queued."""
    import time

    cycles = int(0.1 * torch.cuda.get_device_properties(0).clock_rate * 1000)
    x = torch.ones(1 << 22, device="cuda")
    rows = x.view(1024, -1)
    cb.sum(x), cb.sum(rows, axis=-1)  # compiled or loaded before the clock starts
    torch.cuda.synchronize()
    busy = torch.cuda.Stream()
    with torch.cuda.stream(busy):
        torch.cuda._sleep(cycles)
    start = time.perf_counter()
    whole, per_row = cb.sum(x), cb.sum(rows, axis=-1)
    elapsed = time.perf_counter() - start
    assert elapsed < 0.05, f"the sums waited {elapsed * 1e3:.1f} ms for an unrelated stream"
    torch.cuda.synchronize()
    assert torch.from_dlpack(whole).item() == 1 << 22
    assert (torch.from_dlpack(per_row) == 4096).all()


_SHIPPED_CHILD = r"""
import json, torch, cubridge as cb
failed = []
for name in ["float32", "float16", "bfloat16", "int32", "int64"]:
    dtype = getattr(torch, name)
    x = (torch.randn(1 << 20, device="cuda") * 8).to(dtype)
    cases = {"all": (x, None), "rows": (x.view(1024, 1024), -1), "columns": (x.view(1024, 1024), 0),
             "tiny rows": (x.view(-1, 4), -1)}
    for op in ["sum", "max", "min"]:
        for case, (v, axis) in cases.items():
            got = torch.from_dlpack(getattr(cb, op)(v, axis=axis)).double()
            dim = tuple(range(v.ndim)) if axis is None else axis
            if op == "sum":
                want = v.double().sum(dim=dim)
            else:
                want = getattr(torch, "amax" if op == "max" else "amin")(v, dim=dim).double()
            if not torch.allclose(got, want, rtol=1e-2, atol=1e-2 * v.numel() ** 0.5):
                failed.append([op, name, case])
print(json.dumps(failed))
"""


@pytest.mark.cuda
@cuda
def test_shipped_reductions_run_without_nvrtc(tmp_path):
    """A wheel built by `make wheel` ships sum, max and min of float32, float16, bfloat16, int32
    and int64 over whole arrays, rows and columns: in a new process with an empty kernel cache
    and run-time compilation off, each runs and equals torch's result, and nothing is cached."""
    import os
    import subprocess
    import sys

    major, minor = torch.cuda.get_device_capability()
    arch = major * 10 + minor
    shipped = {a for _, a in cb.cuda.shipped_kernels() if a // 10 == major and a <= arch}
    if not shipped:
        pytest.skip(f"this build ships no kernels for sm_{arch} (a source build; see make wheel)")
    env = dict(os.environ, CUBRIDGE_CACHE_DIR=str(tmp_path), CUBRIDGE_NVRTC="0")
    done = subprocess.run(
        [sys.executable, "-c", _SHIPPED_CHILD], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.cuda
@cuda
def test_reduce_dims_off_gives_the_same_results():
    k = cb.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "unmerged", reduce_dims=False)
    x = sample((6, 7, 8), "float64", 12)
    for axis in (None, 1, (0, 2)):
        np.testing.assert_allclose(_host(k(_t(x), axis=axis)), x.sum(axis=axis), rtol=1e-13)


@pytest.mark.cuda
@cuda
def test_a_reduction_kernel_names_what_is_on_the_wrong_device():
    with pytest.raises(ValueError, match=r"l2norm: x is on cpu.*reduction kernels run on one"):
        L2(np.ones(4, np.float32))
    with pytest.raises(ValueError, match="y: out has shape"):
        L2(torch.ones(4, 3, device="cuda"), axis=1, out=torch.empty(3, device="cuda"))
