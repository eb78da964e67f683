"""cubridge.add on foreign memory (numpy, torch, jax, cubridge): every dtype, layouts from 0-d to
4-d, strided and broadcast inputs, promotion, foreign ``out``, aliasing, and errors. Every result
is compared with numpy's or torch's own answer."""

import itertools

import cubridge as cb
import numpy as np
import pytest
from conftest import (
    ALL_DTYPES,
    INT_NEAR_TIES,
    NEAR_TIES,
    NUMPY_DTYPES,
    float_values,
    jnp,
    needs_jax,
    needs_torch,
    rounded,
    sample,
    torch,
    torch_sample,
)


def check(result, expected):
    """Compares a cubridge result with numpy's, dtype included."""
    got = np.from_dlpack(result)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_every_numpy_dtype_matches_numpy(dtype):
    a, b = sample((5, 7), dtype, 1), sample((5, 7), dtype, 2)
    check(cb.add(a, b), np.add(a, b))


def test_float16_rounds_like_numpy():
    # Values whose float32 sum is not representable in float16, so rounding matters.
    a = np.array([2048, 2048, 0.1, 65504, -0.0, 1e-7], dtype=np.float16)
    b = np.array([1, 3, 0.2, 65504, 0.0, 1e-7], dtype=np.float16)
    with np.errstate(over="ignore"):  # 65504 + 65504 overflows to inf, on purpose
        expected = a + b
    check(cb.add(a, b), expected)
    rng = np.random.default_rng(7)
    a = (rng.standard_normal(4096) * 1000).astype(np.float16)
    b = (rng.standard_normal(4096) * 3).astype(np.float16)
    check(cb.add(a, b), a + b)


@needs_torch
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_every_dtype_matches_torch(dtype):
    a, b = torch_sample((3, 6), dtype, 3), torch_sample((3, 6), dtype, 4)
    got = torch.from_dlpack(cb.add(a, b))
    if dtype.startswith("uint") and dtype != "uint8":
        # torch lacks CPU add for these: compare through int64, wrapping as the dtype does.
        want = (a.to(torch.int64) + b.to(torch.int64)).to(a.dtype)
    else:
        want = a + b
    assert got.dtype == want.dtype
    assert torch.equal(got, want)


@needs_torch
def test_bfloat16_rounds_like_torch():
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(10000, generator=g) * 300).to(torch.bfloat16)
    b = torch.randn(10000, generator=g).to(torch.bfloat16)
    assert torch.equal(torch.from_dlpack(cb.add(a, b)), a + b)


@needs_torch
@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_plus_torch_into_torch(dtype):
    """The issue's acceptance check: torch.from_dlpack(add(numpy_a, torch_b)) == numpy's sum."""
    a, b = sample((4, 3), dtype, 5), sample((4, 3), dtype, 6)
    if dtype in ("uint16", "uint32", "uint64"):
        tb = torch.from_numpy(b.astype(np.int64)).to(getattr(torch, dtype))
    else:
        tb = torch.from_numpy(b.copy())
    got = torch.from_dlpack(cb.add(a, tb))
    np.testing.assert_array_equal(got.numpy() if dtype != "bool" else got.numpy(), a + b)


