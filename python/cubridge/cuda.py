"""CUDA devices and streams. Everything here answers honestly on machines without CUDA:
``is_available()`` is False, ``device_count()`` is 0, and the rest raises
``cubridge.CudaUnavailableError``."""

import importlib.util
import os

from . import _cubridge
from ._cubridge import Stream

__all__ = ["Stream", "device_count", "is_available", "mem_info", "synchronize"]


def is_available() -> bool:
    """Whether a CUDA driver with at least one device is present."""
    return _cubridge.cuda_is_available()


def device_count() -> int:
    """Number of CUDA devices (0 without a driver)."""
    return _cubridge.cuda_device_count()


def synchronize(device=None) -> None:
    """Blocks until all work on ``device`` (default: the current device) is done."""
    _cubridge.cuda_synchronize(device)


def mem_info(device="cuda") -> tuple[int, int]:
    """Free and total bytes of device memory."""
    return _cubridge.cuda_mem_info(device)


def _nvidia_library_dirs():
    """Library folders of the ``nvidia`` pip packages (NVRTC among them), which PyTorch and
    CuPy wheels install; cubridge looks there for NVRTC after the system's search path."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    found = []
    for root in spec.submodule_search_locations:
        for sub in ("cu13/lib", "cuda_nvrtc/lib", "cu12/lib"):
            path = os.path.join(root, sub)
            if os.path.isdir(path):
                found.append(path)
    return found


_cubridge._add_nvrtc_search_dirs(_nvidia_library_dirs())
