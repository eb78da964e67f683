"""Creation functions against numpy: arange's dtype, length and values for every kind of bound
and dtype, and its errors; the dtype full and arange infer from their values."""

import math

import cubridge as cb
import numpy as np
import pytest
from conftest import float_values

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None


def numpy_arange(*args, dtype=None):
    """numpy's arange, with ml_dtypes' bfloat16 for cubridge's."""
    if dtype == "bfloat16":
        if ml_dtypes is None:
            pytest.skip("ml_dtypes is not installed")
        return np.arange(*args, dtype=ml_dtypes.bfloat16).astype(np.float64)
    return np.arange(*args, dtype=dtype)


def check_arange(args, dtype=None):
    """cubridge's arange equals numpy's: dtype, length and every value (bit for bit)."""
    want = numpy_arange(*args, dtype=dtype)
    got = cb.arange(*args, dtype=dtype)
    if dtype == "bfloat16":
        assert got.dtype == "bfloat16"
        np.testing.assert_array_equal(float_values(got), want, err_msg=repr(args))
        return
    assert got.dtype == str(want.dtype), (args, got.dtype, want.dtype)
    np.testing.assert_array_equal(got.to_numpy(), want, err_msg=repr(args), strict=True)


def test_arange_with_float_bounds_refuses_values_an_integer_dtype_cannot_hold():
    """`arange(-1.0, 2.0, dtype="uint8")` gave [255, 0, 1]: with a float bound the values
    wrapped into the integer dtype, where numpy raises OverflowError (as cubridge's integer
    bounds did)."""
    for args, dtype in (
        ((-1.0, 2.0), "uint8"),
        ((-3.5, 3.0), "uint8"),
        ((0.0, 200.0, 150.0), "int8"),
        ((1e30, 1e31, 1e30), "int64"),
        ((-1.5, 1, 1), "uint32"),
    ):
        with pytest.raises(OverflowError):
            np.arange(*args, dtype=dtype)
        with pytest.raises(OverflowError):
            cb.arange(*args, dtype=dtype)
    # Past the first two values numpy wraps silently; cubridge refuses those as well.
    with pytest.raises(OverflowError):
        cb.arange(0.0, 300.0, 1.0, dtype="uint8")
    # A float step into an integer dtype steps by int(start + step) - int(start), as numpy's.
    for args, dtype in (
        ((-0.5, 3.0), "uint8"),
        ((0, 10, 0.1), "int8"),
        ((0.5, 5.5, 1.5), "int16"),
        ((9.9, -3.0, -2.5), "int32"),
        ((2.0**53, 2.0**53 + 8, 2.0), "uint64"),
    ):
        check_arange(args, dtype)


@pytest.mark.parametrize(
    "args",
    [
        (0.0, np.float64(1), 0.25),
        (np.float64(0), 1.0, 0.25),
        (0.0, np.float32(1), 0.25),
        (np.float32(0), 1.0, 0.25),
        (np.int8(0), np.int16(200)),
        (np.int16(200), np.int8(0), np.int8(-3)),
        (np.uint64(5),),
        (np.uint8(3), 10),
        (np.float16(0), 1, 0.125),
        (np.int32(2), 7.5),
        (np.bool_(True), 4),
    ],
    ids=repr,
)
def test_arange_infers_numpy_dtypes_whatever_the_order(args):
    """`arange(0.0, np.float64(1), 0.25)` was float32 and the reverse float64, and
    `arange(np.int8(0), np.int16(200))` raised OverflowError: with numpy scalars among the
    arguments the dtype is numpy's (at least int64, Python floats counting as float64)."""
    check_arange(args)


def test_arange_of_python_values_keeps_their_dtypes():
    """`arange(0, 2**63 + 4, 2**62)` was refused; Python ints past int64 make uint64 (as for
    full and asarray), and with a negative one float64 (as numpy's), counted exactly."""
    for args in ((0, 2**63 + 4, 2**62), (2**63, 2**64 - 1, 2**61)):
        got = cb.arange(*args)
        assert got.dtype == "uint64"
        np.testing.assert_array_equal(got.to_numpy(), np.array(range(*args), dtype=np.uint64))
    got = cb.arange(-1, 2**63 + 4, 2**62)
    assert got.dtype == "float64"
    np.testing.assert_array_equal(got.to_numpy(), [float(v) for v in range(-1, 2**63 + 4, 2**62)])
    assert cb.arange(True, 3).dtype == "int64"
    assert cb.arange(0.5, 3).dtype == "float32"  # Python floats alone: the default float32


