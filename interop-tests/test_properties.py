"""Property tests: hypothesis draws shapes, strides (steps, offsets, negative steps,
permutations) and broadcasts; every result must equal numpy's."""

import cubridge as cb
import numpy as np
from conftest import NUMPY_DTYPES, sample
from hypothesis import given
from hypothesis import strategies as st


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