SHAPES = [(), (0,), (1,), (7,), (3, 4), (2, 3, 4), (2, 1, 3, 5), (4, 0, 2)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", ["float32", "int16", "complex128", "bool"])
def test_shapes_from_0d_to_4d(shape, dtype):
    a, b = sample(shape, dtype, 1), sample(shape, dtype, 2)
    check(cb.add(a, b), a + b)


# Each layout views a different base array as shape (3, 4, 5), so every pair can be added.
LAYOUTS = {
    "contiguous": ((3, 4, 5), lambda x: x),
    "transposed": ((5, 3, 4), lambda x: x.transpose(1, 2, 0)),
    "sliced": ((4, 8, 6), lambda x: x[1:, ::2, 1:]),
    "negative": ((3, 4, 5), lambda x: x[::-1, :, ::-1]),
    "offset_step": ((3, 12, 5), lambda x: x[:, 1::3, :]),
}


@pytest.mark.parametrize("la", LAYOUTS, ids=str)
@pytest.mark.parametrize("lb", LAYOUTS, ids=str)
def test_strided_layout_pairs(la, lb):
    (shape_a, view_a), (shape_b, view_b) = LAYOUTS[la], LAYOUTS[lb]
    a = view_a(sample(shape_a, "float64", 1))
    b = view_b(sample(shape_b, "float64", 2))
    assert a.shape == b.shape == (3, 4, 5)
    check(cb.add(a, b), a + b)
    out = view_a(np.zeros(shape_a))
    cb.add(a, b, out=out)
    np.testing.assert_array_equal(out, a + b)


@pytest.mark.parametrize(
    "sa,sb",
    [((3, 1), (4,)), ((), (2, 3)), ((5, 1, 4), (3, 1)), ((1,), (0,)), ((2, 3), (1, 1))],
    ids=str,
)
def test_broadcasting(sa, sb):
    a, b = sample(sa, "int32", 1), sample(sb, "int32", 2)
    check(cb.add(a, b), a + b)
    check(cb.add(b, a), b + a)


def test_zero_stride_inputs():
    a = np.broadcast_to(np.arange(4.0), (3, 4))
    b = np.broadcast_to(np.arange(3.0)[:, None], (3, 4))
    check(cb.add(a, b), a + b)


PROMOTIONS = [
    ("float16", "float32", "float32"),
    ("int8", "int32", "int32"),
    ("uint8", "int16", "int16"),
    ("uint8", "int8", "int16"),
    ("uint32", "int32", "int64"),
    ("uint16", "uint64", "uint64"),
    ("float32", "float64", "float64"),
    ("float32", "complex64", "complex64"),
    ("float64", "complex64", "complex128"),
    ("complex64", "complex128", "complex128"),
]


@pytest.mark.parametrize("da,db,dr", PROMOTIONS)
def test_promotion_matches_numpy(da, db, dr):
    a, b = sample((6,), da, 1), sample((6,), db, 2)
    assert np.result_type(a, b) == np.dtype(dr)
    check(cb.add(a, b), a + b)
    check(cb.add(b, a), b + a)


@needs_torch
def test_bfloat16_with_float16_promotes_to_float32_like_torch():
    a = torch_sample((5,), "bfloat16", 1)
    b = torch_sample((5,), "float16", 2)
    got = torch.from_dlpack(cb.add(a, b))
    want = a + b
    assert want.dtype == torch.float32 and got.dtype == torch.float32
    assert torch.equal(got, want)


@pytest.mark.parametrize(
    "da,db", [("int32", "float32"), ("bool", "int8"), ("uint64", "int64"), ("int8", "complex64")]
)
def test_mixing_kinds_is_a_type_error_naming_both(da, db):
    a, b = sample((2,), da), sample((2,), db)
    with pytest.raises(TypeError, match=f"{da}.*{db}"):
        cb.add(a, b)


@needs_torch
def test_foreign_out_is_written_in_place():
    a, b = sample((3, 4), "float32", 1), sample((4,), "float32", 2)
    out = torch.zeros(3, 4)
    ptr = out.data_ptr()
    assert cb.add(a, b, out=out) is out
    assert out.data_ptr() == ptr
    np.testing.assert_array_equal(out.numpy(), a + b)
    # A transposed torch out.
    out_t = torch.zeros(4, 3).T
    cb.add(a, b, out=out_t)
    np.testing.assert_array_equal(out_t.numpy(), a + b)


def test_numpy_out_and_cubridge_out():
    a, b = sample((2, 5), "int64", 1), sample((2, 5), "int64", 2)
    out = np.empty((2, 5), dtype=np.int64)
    cb.add(a, b, out=out)
    np.testing.assert_array_equal(out, a + b)
    cout = cb.empty((2, 5), dtype="int64")
    assert cb.add(a, b, out=cout) is cout
    check(cout, a + b)


@pytest.mark.parametrize("which", ["a", "b"])
def test_out_may_alias_an_input_exactly(which):
    a, b = sample((64, 33), "float32", 1), sample((64, 33), "float32", 2)
    expected = a + b
    target = a if which == "a" else b
    cb.add(a, b, out=target)
    np.testing.assert_array_equal(target, expected)


def test_out_aliasing_transposed_input():
    base = sample((8, 8), "float64", 1)
    a = base.T
    b = sample((8, 8), "float64", 2)
    expected = a + b
    cb.add(a, b, out=a)
    np.testing.assert_array_equal(a, expected)


def test_partial_overlap_is_refused():
    buf = np.arange(10.0)
    with pytest.raises(ValueError, match="overlap"):
        cb.add(buf[:8], buf[:8], out=buf[2:])
    with pytest.raises(ValueError, match="overlap"):
        cb.add(buf[::-1], buf, out=buf)


def test_out_in_another_block_of_the_same_array_runs():
    """Blocks of one array that share no element (columns, rows, interleaved columns) are not
    an overlap, as in numpy and torch, though their byte ranges intersect."""
    every = slice(None)
    for src, dst in [
        ((every, slice(0, 3)), (every, slice(3, 6))),
        ((slice(0, 2), every), (slice(2, 4), every)),
        ((every, slice(0, 6, 2)), (every, slice(1, 6, 2))),
        ((slice(0, 4, 2), slice(1, 6, 2)), (slice(1, 4, 2), slice(0, 6, 2))),
    ]:
        x = np.arange(24.0).reshape(4, 6)
        assert not np.shares_memory(x[src], x[dst])
        want = x.copy()
        want[dst] = x[src] + 1
        cb.add(x[src], 1, out=x[dst])
        np.testing.assert_array_equal(x, want)


@needs_torch
def test_out_in_another_column_block_of_a_torch_tensor():
    t = torch.arange(24.0).reshape(4, 6)
    want = t.clone()
    want[:, 3:] = t[:, :3] + 1
    cb.add(t[:, :3], 1, out=t[:, 3:])
    assert torch.equal(t, want)


def test_out_errors():
    a = sample((3,), "float32")
    with pytest.raises(ValueError, match="shape"):
        cb.add(a, a, out=np.empty(4, np.float32))
    with pytest.raises(ValueError, match="dtype"):
        cb.add(a, a, out=np.empty(3, np.float64))
    ro = np.empty(3, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        cb.add(a, a, out=ro)
    with pytest.raises(ValueError, match="zero stride"):
        overlapping = np.lib.stride_tricks.as_strided(np.empty(1, np.float32), (3,), (0,))
        cb.add(a, a, out=overlapping)


def test_shape_errors_and_bad_operands():
    with pytest.raises(ValueError, match="broadcast"):
        cb.add(np.zeros(3), np.zeros(4))
    with pytest.raises(TypeError, match="cannot read"):
        cb.add(object(), np.zeros(3))
    with pytest.raises(ValueError, match="stream"):
        cb.add(np.zeros(3), np.zeros(3), stream=1)


def test_python_scalars_take_the_array_dtype():
    a = sample((4,), "int16")
    check(cb.add(a, 3), a + np.int16(3))
    check(cb.add(2, a), a + np.int16(2))
    f = sample((4,), "float32")
    check(cb.add(f, 0.5), f + np.float32(0.5))
    with pytest.raises(TypeError):
        cb.add(a, 0.5)


def test_a_value_beside_strided_arrays_and_into_strided_outs_matches_numpy():
    """A value is read through zero strides over every dimension of the loop: beside a
    transposed or sliced array, into a transposed out or one past the size that splits the loop
    across threads, the result is numpy's."""
    base = (np.arange(2 * 3 * 8) % 13).astype(np.float32).reshape(2, 3, 8)
    for a in [base, base.transpose(2, 0, 1), base[:, ::2, 1::3], base[:1, :1, :1]]:
        check(cb.add(a, 2.5), a + np.float32(2.5))
        check(cb.add(7, a), a + np.float32(7))
        out = np.empty(a.shape[::-1], np.float32).T
        cb.add(a, 0.25, out=out)
        np.testing.assert_array_equal(out, a + np.float32(0.25))
    big = (np.arange(3 << 20) % 101).astype(np.int32)
    out = np.empty_like(big)
    cb.add(big, 3, out=out)
    np.testing.assert_array_equal(out, big + np.int32(3))


@pytest.mark.parametrize("form", ["scalar", "0-d"])
def test_numpy_scalars_keep_their_dtype_as_in_numpy(form):
    """A numpy scalar or 0-d numpy array beside an array is a typed operand (numpy's NEP 50):
    every pair cubridge promotes gives numpy's dtype and values, either way round; mixing
    kinds is the TypeError that arrays raise."""
    for da, ds in itertools.product(NUMPY_DTYPES, repeat=2):
        a = sample((3,), da, 1)
        s = np.asarray(sample((1,), ds, 2)[0])
        if form == "scalar":
            s = s[()]
        try:
            r = cb.add(a, s)
        except TypeError as e:
            assert da in str(e) and ds in str(e), (da, ds, e)
            continue
        check(r, a + s)
        check(cb.add(s, a), s + a)


def test_numpy_scalars_beside_scalars_match_numpy():
    for x, y in [
        (np.float32(1.5), 2.25),
        (2.25, np.float32(1.5)),
        (np.int8(100), 100),
        (np.float32(0.1), np.float64(0.2)),
        (np.uint8(7), np.array(np.int8(-3))),
    ]:
        with np.errstate(over="ignore"):
            want = np.asarray(np.add(x, y))
        check(cb.add(x, y), want)
    a = sample((4,), "float32", 3)
    out = np.empty(4, np.float64)
    cb.add(a, np.float64(0.1), out=out)
    np.testing.assert_array_equal(out, a + np.float64(0.1))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_python_scalars_round_once_into_half_precision(dtype):
    """A Python float or int added to a float16 or bfloat16 array went through float32 (or lost
    its low bits) before its one rounding into the array's dtype: zeros(1, float16) + (1 +
    2**-11 + 2**-40) was 1.0, where numpy's is 1.001."""
    zero = cb.zeros((1,), dtype=dtype)
    for v in NEAR_TIES[dtype] + INT_NEAR_TIES[dtype]:
        want = rounded(v, dtype)
        if dtype == "float16":
            with np.errstate(over="ignore"):
                assert np.float16(v) == want  # numpy rounds these once too
        for got in (cb.add(zero, v), cb.add(v, zero), cb.full((1,), v, dtype=dtype)):
            np.testing.assert_array_equal(float_values(got), [want], err_msg=repr(v))


def test_python_integers_past_128_bits_meet_floating_arrays():
    """add(float64 array, 10**40) refused the integer, which numpy converts to the nearest
    float; into an integer array numpy and cubridge refuse it."""
    a = sample((3,), "float64")
    for v in (10**40, -(3**300), 2**127 + 1):
        check(cb.add(a, v), a + v)
        check(cb.add(v, a), v + a)
    c = sample((2,), "complex128")
    check(cb.add(c, 10**40), c + 10**40)
    f = cb.zeros((1,), dtype="float32")
    v = 2**127 + 2**103 + 1  # past a float32 tie by less than float64 can tell
    np.testing.assert_array_equal(cb.add(f, v).to_numpy(), [rounded(v, "float32")])
    for dtype in ("int64", "uint64"):
        with pytest.raises(OverflowError):
            np.add(np.zeros(2, dtype=dtype), 10**40)
        with pytest.raises(OverflowError):
            cb.add(cb.zeros((2,), dtype=dtype), 10**40)
    with pytest.raises(OverflowError):
        cb.add(a, 2**1024)


def test_operator_plus():
    a = cb.asarray(np.arange(4, dtype=np.int32))
    check(a + a, np.arange(4, dtype=np.int32) * 2)
    check(a + 1, np.arange(1, 5, dtype=np.int32))
    check(1 + a, np.arange(1, 5, dtype=np.int32))
    check(a + np.ones(4, dtype=np.int32), np.arange(1, 5, dtype=np.int32))


def test_in_place_plus_writes_the_memory_the_array_views():
    """`x += y` writes in place, as numpy's, torch's and CuPy's do; what numpy refuses to cast
    back into x (a float into an int array) and read-only memory are refused."""
    n = np.arange(6, dtype=np.int32)
    x = cb.asarray(n)
    alias = x
    x += 1
    assert x is alias
    np.testing.assert_array_equal(n, np.arange(1, 7, dtype=np.int32))
    x += np.full(6, 10, dtype=np.int16)
    np.testing.assert_array_equal(n, np.arange(11, 17, dtype=np.int32))
    with pytest.raises(TypeError):
        n += 1.5
    with pytest.raises(TypeError):
        x += 1.5
    ro = np.arange(3.0)
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        ro += 1
    frozen = cb.asarray(ro)
    with pytest.raises(ValueError, match="read-only"):
        frozen += 1
    np.testing.assert_array_equal(ro, np.arange(3.0))


@needs_torch
def test_in_place_plus_on_a_torch_view():
    t = torch.arange(4, dtype=torch.float32)
    x = cb.from_dlpack(t)
    x += 0.5
    assert torch.equal(t, torch.arange(4, dtype=torch.float32) + 0.5)


def test_in_place_plus_with_an_unreadable_operand_defers_to_it():
    class Other:
        def __radd__(self, other):
            return "other"

    x = cb.zeros(3)
    x += Other()
    assert x == "other"
    y = cb.zeros(3)
    with pytest.raises(TypeError, match=r"\+="):
        y += object()


@needs_jax
def test_jax_inputs():
    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    y = jnp.ones(4, dtype=jnp.float32)
    check(cb.add(x, y), np.asarray(x) + np.asarray(y))


def test_large_adds_use_the_parallel_path_correctly():
    # Big enough to split across cores; strided and broadcast to exercise the walker's splits.
    a = sample((1 << 11, 1 << 9), "float32", 1)
    b = sample((1 << 9,), "float32", 2)
    check(cb.add(a, b), a + b)
    check(cb.add(a.T, a.T), a.T + a.T)


def test_mixed_dtype_table_against_numpy():
    """Every pair numpy and cubridge both define gives numpy's dtype and values."""
    for da, db in itertools.product(NUMPY_DTYPES, repeat=2):
        a, b = sample((3,), da, 1), sample((3,), db, 2)
        try:
            r = cb.add(a, b)
        except TypeError as e:
            assert da in str(e) and db in str(e)
            continue
        check(r, a + b)


def test_stream_arguments_are_read_or_refused_before_anything_runs():
    """stream= is read first, from an int, `__cuda_stream__`, `cuda_stream` or `ptr`: a handle
    that parses reaches the host-memory check; one that cannot be a handle is refused by name."""

    class Protocol:
        def __init__(self, value):
            self.value = value

        def __cuda_stream__(self):
            return self.value

    class Ptr:
        ptr = 7

    a = np.ones(4, np.float32)
    for stream in (7, np.int64(7), Protocol((0, 7)), Ptr()):
        with pytest.raises(ValueError, match="orders CUDA work"):
            cb.add(a, a, stream=stream)
    with pytest.raises(ValueError, match="no stream handle"):
        cb.add(a, a, stream=2**200)
    with pytest.raises(ValueError, match="stream must be"):
        cb.add(a, a, stream="fast")
    with pytest.raises(TypeError):
        cb.add(a, a, stream=Protocol(("a", 7)))