@pytest.mark.parametrize(
    ("args", "dtype"),
    [
        ((0.1, 1.0, 0.3), "float64"),
        ((0, 1, 0.1), "float32"),
        ((0.7, 5.3, 0.45), "float32"),
        ((1, 2, 0.1), "float16"),
        ((1.1, 9.9, 0.7), "bfloat16"),
        ((0, 1, 0.1), "complex64"),
        ((-2.5, 4, 0.37), "complex128"),
        ((2049, 2070, 1), "float16"),
        ((2**60, 2**60 + 2**40, 2**36), "float32"),
        ((0, 100_000), "float16"),
    ],
    ids=repr,
)
def test_arange_values_into_floating_dtypes_are_numpys(args, dtype):
    """With a floating dtype, values were rounded from start + i * step in float64; numpy steps
    by dtype(start + step) - dtype(start) in the dtype's arithmetic (float32 for float16 and
    bfloat16)."""
    check_arange(args, dtype)


def test_arange_lengths_and_errors_are_numpys():
    """Lengths numpy derives from ceil((stop - start) / step) in float64, infinite steps and
    bool ranges included."""
    for args, dtype in (
        ((0, 1, math.inf), "float64"),
        ((0, -1, math.inf), "float64"),
        ((1e-300, 1e300, 1e300), "float64"),
        ((0, 2), "bool"),
        ((1.5, -1.0, -1.5), "bool"),
        ((0.5, 0.7, 0.1), "bool"),
        ((3, 0), "bool"),
    ):
        check_arange(args, dtype)
    for args, dtype, error in (
        ((0, 3), "bool", TypeError),
        ((0, math.nan), None, ValueError),
        ((0, math.inf), None, ValueError),
        ((-math.inf, 0), None, ValueError),
        ((0, 1e300, 1e-300), None, ValueError),
    ):
        with pytest.raises(error):
            np.arange(*args, dtype=dtype)
        with pytest.raises(error):
            cb.arange(*args, dtype=dtype)


@pytest.mark.parametrize(
    ("args", "dtype"),
    [
        ((2**53, 2**53 + 4), "int64"),
        ((10**17, 10**17 + 5), None),
        ((2**63 - 3, 2**63), "int64"),
        ((2**64 - 3, 2**64), "uint64"),
        ((2**64 - 1, 2**64 - 10, -3), "uint64"),
        ((-(2**63), -(2**63) + 6, 2), "int64"),
    ],
)
def test_integer_ranges_are_exact(args, dtype):
    """arange computed integers in float64: values near 2^53 repeated, and ranges near 10^17,
    2^63 or 2^64 came back empty."""
    got = cb.arange(*args, dtype=dtype).to_numpy()
    want = np.array(list(range(*args)), dtype=dtype or "int64")  # Python's exact range
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    assert len(set(got.tolist())) == len(got) > 0


def test_creation_infers_the_dtype_of_the_value():
    """full(3, 5), full(3, True) and arange(5) gave float32; full(3, 1j) and
    full(3, np.float64(2.5)) were TypeErrors."""
    cases = [
        (cb.full(3, 5), "int64", np.full(3, 5)),
        (cb.full(3, True), "bool", np.full(3, True)),
        (cb.full(3, 1j), "complex64", np.full(3, 1j, np.complex64)),
        (cb.full(3, np.float64(2.5)), "float64", np.full(3, 2.5)),
        (cb.full(2, np.int16(-3)), "int16", np.full(2, -3, np.int16)),
        (cb.full(2, 2**64 - 1), "uint64", np.full(2, 2**64 - 1, np.uint64)),
        (cb.arange(5), "int64", np.arange(5)),
        (cb.arange(np.int64(2), 7, 2), "int64", np.arange(2, 7, 2)),
        (cb.arange(0.5, 3), "float32", np.arange(0.5, 3, dtype=np.float32)),
        (cb.arange(3, dtype="float64"), "float64", np.arange(3.0)),
    ]
    for got, dtype, want in cases:
        assert got.dtype == dtype
        np.testing.assert_array_equal(got.to_numpy(), want)
    # A float fill value into an integer dtype stays refused (as documented for full).
    with pytest.raises(TypeError):
        cb.full(2, 1.5, dtype="int32")
