"""CUDA device queries. Everything here works, and answers honestly, on machines without CUDA."""

from ._cubridge import cuda_device_count as _device_count
from ._cubridge import cuda_is_available as _is_available

__all__ = ["device_count", "is_available"]


def is_available() -> bool:
    """Whether a CUDA driver with at least one device is present."""
    return _is_available()


def device_count() -> int:
    """Number of CUDA devices (0 without a driver)."""
    return _device_count()
