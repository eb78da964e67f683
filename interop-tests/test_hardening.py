"""Regressions for what an adversarial run against the CPU build found (issue 18): inputs that
crashed or hung, values that came out silently wrong, and errors of the wrong kind. Each test
states the finding it guards; crashes run in a child interpreter, so that a regression fails the
test instead of killing the run."""

import re

import cubridge as cb
import numpy as np
import pytest
from conftest import run_child, torch

# ---- crashes and hangs --------------------------------------------------------------------------


@pytest.mark.parametrize("claimed", [1, 3, 10])
def test_sequence_whose_len_disagrees_with_its_iteration(claimed):
    """asarray sized the array from len() and filled it from iteration: a short len overflowed
    the heap, a long one left uninitialised elements. What is iterated is what counts."""
    code = (
        "import cubridge as cb\n"
        "class Liar(list):\n"
        f"    def __len__(self): return {claimed}\n"
        "a = cb.asarray(Liar([1.0, 2.0, 3.0, 4.0, 5.0]))\n"
        "print(a.shape, list(a.to_numpy()))\n"
        "b = cb.asarray([Liar([1, 2]), Liar([3, 4])])\n"
        "print(b.shape, b.to_numpy().tolist())\n"
    )
    done = run_child(code)
    assert done.stdout.splitlines() == [
        "(5,) [np.float32(1.0), np.float32(2.0), np.float32(3.0), np.float32(4.0), "
        "np.float32(5.0)]",
        "(2, 2) [[1, 2], [3, 4]]",
    ]


def test_views_whose_byte_size_overflows_are_refused():
    """as_strided accepted a view of 2^62 + 1 elements of 8 bytes (a zero stride keeps it
    inside the array): nbytes wrapped, and the buffer export handed CPython a wrong length."""
    code = (
        "import cubridge as cb\n"
        "a = cb.zeros(1, dtype='float64')\n"
        "for shape in ([2**62 + 1], [2**61, 4], [2**60, 2**3]):\n"
        "    try:\n"
        "        v = a.as_strided(shape, [0] * len(shape))\n"
        "        bytes(v)\n"
        "        print('accepted', shape)\n"
        "    except ValueError as e:\n"
        "        print('refused', 'bytes' in str(e))\n"
    )
    assert run_child(code).stdout.split() == ["refused", "True"] * 3
    a = cb.zeros(1, dtype="float64")
    big = a.as_strided([2**40], [0])  # large but addressable: allowed, nbytes exact
    assert big.nbytes == 8 * 2**40


def test_out_that_overlaps_itself_is_refused():
    """An out whose elements share memory (a 2-D view with strides (1, 1)) drove a 2^40-element
    loop on an 8 MB array with the GIL released; small ones gave order-dependent results."""
    a = cb.zeros(1 << 21, dtype="float32")  # 8 MB
    ones = cb.zeros(1, dtype="float32").as_strided([1 << 20, 1 << 20], [0, 0])
    with pytest.raises(ValueError, match="overlaps itself"):
        cb.add(ones, 2.0, out=a.as_strided([1 << 20, 1 << 20], [1, 1]))
    small = cb.zeros(8, dtype="int32")
    with pytest.raises(ValueError, match="overlaps itself"):
        cb.add(np.ones((3, 3), np.int32), 1, out=small.as_strided([3, 3], [2, 1]))
    # Layouts that only look unusual still work: transposed, reversed, interleaved.
    m = cb.zeros(12, dtype="int32")
    cb.add(np.arange(12, dtype=np.int32).reshape(3, 4), 0, out=m.as_strided([3, 4], [1, 3]))
    np.testing.assert_array_equal(m.to_numpy(), np.arange(12).reshape(3, 4).T.ravel())


# ---- wrong values, silently ---------------------------------------------------------------------


def test_large_python_ints_infer_uint64_or_are_refused():
    a = cb.asarray([2**64 - 1, 1])
    assert a.dtype == "uint64"
    np.testing.assert_array_equal(a.to_numpy(), np.array([2**64 - 1, 1], dtype=np.uint64))
    with pytest.raises(OverflowError):
        cb.asarray([2**63, -1])  # no integer dtype holds both
    with pytest.raises(OverflowError, match="out of bounds for int64"):
        cb.full(1, 2**63, dtype="int64")
    with pytest.raises(OverflowError):
        cb.asarray([2**63], dtype="int64")


