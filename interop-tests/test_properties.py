"""Property tests: hypothesis draws shapes, strides (steps, offsets, negative steps,
permutations) and broadcasts, values near every dtype's limits and rounding ties for casts,
and arange's bounds; every result must equal numpy's."""

import math
import warnings

import cubridge as cb
import numpy as np
import pytest
from conftest import ALL_DTYPES, NUMPY_DTYPES, float_values, rounded, sample, torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None


@st.composite
def strided_views(draw, shape, dtype=None):
    """A view of `shape` into a larger random array: per-dimension step (maybe negative) and
    offset, then a random permutation of the axes (undone so the view keeps `shape`)."""
    ndim = len(shape)
    perm = draw(st.permutations(range(ndim)))
    steps = [draw(st.sampled_from([1, 2, -1, -2, 3])) for _ in range(ndim)]
    offsets = [draw(st.integers(0, 2)) for _ in range(ndim)]
    # Build the base in permuted order, slice it, then transpose back to `shape`.
    pshape = [shape[p] for p in perm]
    pstep = [steps[p] for p in perm]
    poff = [offsets[p] for p in perm]
    base_shape = [max(1, n * abs(s) + o) for n, s, o in zip(pshape, pstep, poff, strict=True)]
    if dtype is None:
        dtype = draw(st.sampled_from(["float32", "int16", "float16", "complex64"]))
    base = sample(tuple(base_shape), dtype, draw(st.integers(0, 1000)))
    index = []
    for n, s, o in zip(pshape, pstep, poff, strict=True):
        if n == 0:
            index.append(slice(0, 0))
        elif s > 0:
            index.append(slice(o, o + n * s, s))
        else:
            start = o + n * abs(s) - 1
            index.append(slice(start, start - n * abs(s) if start - n * abs(s) >= 0 else None, s))
    view = base[tuple(index)] if index else base[...]
    inverse = np.argsort(perm)
    view = view.transpose(inverse) if ndim else view
    assert view.shape == tuple(shape), (view.shape, shape)
    return view


shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)


@given(data=st.data(), shape=shapes)
def test_add_matches_numpy_on_random_strides(data, shape):
    a = data.draw(strided_views(shape))
    b = data.draw(strided_views(shape, a.dtype.name))
    got = np.from_dlpack(cb.add(a, b))
    np.testing.assert_array_equal(got, a + b)


@given(data=st.data(), shape=shapes)
def test_add_matches_numpy_with_broadcasting(data, shape):
    a = data.draw(strided_views(shape))
    # Drop leading dims and squash random dims to 1.
    keep = data.draw(st.integers(0, len(shape)))
    bshape = tuple(1 if data.draw(st.booleans()) else n for n in shape[len(shape) - keep :])
    b = data.draw(strided_views(bshape, a.dtype.name))
    got = np.from_dlpack(cb.add(b, a))
    np.testing.assert_array_equal(got, b + a)


@given(data=st.data(), shape=shapes, dtype=st.sampled_from(NUMPY_DTYPES))
def test_round_trip_through_dlpack_and_buffer(data, shape, dtype):
    v = data.draw(strided_views(shape, dtype))
    a = cb.asarray(v)
    np.testing.assert_array_equal(np.from_dlpack(a), v)
    np.testing.assert_array_equal(np.asarray(a), v)
    if v.size:
        assert a.data_ptr == v.ctypes.data


def strided_view(base, shape, strides, start):
    """A writable view of `base` (1-d) with `shape`, element `strides` (any sign) and its first
    element at `start`; None where it would leave `base`."""
    reach = [s * (n - 1) for s, n in zip(strides, shape, strict=True)]
    low, high = sum(r for r in reach if r < 0), sum(r for r in reach if r > 0)
    if start + low < 0 or start + high >= base.size:
        return None
    steps = [s * base.itemsize for s in strides]
    return np.lib.stride_tricks.as_strided(base[start:], shape, steps, writeable=True)


