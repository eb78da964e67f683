"""Regressions for what the second outside review found (issue 27): users' kernels that rewrote
elements they never assigned, a disk cache that trusted its files, imports that let cubridge
write memory its producer forbids writing, values read or computed wrongly, and calls that
behaved otherwise than numpy, torch and CuPy. Each test names the finding it guards. CPU cases
run everywhere; CUDA cases are marked ``cuda``; results are compared with numpy, torch or CuPy.
"""

import os
import struct
import subprocess
import sys

import cubridge as cb
import numpy as np
import pytest
from conftest import _try_import, jax, needs_jax, needs_torch, run_child, torch

cupy = _try_import("cupy")
HAS_GPU = cb.cuda.is_available() and torch is not None and torch.cuda.is_available()
cuda = [pytest.mark.cuda, pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")]


# ---- 1. a conditional assignment must leave the other elements of out= alone -------------------

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


# ---- 2 and 18. the disk cache checks what it loads --------------------------------------------

_CACHE_CHILD = """
import cubridge as cb, torch
k = cb.ElementwiseKernel("T x", "T z", "z = x * (T)3 + (T)1", "cache_probe")
x = torch.arange(8, dtype=torch.float32, device="cuda")
print(torch.from_dlpack(k(x)).tolist())
"""
_CACHE_WANT = str([3.0 * i + 1 for i in range(8)])


def _entries(folder):
    return sorted(p for p in folder.iterdir() if p.suffix == ".bin")


def _fnv_words(data):
    """The disk cache's checksum (64-bit FNV-1a over little-endian words, then the tail)."""
    h, prime, mask = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1
    cut = len(data) // 8 * 8
    for (w,) in struct.iter_unpack("<Q", data[:cut]):
        h = ((h ^ w) * prime) & mask
    for b in data[cut:]:
        h = ((h ^ b) * prime) & mask
    return h


HEADER = 8 + 4 + 4 + 4 + 4 + 16 + 8 + 8


def _damage(kind, data):
    if kind == "truncated":
        return data[: len(data) // 2]
    if kind == "zeroed":
        return bytes(len(data))
    if kind == "empty":
        return b""
    if kind == "garbage":
        return os.urandom(len(data))
    if kind == "wrong architecture":
        # An intact entry that says it was made for another architecture.
        return data[:12] + struct.pack("<I", 80) + data[16:]
    if kind == "refused image":
        # A header that checks out over an image the driver cannot load.
        image = os.urandom(4096)
        head = data[: HEADER - 16] + struct.pack("<QQ", len(image), _fnv_words(image))
        return head + image
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind", ["truncated", "zeroed", "empty", "garbage", "wrong architecture", "refused image"]
)
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_damaged_cache_entries_are_discarded_and_recompiled(kind, tmp_path):
    """A truncated, zeroed or garbage entry gave CUDA_ERROR_INVALID_IMAGE on every later run
    until the user deleted it, and an empty one killed the process with SIGSEGV. Now each is
    discarded with one warning, the kernel compiled again and the answer right, and the entry
    written anew is then used without a warning."""
    env = dict(os.environ, CUBRIDGE_CACHE_DIR=str(tmp_path))
    assert run_child(_CACHE_CHILD, env).stdout.strip() == _CACHE_WANT
    (entry,) = _entries(tmp_path)
    good = entry.read_bytes()
    entry.write_bytes(_damage(kind, good))
    again = run_child(_CACHE_CHILD, env)
    assert again.stdout.strip() == _CACHE_WANT
    assert again.stderr.count("discarded the damaged kernel cache entry") == 1, again.stderr
    (rewritten,) = _entries(tmp_path)
    assert rewritten.read_bytes()[: HEADER - 16] == good[: HEADER - 16]
    third = run_child(_CACHE_CHILD, env)
    assert third.stdout.strip() == _CACHE_WANT and "discarded" not in third.stderr


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_entries_name_the_nvrtc_that_made_them(tmp_path):
    """The key left out the NVRTC version: an image another toolkit's NVRTC wrote was loaded.
    An entry is named for its NVRTC, and one of another version is not read."""
    env = dict(os.environ, CUBRIDGE_CACHE_DIR=str(tmp_path))
    run_child(_CACHE_CHILD, env)
    (entry,) = _entries(tmp_path)
    assert entry.name.split(".")[1].startswith("nvrtc"), entry.name
    major, minor = torch.cuda.get_device_capability()
    assert entry.name.endswith(f".{major}{minor}.bin")
    # The same image under another NVRTC version's name is another entry: compiled anew.
    other = tmp_path / entry.name.replace(".nvrtc", ".nvrtc9", 1)
    entry.rename(other)
    run_child(_CACHE_CHILD, env)
    assert len(_entries(tmp_path)) == 2


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_processes_compiling_one_kernel_at_once_share_one_good_entry(tmp_path):
    """Concurrent writers: eight processes compile the same kernel into an empty cache at once;
    all answer right, one entry remains, no temporary file is left, and a ninth process loads
    the entry without compiling (its file is not rewritten)."""
    env = dict(os.environ, CUBRIDGE_CACHE_DIR=str(tmp_path))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CACHE_CHILD], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(8)
    ]
    outs = [p.communicate()[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs == [_CACHE_WANT] * 8
    assert [p.suffix for p in tmp_path.iterdir()] == [".bin"]
    (entry,) = _entries(tmp_path)
    stamp = entry.stat().st_mtime_ns
    last = run_child(_CACHE_CHILD, env)
    assert last.stdout.strip() == _CACHE_WANT and "discarded" not in last.stderr
    assert entry.stat().st_mtime_ns == stamp


# ---- 3 and 4. memory its producer forbids writing ---------------------------------------------


@needs_torch
def test_tensors_that_require_grad_import_read_only():
    """`cb.asarray(param)` was writable: `add(a, 100, out=a)` changed what autograd saw (x.grad
    408 instead of 8) and `np.from_dlpack(cb.asarray(param))[:] = 5` wrote the parameter."""
    x = torch.nn.Parameter(torch.full((3,), 2.0))
    for imported in (cb.asarray(x), cb.from_dlpack(x)):
        assert imported.readonly
        with pytest.raises(ValueError, match="read-only"):
            cb.add(imported, 100, out=imported)
        view = np.from_dlpack(imported)
        assert not view.flags.writeable
        with pytest.raises(ValueError):
            view[:] = 5
    with pytest.raises(BufferError, match="requires grad"):
        cb.add(x, 1.0, out=x)
    (x * x * x).sum().backward()
    np.testing.assert_array_equal(x.detach().numpy(), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(x.grad.numpy(), [12.0, 12.0, 12.0])  # 3 x^2
    # Reading it is fine, and so is writing a detached tensor.
    np.testing.assert_array_equal(cb.add(x, 1.0).to_numpy(), [3.0, 3.0, 3.0])
    d = x.detach()
    cb.add(d, 1.0, out=d)
    np.testing.assert_array_equal(x.detach().numpy(), [3.0, 3.0, 3.0])


@needs_jax
def test_jax_arrays_are_not_written():
    """out= wrote into JAX arrays, which are immutable, changing other JAX arrays that share the
    buffer. They are refused as out, and imported read-only."""
    cpu = jax.devices("cpu")[0]  # numpy reads it back below, wherever JAX runs by default
    a = jax.device_put(np.arange(4, dtype=np.float32), cpu)
    b = a + 0  # JAX may share buffers between arrays like these
    with pytest.raises(ValueError, match="JAX array, which is immutable"):
        cb.add(np.ones(4, np.float32), 1.0, out=a)
    k = cb.ElementwiseKernel("T x", "T z", "z = x", "jax_out")
    with pytest.raises(ValueError, match="immutable"):
        k(np.ones(4, np.float32), out=a)
    imported = cb.asarray(a)
    assert imported.readonly
    with pytest.raises(ValueError, match="read-only"):
        cb.add(imported, 1.0, out=imported)
    assert not np.from_dlpack(imported).flags.writeable
    np.testing.assert_array_equal(np.asarray(a), [0, 1, 2, 3])
    np.testing.assert_array_equal(np.asarray(b), [0, 1, 2, 3])
    # Reading JAX arrays is what cubridge is for.
    np.testing.assert_array_equal(cb.add(a, b).to_numpy(), [0, 2, 4, 6])


def _jax_gpu():
    try:
        return jax.devices("gpu")[0] if jax is not None else None
    except RuntimeError:
        return None


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_jax_device_arrays_are_not_written():
    """The same for JAX arrays on the GPU, through DLPack and the CUDA array interface."""
    gpu = _jax_gpu()
    if gpu is None:
        pytest.skip("jax has no GPU backend here")
    a = jax.device_put(np.arange(4, dtype=np.float32), gpu)
    with pytest.raises(ValueError, match="immutable"):
        cb.add(torch.ones(4, device="cuda"), 1.0, out=a)
    for imported in (cb.asarray(a), cb.from_dlpack(a)):
        assert imported.readonly
        with pytest.raises(ValueError, match="read-only"):
            cb.add(imported, 1.0, out=imported)
    np.testing.assert_array_equal(np.asarray(a), [0, 1, 2, 3])
    np.testing.assert_array_equal(cb.add(a, a).to_numpy(), [0, 2, 4, 6])


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_device_tensors_that_require_grad_on_every_path():
    """The same on the GPU, through the exchange table (from_dlpack, asarray), the CUDA array
    interface, a users' kernel's output and a raw kernel's argument."""
    x = torch.nn.Parameter(torch.ones(8, device="cuda"))
    for imported in (cb.from_dlpack(x), cb.asarray(x)):
        assert imported.readonly
        with pytest.raises(ValueError, match="read-only"):
            cb.add(imported, 1.0, out=imported)
    k = cb.ElementwiseKernel("T x", "T z", "z = x", "grad_out")
    with pytest.raises(BufferError, match="requires grad"):
        k(torch.ones(8, device="cuda"), out=x)
    r = cb.RawKernel('extern "C" __global__ void f(float* x) {}', "f")
    with pytest.raises(ValueError, match="read-only"):
        r(1, 1, (x,))
    torch.cuda.synchronize()
    assert (x.detach() == 1).all()


# ---- 5 to 11, 13 to 15, 19: values, inference and parity --------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        np.timedelta64(5, "s"),
        np.datetime64("2020-01-01"),
        np.bytes_(b"ab"),
    ],
    ids=["timedelta64", "datetime64", "bytes_"],
)
def test_numpy_scalars_of_dtypes_cubridge_has_not_are_type_errors(value):
    """`add(zeros(8, int64), np.timedelta64(5, 's'))` gave [5, 0, 0, 0, 0, 0, 0, 0]: the scalar
    was read as a uint8 array of its bytes."""
    for call in (
        lambda: cb.add(cb.zeros(8, dtype="int64"), value),
        lambda: cb.asarray(value),
        lambda: cb.asarray([value]),
        lambda: cb.full(2, value),
        lambda: cb.from_dlpack(value),
    ):
        with pytest.raises(TypeError, match="unsupported dtype"):
            call()


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


def test_lists_of_numpy_scalars_keep_their_dtype():
    """`asarray([np.float64(1e300)])` gave float32 [inf], and [np.float64(0.1)] was rounded,
    while numpy and torch give float64."""
    for values in (
        [np.float64(1e300)],
        [np.float64(0.1), 0.2],
        [np.int32(1), np.float32(2.5)],
        [np.int8(1), 2],
        [np.float32(1.5), 2.5],
        [[np.complex64(1j)], [2.0]],
        [np.uint8(200), True],
    ):
        got = cb.asarray(values)
        want = np.asarray(values)
        assert got.dtype == str(want.dtype), values
        np.testing.assert_array_equal(got.to_numpy(), want)
    # Python values alone keep the Array API's float32 default.
    assert cb.asarray([0.1, 2]).dtype == "float32"


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


def test_sequences_are_cast_to_a_given_dtype_as_numpy_does():
    """`asarray([0, 1, 0], dtype='bool')` and `asarray([1.5], dtype='int32')` were TypeErrors
    while the same values as an ndarray were cast."""
    for values, dtype in (
        ([0, 1, 0], "bool"),
        ([1.5, -2.7, 0.2], "int32"),
        ([0.0, 0.5], "bool"),
        ([[1.9], [3.0]], "uint8"),
        ([True, 2.5], "int16"),
    ):
        got = cb.asarray(values, dtype=dtype).to_numpy()
        np.testing.assert_array_equal(got, np.asarray(values, dtype=dtype))
        assert got.dtype == np.dtype(dtype)
    with pytest.raises(OverflowError):
        cb.asarray([300], dtype="int8")
    with pytest.raises(OverflowError):
        cb.asarray([1e30], dtype="int64")
    with pytest.raises(ValueError):
        cb.asarray([float("nan")], dtype="int32")
    with pytest.raises(TypeError):
        cb.asarray([1j], dtype="float32")


@pytest.mark.parametrize("bad", ["flaot32", "single", "f4", "int32_t", "size_t", "Tx"])
def test_misspelt_kernel_types_are_refused_when_made(bad):
    """ElementwiseKernel took misspelt types as type placeholders and failed later or never.
    Like CuPy, a type longer than one letter must be a dtype name."""
    with pytest.raises(ValueError, match=f"{bad}.*bfloat16"):
        cb.ElementwiseKernel(f"{bad} x", "float32 z", "z = x", "k")
    with pytest.raises(ValueError, match=bad):
        cb.ElementwiseKernel("float32 x", f"{bad} z", "z = x", "k")


def test_bfloat16_arrays_reach_numpy_through_ml_dtypes_or_a_clear_error():
    """`np.asarray(a)` of a bfloat16 Array gave a 0-d object array."""
    a = cb.asarray([1.0, -2.5, 3.0], dtype="bfloat16")
    ml_dtypes = _try_import("ml_dtypes")
    if ml_dtypes is not None:
        n = np.asarray(a)
        assert n.dtype == ml_dtypes.bfloat16 and n.shape == (3,)
        np.testing.assert_array_equal(n.astype(np.float32), [1.0, -2.5, 3.0])
    code = (
        "import sys\n"
        "sys.modules['ml_dtypes'] = None\n"
        "import numpy as np, cubridge as cb\n"
        "a = cb.asarray([1.0], dtype='bfloat16')\n"
        "try:\n"
        "    np.asarray(a)\n"
        "    print('converted')\n"
        "except TypeError as e:\n"
        "    print('TypeError', 'bfloat16' in str(e))\n"
    )
    assert run_child(code).stdout.strip() == "TypeError True"
    # Other dtypes still come through the buffer protocol, sharing memory.
    x = cb.arange(4, dtype="int16")
    assert np.asarray(x).dtype == np.int16 and np.asarray(x).ctypes.data == x.data_ptr


def test_mem_info_takes_none_as_the_current_device():
    """`mem_info(None)` said "cpu is not a CUDA device"; every other cuda.* function takes
    None as the current device."""
    if cb.cuda.is_available():
        free, total = cb.cuda.mem_info(None)
        assert 0 < free <= total
        assert cb.cuda.mem_info() == pytest.approx((free, total), rel=0.5)
    else:
        with pytest.raises(cb.CudaUnavailableError):
            cb.cuda.mem_info(None)


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


def test_raw_kernel_options_as_documented():
    """The README showed `RawKernel(source, name, options)` positionally, which raised
    TypeError."""
    src = 'extern "C" __global__ void f() {}'
    assert cb.RawKernel(src, "f", ("-DN=4",)).name == "f"
    assert cb.RawKernel(src, "f", options=["--use_fast_math"]).name == "f"


# ---- 12. complex operators in users' kernels ---------------------------------------------------


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


# ---- 17. a copy handed to a consumer is ordered before its reads ------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_dlpack_copy_is_ordered_before_the_consumer_stream():
    """`__dlpack__(stream=s, copy=True)` ordered neither the consumer's stream after the copy
    nor recorded its use. With the producer's write still queued behind 0.2 s and the consumer
    reading on a busy side stream of its own, it must read the written values; so must a
    consumer of a copy to the host (`dl_device`)."""
    cycles = int(0.2 * torch.cuda.get_device_properties(0).clock_rate * 1000)
    writer, reader = torch.cuda.Stream(), torch.cuda.Stream()
    src = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(writer):
        torch.cuda._sleep(cycles)
        a = cb.add(src, 5.0)  # queued behind the sleep, on the writer stream
    with torch.cuda.stream(reader):
        torch.cuda._sleep(cycles // 4)  # a busy consumer stream
        capsule = a.__dlpack__(stream=reader.cuda_stream, max_version=(1, 0), copy=True)
        seen = torch.from_dlpack(capsule) * 1  # read on the reader stream
    with torch.cuda.stream(writer):
        torch.cuda._sleep(cycles)
        b = cb.add(src, 7.0)
    host = torch.from_dlpack(b.__dlpack__(max_version=(1, 0), dl_device=(1, 0)))
    del a, b
    torch.cuda.synchronize()
    assert (seen == 5.0).all(), f"{int((seen != 5.0).sum())} elements read before the copy"
    assert (host == 7.0).all()