@pytest.mark.parametrize(
    "call",
    [
        lambda: cb.full(2, 300, dtype="int8"),
        lambda: cb.full(2, -1, dtype="uint16"),
        lambda: cb.asarray([1, 256], dtype="uint8"),
        lambda: cb.add(np.zeros(3, np.uint8), -1),
        lambda: cb.add(-1, np.zeros(3, np.uint8)),
        lambda: cb.add(np.zeros(3, np.int16), 2**15),
        lambda: cb.zeros(3, dtype="int32") + 2**31,
    ],
)
def test_out_of_range_python_ints_raise_overflow_error(call):
    """Values that do not fit the dtype wrapped (full(2, 300, dtype='int8') gave 44); numpy 2
    and torch raise."""
    with pytest.raises(OverflowError, match="out of bounds"):
        call()


def test_in_range_extremes_still_work():
    np.testing.assert_array_equal(cb.full(2, -128, dtype="int8").to_numpy(), [-128, -128])
    np.testing.assert_array_equal(cb.full(1, 2**64 - 1, dtype="uint64").to_numpy(), [2**64 - 1])
    np.testing.assert_array_equal(cb.add(np.zeros(2, np.uint8), 255).to_numpy(), [255, 255])
    # Python ints into floating dtypes round as numpy does, whatever their size.
    assert cb.full(1, 2**70, dtype="float32").to_numpy()[0] == np.float32(2**70)


def test_more_than_64_dimensions_cannot_be_created():
    with pytest.raises(ValueError, match="64"):
        cb.zeros((1,) * 65)
    with pytest.raises(ValueError, match="64"):
        cb.empty((1,) * 65)
    nested = 1.0
    for _ in range(65):
        nested = [nested]
    with pytest.raises(ValueError, match="64"):
        cb.asarray(nested)
    deepest = 1.0
    for _ in range(64):
        deepest = [deepest]
    assert cb.asarray(deepest).ndim == 64


def test_int64_to_float32_rounds_once():
    """Casts of int64 and uint64 to float32 and complex64 went through float64 and rounded
    twice: 2^60 + 2^36 + 1 became 2^60, where numpy and torch give 2^60 + 2^37."""
    v = 2**60 + 2**36 + 1
    want = np.array([v], dtype=np.int64).astype(np.float32)
    assert want[0] == np.float32(2**60 + 2**37)
    got = cb.asarray(np.array([v], dtype=np.int64), dtype="float32").to_numpy()
    np.testing.assert_array_equal(got, want)
    got = cb.asarray(np.array([v], dtype=np.uint64), dtype="complex64").to_numpy()
    np.testing.assert_array_equal(got, np.array([v], dtype=np.uint64).astype(np.complex64))
    assert cb.full(1, v, dtype="float32").to_numpy()[0] == want[0]


def test_truth_and_number_conversions_follow_numpy():
    assert bool(cb.asarray([0.0])) is False
    assert bool(cb.asarray([[3]])) is True
    assert bool(cb.asarray(0)) is False
    for ambiguous in (cb.zeros(2), cb.zeros(0)):
        with pytest.raises(ValueError, match="ambiguous"):
            bool(ambiguous)
    assert float(cb.asarray(2.5)) == 2.5
    assert int(cb.asarray(-7)) == -7
    assert int(cb.asarray(2.9)) == 2
    assert complex(cb.asarray(1 + 2j)) == 1 + 2j
    for call in (float, int, complex):
        with pytest.raises(TypeError, match="0-dimensional"):
            call(cb.zeros(1))


# ---- wrong or unhelpful errors ------------------------------------------------------------------


def test_shape_integers_beyond_the_native_range_say_so():
    with pytest.raises((OverflowError, ValueError), match="too large"):
        cb.empty(2**70)
    with pytest.raises((OverflowError, ValueError), match="too large"):
        cb.zeros((2, 2**70))
    with pytest.raises(OverflowError, match="too large"):
        cb.zeros(np.uint64(2**64 - 1))
    # numpy integers and arrays of them still make shapes.
    assert cb.zeros(np.int64(4)).shape == (4,)
    assert cb.zeros((np.int32(2), 3)).shape == (2, 3)
    assert cb.zeros(np.array([2, 3])).shape == (2, 3)
    with pytest.raises(TypeError, match="sequence of ints"):
        cb.zeros((2, 1.5))