@given(data=st.data(), shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple))
def test_out_is_refused_only_where_numpy_finds_shared_memory(data, shape):
    """add(a, 1, out=b) for two views of one buffer runs wherever they share no element
    (np.shares_memory, exact), and then equals numpy's; where they share one, only out
    identical to the input runs. b is mostly a's layout a few elements away (blocks of one
    array), else any other."""
    base = np.arange(64, dtype=np.float32)
    strides = [data.draw(st.sampled_from([-3, -1, 1, 2, 3, 4, 6, 8])) for _ in shape]
    start = data.draw(st.integers(0, 63))
    if data.draw(st.integers(0, 3)):
        other = strides
    else:
        other = [data.draw(st.integers(-4, 6)) for _ in shape]
    a = strided_view(base, shape, strides, start)
    b = strided_view(base, shape, other, start + data.draw(st.integers(-8, 8)))
    if a is None or b is None:
        return
    identical = a.ctypes.data == b.ctypes.data and a.strides == b.strides
    shares = np.shares_memory(a, b)
    want = a + np.float32(1)
    try:
        cb.add(a, 1, out=b)
    except ValueError as e:
        # (out whose own elements may meet is refused whatever a is.)
        assert "overlaps itself" in str(e) or (shares and not identical), (a.strides, b.strides)
        return
    assert identical or not shares
    np.testing.assert_array_equal(b, want)


# --- casts: every pair of dtypes, values near limits and rounding ties -----------------------

# The largest finite value's bits, per narrow floating format.
_TOP_BITS = {"float16": 0x7BFF, "bfloat16": 0x7F7F, "float32": 0x7F7FFFFF}


def _format_value(bits, fmt):
    """The non-negative value of `fmt` with these bits, as a Python float."""
    if fmt == "float16":
        return float(np.uint16(bits).view(np.float16))
    if fmt == "bfloat16":
        return float(np.uint32(bits << 16).view(np.float32))
    return float(np.uint32(bits).view(np.float32))


@st.composite
def floats_near_ties(draw):
    """A float64 at, or a few float64 steps from, a tie of float16, bfloat16 or float32: the
    midpoint of two neighbours (subnormal or normal), or the threshold past which they
    overflow."""
    fmt = draw(st.sampled_from(sorted(_TOP_BITS)))
    k = draw(st.integers(0, _TOP_BITS[fmt]))
    lo = _format_value(k, fmt)
    if k < _TOP_BITS[fmt]:
        hi = _format_value(k + 1, fmt)
    else:
        hi = 2 * lo - _format_value(k - 1, fmt)
    x = (lo + hi) / 2
    nudge = draw(st.integers(-2, 2))
    for _ in range(abs(nudge)):
        x = math.nextafter(x, math.copysign(math.inf, nudge))
    return -x if draw(st.booleans()) else x


@st.composite
def ints_near_ties(draw, bits=64):
    """An integer below 2**(bits - 1) at, or next to, a tie of float16, bfloat16, float32 or
    float64 (where those integers are spaced 2 or more apart)."""
    precision = draw(st.sampled_from([p for p in (8, 11, 24, 53) if p < bits - 1]))
    lead = draw(st.integers(precision, bits - 2))
    v = draw(st.integers(2**lead, 2 ** (lead + 1) - 1))
    ulp = 2 ** (lead - precision + 1)
    return v // ulp * ulp + ulp // 2 + draw(st.integers(-1, 1))


def _int_info(dtype):
    info = np.iinfo(dtype)
    return int(info.min), int(info.max), info.bits


def _values_of(dtype):
    """Values of a source dtype, near its limits and near other dtypes' ties."""
    if dtype == "bool":
        return st.booleans()
    if dtype.startswith(("int", "uint")):
        lo, hi, bits = _int_info(dtype)
        edges = st.sampled_from([lo, hi, 0, 1, lo + 1, hi - 1])
        if bits < 16:
            return st.one_of(st.integers(lo, hi), edges)
        ties = ints_near_ties(bits)
        signed = ties.map(lambda v: -v if lo < 0 else v)
        return st.one_of(st.integers(lo, hi), edges, ties, signed)
    if dtype.startswith("complex"):
        part = _values_of("float64")
        return st.builds(complex, part, part)
    return st.one_of(st.floats(width=64), floats_near_ties(), st.sampled_from([0.0, -0.0]))


