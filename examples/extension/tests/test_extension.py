"""The example extension: scaled_add on numpy and torch CPU arrays everywhere, and on torch,
CuPy and cubridge CUDA arrays (marked ``cuda``) where a GPU is present. Every result is compared
with numpy. The extension shares the ``cubridge`` module's runtime: its results are
``cubridge.Array`` instances, its memory is in ``memory_stats``, its kernel in
``loaded_programs``, and its queued kernels' buffers are held by the one releaser thread."""

import importlib
import os
import subprocess
import sys
import time

import cubridge as cb
import cubridge_example as ext
import numpy as np
import pytest


def _try(name):
    try:
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - not installed here
        return None


torch = _try("torch")
cupy = _try("cupy")
HAS_GPU = cb.cuda.is_available() and torch is not None and torch.cuda.is_available()
cuda = [pytest.mark.cuda, pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")]

X = np.linspace(-3, 3, 1001, dtype=np.float32)
Y = np.arange(1001, dtype=np.float32)


def test_numpy_arrays_on_the_cpu():
    z = ext.scaled_add(X, Y, 2.0)
    np.testing.assert_array_equal(np.asarray(cb.asarray(z)), np.float32(2.0) * X + Y)
    # The result is the cubridge module's own Array, which numpy takes by DLPack.
    assert isinstance(z, cb.Array)
    np.testing.assert_array_equal(np.from_dlpack(z), np.float32(2.0) * X + Y)
    # And cubridge takes it as its own: add on it needs no import.
    np.testing.assert_array_equal(np.asarray(cb.add(z, z)), 2 * (np.float32(2.0) * X + Y))


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_torch_cpu_tensors_and_a_2d_shape():
    x, y = torch.from_numpy(X[:1000].reshape(20, 50)), torch.from_numpy(Y[:1000].reshape(20, 50))
    z = torch.from_dlpack(ext.scaled_add(x, y, -0.5))
    assert z.shape == (20, 50)
    np.testing.assert_array_equal(
        z.numpy(), np.float32(-0.5) * X[:1000].reshape(20, 50) + Y[:1000].reshape(20, 50)
    )


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="float32"):
        ext.scaled_add(X.astype(np.float64), Y, 1.0)
    with pytest.raises(ValueError, match="contiguous"):
        ext.scaled_add(X[::2], Y[::2], 1.0)
    with pytest.raises(ValueError, match="one shape"):
        ext.scaled_add(X, Y[:10], 1.0)
    with pytest.raises(TypeError):
        ext.scaled_add(object(), Y, 1.0)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_torch_cuda_tensors_on_the_current_stream():
    side = torch.cuda.Stream()
    x = torch.zeros(1 << 20, device="cuda")
    y = torch.ones(1 << 20, device="cuda")
    cycles = int(0.1 * torch.cuda.get_device_properties(0).clock_rate * 1000)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(cycles)
        x.fill_(2.0)  # behind 0.1 s on the side stream; the kernel runs there after it
        z = torch.from_dlpack(ext.scaled_add(x, y, 3.0))
        w = z + 0
    torch.cuda.synchronize()
    assert (w == 7.0).all()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU or cupy is None, reason="no CUDA GPU or no cupy here")
def test_cupy_and_cubridge_arrays():
    x = cupy.asarray(X)
    y = cb.asarray(Y, device="cuda")
    z = ext.scaled_add(x, y, 0.25)
    assert z.device.type == "cuda"
    np.testing.assert_array_equal(cupy.asnumpy(cupy.asarray(z)), np.float32(0.25) * X + Y)
    with pytest.raises(ValueError, match="cuda:0 and y on cpu"):
        ext.scaled_add(x, Y, 1.0)