def test_adding_two_python_scalars_is_symmetric():
    for a, b, dtype, value in [
        (1, 2.0, "float32", 3.0),
        (2.0, 1, "float32", 3.0),
        (True, 1, "int64", 2),
        (1, True, "int64", 2),
        (1.0, 1j, "complex64", 1 + 1j),
        (1j, 1.0, "complex64", 1 + 1j),
    ]:
        r = cb.add(a, b)
        assert (r.dtype, r.to_numpy()[()]) == (dtype, value), (a, b)


def test_cpu_dlpack_accepts_only_stream_none():
    a = cb.zeros(3)
    for stream in (0, 1, 2, 12345, -1):
        with pytest.raises(BufferError, match="stream"):
            a.__dlpack__(stream=stream)
    assert a.__dlpack__(stream=None) is not None


def test_copy_true_exports_a_read_only_array_through_the_legacy_abi():
    ro = np.arange(4.0)
    ro.flags.writeable = False
    a = cb.from_dlpack(ro)
    assert a.readonly
    with pytest.raises(BufferError):
        a.__dlpack__()  # zero-copy legacy export cannot say read-only
    copied = cb.from_dlpack(a.__dlpack__(copy=True))  # a legacy capsule of a fresh copy
    assert not copied.readonly
    assert copied.data_ptr != a.data_ptr
    np.testing.assert_array_equal(copied.to_numpy(), ro)


def test_numpy_scalars_in_sequences_are_read_as_their_values():
    a = cb.asarray([np.float64(1.0), 2.0, np.float32(0.5)])
    np.testing.assert_array_equal(a.to_numpy(), np.array([1.0, 2.0, 0.5], np.float32))
    b = cb.asarray([[np.int8(3), 4], [np.uint16(5), np.array(6)]])
    assert b.dtype == "int64"
    np.testing.assert_array_equal(b.to_numpy(), [[3, 4], [5, 6]])
    assert cb.asarray([np.True_, False]).dtype == "bool"
    with pytest.raises(ValueError):  # as numpy: an array among scalars is ragged
        cb.asarray([np.zeros(2), 1.0])


def test_out_may_interleave_with_an_input_that_it_does_not_share_elements_with():
    """x[::2] read while x[1::2] is written shares no element, though their address ranges
    overlap: it runs as in numpy."""
    x = np.arange(8, dtype=np.float32)
    want = x.copy()
    np.add(want[::2], 1.0, out=want[1::2])
    cb.add(x[::2], 1.0, out=x[1::2])
    np.testing.assert_array_equal(x, want)
    with pytest.raises(ValueError, match="partially overlaps"):
        cb.add(x[:4], 1.0, out=x[1:5])


needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


@needs_torch
def test_out_that_requires_grad_is_refused():
    """out= a tensor that requires grad (an nn.Parameter) was written behind autograd's back:
    its version counter did not move and gradients came out wrong. torch's __dlpack__ refuses
    such tensors; so does add, whichever way the tensor comes in."""
    w = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(BufferError, match="requires grad"):
        cb.add(np.ones(3, np.float32), 1.0, out=w)
    assert torch.equal(w.detach(), torch.zeros(3))
    cb.add(np.ones(3, np.float32), 1.0, out=w.detach())  # the documented way
    assert torch.equal(w.detach(), torch.full((3,), 2.0))


@needs_torch
def test_a_tensor_subclass_that_overrides_dlpack_is_asked_through_it():
    """A torch.Tensor subclass overriding __dlpack__ was bypassed through the exchange table it
    inherits from torch.Tensor."""

    class Guarded(torch.Tensor):
        def __dlpack__(self, *args, **kwargs):
            raise BufferError("Guarded tensors are not exported")

    g = torch.ones(3).as_subclass(Guarded)
    for call in (lambda: cb.from_dlpack(g), lambda: cb.add(g, 1.0), lambda: cb.add(g, g)):
        with pytest.raises(BufferError, match="Guarded"):
            call()
    plain = torch.ones(3)
    np.testing.assert_array_equal(cb.add(plain, 1.0).to_numpy(), [2.0, 2.0, 2.0])