def _source(values, dtype):
    """An array of `dtype` (torch's for bfloat16) and its exact values as Python numbers."""
    if dtype == "bfloat16":
        t = torch.tensor(values, dtype=torch.float64).to(torch.bfloat16)
        return t, t.double().tolist()
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        a = np.asarray(values).astype(dtype)
    exact = [complex(v) if dtype.startswith("complex") else v for v in a.tolist()]
    return a, exact


def _cast_reference(v, target):
    """`v` (a Python bool, int, float or complex, exact) cast to `target` as numpy's unsafe
    cast does, each rounding done once: None where numpy's result is undefined (NaN, infinite
    or out-of-range floats into integers)."""
    real = v.real if isinstance(v, complex) else v
    if target == "bool":
        return bool(v)
    if target.startswith(("int", "uint")):
        lo, hi, bits = _int_info(target)
        if isinstance(real, float):
            if not math.isfinite(real) or not lo <= int(real) <= hi:
                return None
            return int(real)
        return (int(real) - lo) % 2**bits + lo  # integers wrap
    if target.startswith("complex"):
        part = "float32" if target == "complex64" else "float64"
        imag = v.imag if isinstance(v, complex) else 0.0
        return complex(rounded(real, part), rounded(imag, part))
    return rounded(real, target)


def _read(a, target):
    """A cubridge array's values as Python numbers (bfloat16 widened exactly)."""
    if target == "bfloat16":
        return float_values(a).reshape(-1).tolist()
    return a.to_numpy().reshape(-1).tolist()


def _same(got, want):
    if isinstance(want, complex):
        return _same(got.real, want.real) and _same(got.imag, want.imag)
    if isinstance(want, float) and math.isnan(want):
        return math.isnan(got)
    return got == want and type(got) is type(want)


