"""The example extension: scaled_add on numpy and torch CPU arrays everywhere, and on torch,
CuPy and cubridge CUDA arrays (marked ``cuda``) where a GPU is present. Every result is compared
with numpy."""

import importlib

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
    # The result is an Array of the extension's copy of cubridge, which numpy takes by DLPack.
    assert type(z).__name__ == "Array"
    np.testing.assert_array_equal(np.from_dlpack(z), np.float32(2.0) * X + Y)


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