def test_an_invalid_exchange_table_falls_back_to_dlpack():
    """A type whose __dlpack_c_exchange_api__ is not a valid capsule blocked its working
    __dlpack__ ("PyCapsule_GetPointer called with invalid PyCapsule object")."""

    class Odd:
        __dlpack_c_exchange_api__ = 42

        def __init__(self):
            self.a = np.arange(3.0)

        def __dlpack__(self, **kwargs):
            return self.a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    np.testing.assert_array_equal(cb.from_dlpack(Odd()).to_numpy(), [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(cb.add(Odd(), 1.0).to_numpy(), [1.0, 2.0, 3.0])


def test_the_matrix_skips_bfloat16_cells_without_ml_dtypes():
    """test_matrix.py failed instead of skipping when ml_dtypes was missing: every dtype's
    cells asked numpy for bfloat16. Run here with ml_dtypes blocked (jax, which needs it, then
    counts as not installed)."""
    here = __import__("pathlib").Path(__file__).parent
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'ml_dtypes':\n"
        "            raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import pytest\n"
        f"sys.exit(pytest.main([{str(here / 'test_matrix.py')!r}, '-q', '-p', 'no:cacheprovider',\n"
        "    '-k', 'cpu and contiguous and (bfloat16 or float32)']))\n"
    )
    done = run_child(code)
    last = done.stdout.strip().splitlines()[-1]
    counts = dict((word, int(n)) for n, word in re.findall(r"(\d+) (\w+)", last))
    assert counts.get("passed", 0) > 0 and counts.get("skipped", 0) > 0, last
    assert "failed" not in counts and "error" not in counts and "errors" not in counts, last


def test_copy_false_against_a_producer_that_copies_is_a_buffer_error():
    """from_dlpack(x, copy=False) where the producer hands over a copy said "a float32 array on
    cpu cannot be seen as float32 on cpu without copying" (ValueError)."""
    src = cb.arange(4, dtype="float32")

    class Copier:
        def __dlpack__(self, **kwargs):
            return src.__dlpack__(max_version=(1, 3), copy=True)

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(BufferError, match="exported a copy"):
        cb.from_dlpack(Copier(), copy=False)
    np.testing.assert_array_equal(cb.from_dlpack(Copier()).to_numpy(), [0, 1, 2, 3])
    with pytest.raises(ValueError, match="copy=False"):
        cb.asarray(np.zeros(2, np.float32), dtype="float64", copy=False)  # a cast: still ValueError


def test_plus_gives_way_to_operands_it_cannot_read_and_raises_for_those_it_can():
    """+ chose NotImplemented by matching the text of an error message; it now looks at the
    operand."""

    class Other:
        def __radd__(self, left):
            return "Other.__radd__"

        def __add__(self, right):
            return "Other.__add__"

    a = cb.zeros(3, dtype="int32")
    assert a + Other() == "Other.__radd__"
    assert Other() + a == "Other.__add__"
    with pytest.raises(TypeError, match="int32 and float32"):
        a + np.zeros(3, np.float32)  # readable, but the dtypes do not promote
    with pytest.raises(TypeError):
        a + object()


def test_another_dlpack_major_version_is_one_buffer_error_either_way():
    """A versioned tensor of another major version raised RuntimeError from a producer's
    __dlpack__ and BufferError as a bare capsule: the same case, one error. Either way the
    tensor goes back to its producer exactly once."""
    import gc

    from dlpack_ctypes import float_buffer, make_capsule

    def made():
        return make_capsule(
            data=float_buffer(4), shape=(4,), strides=(1,), versioned=True, version=(2, 0)
        )

    bare = made()
    with pytest.raises(BufferError, match="major version"):
        cb.from_dlpack(bare.capsule)

    produced = made()

    class Producer:
        def __dlpack__(self, **kwargs):
            return produced.capsule

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(BufferError, match="major version"):
        cb.from_dlpack(Producer())
    gc.collect()
    assert bare.deleted == 1 and produced.deleted == 1


@needs_torch
@pytest.mark.parametrize("kind", ["sparse", "meta", "quantized"])
def test_tensors_dlpack_cannot_describe_are_refused_in_one_line(kind):
    """torch's sparse, meta and quantized tensors raised RuntimeError with 17 lines of C++
    trace."""
    t = {
        "sparse": lambda: torch.eye(3).to_sparse(),
        "meta": lambda: torch.empty(3, device="meta"),
        "quantized": lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8),
    }[kind]()
    for call in (lambda: cb.from_dlpack(t), lambda: cb.add(t, 1.0)):
        with pytest.raises((TypeError, BufferError)) as info:
            call()
        assert "\n" not in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "dtype", [">f8", "f4,i4", "O", "U3", "datetime64[s]", "timedelta64[ms]", "S2", "V4"]
)
def test_numpy_dtypes_cubridge_cannot_read_are_type_errors(dtype):
    """numpy arrays of dtypes cubridge cannot read raised numpy's BufferError (from its
    __dlpack__) instead of the TypeError promised for unsupported dtypes."""
    a = np.zeros(3, dtype=dtype)
    for call in (lambda: cb.asarray(a), lambda: cb.from_dlpack(a), lambda: cb.add(a, a)):
        with pytest.raises(TypeError, match="unsupported dtype"):
            call()