def test_an_older_runtime_is_an_import_error_naming_both_versions():
    # The extension reads the table's version and crate version (its first two fields in every
    # release) before anything else: in a child process, the module's capsule is replaced by
    # one whose table says version 1, crate 0.0.9 (older than the extension was built for), and
    # importing the extension is refused.
    code = """
import ctypes
import cubridge._cubridge as m
class Head(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("crate", ctypes.c_char_p)]
head = Head(1, b"0.0.9")
name = b"cubridge._cubridge._runtime"
new = ctypes.pythonapi.PyCapsule_New
new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
m._runtime = new(ctypes.addressof(head), name, None)
try:
    import cubridge_example
except ImportError as e:
    print("refused:", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "refused:" in out.stdout, out.stdout + out.stderr
    assert f"cubridge {cb.__version__} (runtime table version 3)" in out.stdout
    assert "0.0.9 (runtime table version 1)" in out.stdout and "cubridge_example" in out.stdout


def test_a_newer_runtime_with_one_entry_more_serves_the_extension():
    # Tables only append entries: in a child process the module's table is copied into one of
    # the next version with one entry more at its end, published in its place, and the
    # extension, built against the current table, imports and computes through it.
    code = """
import ctypes
import numpy as np
import cubridge._cubridge as m
get = ctypes.pythonapi.PyCapsule_GetPointer
get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
name = b"cubridge._cubridge._runtime"
old = get(m._runtime, name)
head = ctypes.cast(old, ctypes.POINTER(ctypes.c_uint32))
size = ctypes.cast(old + 16, ctypes.POINTER(ctypes.c_size_t))[0]
table = ctypes.create_string_buffer(size + 8)
ctypes.memmove(table, old, size)
ctypes.cast(table, ctypes.POINTER(ctypes.c_uint32))[0] = head[0] + 1
ctypes.cast(ctypes.addressof(table) + 16, ctypes.POINTER(ctypes.c_size_t))[0] = size + 8
new = ctypes.pythonapi.PyCapsule_New
new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
m._runtime = new(ctypes.addressof(table), name, None)
m._kept_table = table
import cubridge_example
x = np.arange(8, dtype=np.float32)
print("result:", np.from_dlpack(cubridge_example.scaled_add(x, x, 2.0)).tolist())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "result: " + str([3.0 * v for v in range(8)]) in out.stdout