@pytest.mark.parametrize("target", ALL_DTYPES)
@pytest.mark.parametrize("source", ALL_DTYPES)
@settings(max_examples=max(10, settings.default.max_examples // 10))
@given(data=st.data())
def test_casts_between_every_pair_of_dtypes_round_once_as_numpy(data, source, target):
    """asarray(x, dtype=target) of an array of every dtype: values near the limits of both
    dtypes and near float16, bfloat16, float32 and float64 ties. Each value must be numpy's
    cast (rounded once); where numpy's is undefined (NaN or out-of-range floats into
    integers) cubridge must only not fail."""
    if "bfloat16" in (source, target) and torch is None:
        pytest.skip("torch is not installed")
    values = data.draw(st.lists(_values_of(source), min_size=1, max_size=12))
    src, exact = _source(values, source)
    got = cb.asarray(src, dtype=target)
    assert got.dtype == target and got.shape == (len(exact),)
    want = [_cast_reference(v, target) for v in exact]
    if "bfloat16" not in (source, target):  # numpy agrees with the reference where defined
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            numpy = src.astype(target).tolist()
        for n, w in zip(numpy, want, strict=True):
            assert w is None or _same(n, w), (source, target, exact, numpy, want)
    for v, g, w in zip(exact, _read(got, target), want, strict=True):
        assert w is None or _same(g, w), (source, target, v, g, w)


def _python_values():
    """Python scalars near every dtype's limits, past int64 and 128 bits, near ties."""
    powers = st.builds(
        lambda k, d, negative: (-1 if negative else 1) * (2**k + d),
        st.integers(0, 1030),
        st.integers(-2, 2),
        st.booleans(),
    )
    part = st.one_of(st.floats(), floats_near_ties())
    return st.one_of(
        st.booleans(),
        st.integers(-(2**70), 2**70),
        powers,
        ints_near_ties(130),
        part,
        st.builds(complex, part, part),
    )


def _python_reference(v, target):
    """What numpy 2 makes of a Python scalar given a dtype: a value, or the exception type
    (values rounded once; numpy itself rounds ints past 2**53 through float64)."""
    if target.startswith(("int", "uint")) and not isinstance(v, bool):
        if isinstance(v, complex):
            return TypeError
        if isinstance(v, float):
            if math.isnan(v):
                return ValueError
            if math.isinf(v):
                return OverflowError
        lo, hi, _ = _int_info(target)
        return int(v) if lo <= int(v) <= hi else OverflowError
    if isinstance(v, complex) and target not in ("bool", "complex64", "complex128"):
        return TypeError
    if isinstance(v, int) and target != "bool" and abs(v) >= 2**1024 - 2**970:
        return OverflowError  # past float64: "int too large to convert to float"
    return _cast_reference(v, target)


@given(value=_python_values(), target=st.sampled_from(ALL_DTYPES))
def test_python_scalars_convert_as_numpy(value, target):
    """asarray(python_value, dtype=target): numpy's value (rounded once) or numpy's error."""
    want = _python_reference(value, target)
    numpy_rounds_twice = isinstance(value, int) and abs(value) > 2**53
    if target != "bfloat16" and not (numpy_rounds_twice and target.startswith(("float", "c"))):
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            try:
                numpy = np.asarray(value, dtype=target).item()
            except (TypeError, ValueError, OverflowError) as e:
                numpy = type(e)
        assert numpy is want if isinstance(want, type) else _same(numpy, want), (numpy, want)
    if isinstance(want, type):
        with pytest.raises(want):
            cb.asarray(value, dtype=target)
        return
    got = cb.asarray(value, dtype=target)
    assert got.shape == () and got.dtype == target
    assert _same(_read(got, target)[0], want), (value, target, _read(got, target), want)


# --- arange: integer and float bounds, every dtype ---------------------------------------------


def _bounds():
    """arange bounds: Python ints and floats (some numpy int64 and float64 scalars), from small
    to 2**40."""
    ints = st.one_of(st.integers(-300, 300), st.integers(-(2**40), 2**40))
    floats = st.one_of(
        st.floats(-300, 300, allow_subnormal=False),
        st.floats(-(2.0**40), 2.0**40),
        st.integers(-600, 600).map(lambda k: k / 4),
    )
    python = st.one_of(ints, floats)
    return st.one_of(python, ints.map(np.int64), floats.map(np.float64))


def _exact_steps(start, step, n):
    """numpy's values for an integer dtype, exactly: int(start) and int(start + step), then
    steps of their difference."""
    v0, v1 = int(start), int(start + step)
    return [v0 + i * (v1 - v0) for i in range(n)]


@given(data=st.data(), dtype=st.sampled_from([None, *ALL_DTYPES]))
def test_arange_matches_numpy(data, dtype):
    """arange of integer and float bounds into every dtype: numpy's dtype, length and values,
    or numpy's exception; where numpy wraps values past the first two into an integer dtype,
    cubridge raises OverflowError instead."""
    start, stop, step = (data.draw(_bounds(), label=k) for k in ("start", "stop", "step"))
    assume(step != 0 and abs((float(stop) - float(start)) / float(step)) <= 3000)
    python = all(type(v) in (int, float) for v in (start, stop, step))
    # Python floats alone make cubridge's default float32 where numpy's is float64.
    floats = any(isinstance(v, float) for v in (start, stop, step))
    numpy_dtype = "float32" if dtype is None and python and floats else dtype
    if numpy_dtype == "bfloat16":
        if ml_dtypes is None or torch is None:
            pytest.skip("ml_dtypes or torch is not installed")
        numpy_dtype = ml_dtypes.bfloat16
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            want = np.arange(start, stop, step, dtype=numpy_dtype)
    except (TypeError, ValueError, OverflowError) as e:
        with pytest.raises(type(e)):
            cb.arange(start, stop, step, dtype=dtype)
        return
    if want.dtype.kind in "iu":
        lo, hi, _ = _int_info(want.dtype)
        if not all(lo <= v <= hi for v in _exact_steps(start, step, len(want))):
            with pytest.raises(OverflowError):
                cb.arange(start, stop, step, dtype=dtype)
            return
    got = cb.arange(start, stop, step, dtype=dtype)
    if dtype == "bfloat16":
        # ml_dtypes converts the first two values through float32 (two roundings).
        firsts = [rounded(float(v), "bfloat16") for v in (start, start + step)]
        assume(all(w == f for w, f in zip(want.astype(np.float64), firsts, strict=False)))
        np.testing.assert_array_equal(float_values(got), want.astype(np.float64))
        return
    assert got.dtype == str(want.dtype), (got.dtype, want.dtype)
    np.testing.assert_array_equal(got.to_numpy(), want, strict=True)