def test_a_dlpack_method_that_returns_no_capsule_is_a_type_error():
    """A __dlpack__ that returned 42, None or a str gave "returned a capsule with neither
    dltensor nor dltensor_versioned ABI"."""
    for returned in (42, None, "x"):

        class Bad:
            value = returned

            def __dlpack__(self, **kwargs):
                return self.value

            def __dlpack_device__(self):
                return (1, 0)

        for call in (lambda: cb.from_dlpack(Bad()), lambda: cb.add(Bad(), 1.0)):
            with pytest.raises(TypeError, match="not a DLPack capsule"):
                call()


@needs_torch
def test_torch_tensors_with_a_lazy_sign_are_refused_as_torch_refuses_them():
    """torch tensors with the conjugate or negative bit set (t.conj(), t.conj().imag) were read
    raw through the exchange table, which skips the checks torch's __dlpack__ makes: the
    values came out with the wrong sign. (torch's own __dlpack__ refuses the conjugate bit but
    exports a negative-bit tensor's memory as it is; cubridge refuses both.)"""
    x = torch.tensor([1 + 2j, 3 - 4j])
    lazy = {"conj": x.conj(), "neg": x.conj().imag}
    for name, t in lazy.items():
        assert t.is_conj() or t.is_neg(), name
        for call in (
            lambda t=t: cb.from_dlpack(t),
            lambda t=t: cb.add(t, 0),
            lambda t=t: cb.add(t, t),
            lambda t=t: cb.add(torch.zeros_like(t).resolve_conj(), 1, out=t),
        ):
            with pytest.raises(BufferError, match="bit set"):
                call()
    # Resolved, the same values come in as they read.
    got = cb.add(x.conj().imag.resolve_neg(), 0.0).to_numpy()
    np.testing.assert_array_equal(got, [-2.0, 4.0])


def test_arange_errors_are_short():
    with pytest.raises(ValueError) as info:
        cb.arange(0, 1, 1e-300)
    assert len(str(info.value)) < 120, str(info.value)


@pytest.mark.cuda
@pytest.mark.skipif(not cb.cuda.is_available(), reason="no CUDA here")
def test_overlap_is_seen_across_host_memory_labels():
    """The same pinned memory seen as cuda_host (the cubridge array) and as cpu (numpy's view of
    it) slipped past the overlap check, which compared addresses only within one label."""
    p = cb.arange(8, dtype="float32", device="cuda_host")
    view = np.asarray(p)  # the same memory, labelled cpu
    assert view.ctypes.data == p.data_ptr
    with pytest.raises(ValueError, match="partially overlaps"):
        cb.add(view[:4], 1.0, out=p.as_strided([4], [1], 1))
    cb.add(view, 1.0, out=p)  # exactly the same elements: in place, allowed
    np.testing.assert_array_equal(view, np.arange(1, 9, dtype=np.float32))