@pytest.mark.parametrize("replacement", ["del m._runtime", "m._runtime = 'not a capsule'"])
def test_a_module_without_the_runtime_is_an_import_error_naming_both_versions(replacement):
    # An installed cubridge module that serves no table (missing, or not the capsule) refuses
    # the extension with the documented ImportError, not an AttributeError.
    code = f"""
import cubridge._cubridge as m
{replacement}
try:
    import cubridge_example
except ImportError as e:
    print("refused:", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "refused:" in out.stdout, out.stdout + out.stderr
    assert f"built with cubridge {cb.__version__} (runtime table version 3)" in out.stdout
    assert f"(version {cb.__version__})" in out.stdout and "cubridge_example" in out.stdout


def test_scale_refuses_host_arrays():
    with pytest.raises(ValueError, match="CUDA arrays"):
        ext.scale(X.copy(), 2.0)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_a_raw_kernel_of_the_extension_and_of_cubridge_is_loaded_once():
    # The extension's RawKernel is compiled and loaded by the cubridge module's runtime (so it
    # is in its loaded_programs), and cubridge's own RawKernel of the same source and name is
    # that same module, not a second load.
    n = 1001
    x = torch.arange(n, dtype=torch.float32, device="cuda")
    ext.scale(x, 3.0)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(x.cpu().numpy(), np.arange(n, dtype=np.float32) * 3)
    assert cb.cuda.loaded_programs().count(("scale", 0)) == 1, cb.cuda.loaded_programs()
    y = torch.ones(n, dtype=torch.float32, device="cuda")
    cb.RawKernel(ext.SCALE_SOURCE, "scale")((4,), (256,), (y, np.float32(-2.0), np.int64(n)))
    torch.cuda.synchronize()
    np.testing.assert_array_equal(y.cpu().numpy(), np.full(n, -2.0, np.float32))
    assert cb.cuda.loaded_programs().count(("scale", 0)) == 1, cb.cuda.loaded_programs()


def _threads_named(prefix):
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return [n for n in names if n.startswith(prefix)]


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU or cupy is None, reason="no CUDA GPU or no cupy here")
def test_one_runtime_serves_the_extension_and_cubridge():
    n = 1 << 22
    x, y = cupy.ones(n, dtype=cupy.float32), cupy.arange(n, dtype=cupy.float32)
    before = cb.cuda.memory_stats()["allocated_bytes"]
    z = ext.scaled_add(x, y, 2.0)
    # The result is cubridge's own, allocated from its pool and counted in its statistics.
    assert isinstance(z, cb.Array)
    assert cb.cuda.memory_stats()["allocated_bytes"] >= before + 4 * n
    np.testing.assert_array_equal(
        cupy.asnumpy(cupy.asarray(cb.add(z, 1.0))), 2.0 + np.arange(n) + 1
    )
    # The extension's kernel was loaded by cubridge's runtime.
    assert ("scaled_add", 0) in cb.cuda.loaded_programs()
    # Foreign buffers of queued kernels (torch's, here, on a side stream) are held by one
    # releaser thread for the whole process.
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        a = torch.ones(n, device="cuda")
        for _ in range(3):
            ext.scaled_add(a, a, 1.0)
            cb.add(a, a)
    torch.cuda.synchronize()
    if os.path.isdir("/proc/self/task"):
        # Linux keeps 15 characters of a thread's name: "cubridge-release" is "cubridge-releas".
        assert len(_threads_named("cubridge-releas")) == 1, _threads_named("cubridge")
    # Let go, the result's memory goes back to cubridge's pool once the releaser lets go of the
    # kernel's buffers (within a few milliseconds of the kernel running).
    del z
    cupy.cuda.Device().synchronize()
    for _ in range(1000):
        if cb.cuda.memory_stats()["allocated_bytes"] < before + 4 * n:
            break
        time.sleep(0.001)
    assert cb.cuda.memory_stats()["allocated_bytes"] < before + 4 * n


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_a_cubridge_array_still_being_written_on_another_stream_is_waited_for():
    # The runtime hands the extension a cubridge array together with its pending write: the
    # extension's kernel (on the default stream) runs after the write queued behind 0.1 s on
    # a side stream, not before it.
    n = 1 << 20
    x = cb.zeros((n,), dtype="float32", device="cuda")
    y = cb.asarray(np.ones(n, dtype=np.float32), device="cuda")
    side = torch.cuda.Stream()
    cycles = int(0.1 * torch.cuda.get_device_properties(0).clock_rate * 1000)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(cycles)
    cb.add(y, 1.0, out=x, stream=side)  # x = 2, behind the sleep
    z = ext.scaled_add(x, y, 3.0)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(torch.from_dlpack(z).cpu().numpy(), np.full(n, 7, np.float32))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU here")
def test_an_extension_call_is_captured_into_a_torch_graph_and_its_memory_lives_with_it():
    # Warmed up on a side stream as torch's docs ask, then captured on torch's capturing stream:
    # the capture stays valid, replays compute on the inputs' new values, and the result's
    # memory (the cubridge module's, lent to the extension) is not given back while the graph
    # lives, even once the result itself is dropped.
    import gc

    n = 1 << 20
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            ext.scaled_add(x, y, 2.0)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        z = ext.scaled_add(x, y, 2.0)
    for _ in range(2):
        x.copy_(torch.randn(n, device="cuda"))
        y.copy_(torch.randn(n, device="cuda"))
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(torch.from_dlpack(z), 2.0 * x + y)
    del z
    gc.collect()
    torch.cuda.synchronize()
    others = [cb.full((n,), -3.0, dtype="float32", device="cuda") for _ in range(8)]
    for _ in range(2):
        g.replay()
    torch.cuda.synchronize()
    assert all(bool((torch.from_dlpack(o) == -3.0).all()) for o in others)
