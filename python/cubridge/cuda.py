"""CUDA devices and streams. Everything here answers honestly on machines without CUDA:
``is_available()`` is False, ``device_count()`` is 0, and the rest raises
``cubridge.CudaUnavailableError``.

>>> if cubridge.cuda.is_available():
...     print(cubridge.cuda.device_count(), cubridge.cuda.mem_info())
"""

import importlib.util
import os

from . import _cubridge
from ._cubridge import Stream

__all__ = [
    "Stream",
    "device_count",
    "empty_cache",
    "is_available",
    "loaded_programs",
    "mem_info",
    "memory_stats",
    "record_stream",
    "set_shareable",
    "shipped_kernels",
    "synchronize",
    "wait_for_compiles",
]


# Every ``device`` argument here takes an int (``0``), ``"cuda:N"``, ``"cuda"``, a
# ``torch.device``, a ``cupy.cuda.Device`` or a ``cubridge.Device``; None is the current device.


def is_available() -> bool:
    """Whether a CUDA driver with at least one device is present.

    >>> device = "cuda" if cubridge.cuda.is_available() else "cpu"
    """
    return _cubridge.cuda_is_available()


def device_count() -> int:
    """Number of CUDA devices (0 without a driver).

    >>> cubridge.cuda.device_count() >= 0
    True
    """
    return _cubridge.cuda_device_count()


def synchronize(device=None) -> None:
    """Blocks until all work on ``device`` (default: the current device) is done.

    Raises:
        ValueError: ``device`` is not a CUDA device.
        CudaUnavailableError: this machine has no CUDA.
        CudaError: a driver call failed.

    >>> cubridge.cuda.synchronize(0)
    """
    _cubridge.cuda_synchronize(device)


def mem_info(device=None) -> tuple[int, int]:
    """Free and total bytes of device memory on ``device`` (default: the current device).

    Raises:
        ValueError: ``device`` is not a CUDA device.
        CudaUnavailableError: this machine has no CUDA.
        CudaError: a driver call failed.

    >>> free, total = cubridge.cuda.mem_info()
    """
    return _cubridge.cuda_mem_info(device)


def empty_cache(device=None) -> None:
    """Gives back to the driver the device memory that the device's pool holds unused (what
    cubridge, and any other user of the pool, freed). Waits for the device first, like
    ``torch.cuda.empty_cache()``.

    Raises:
        ValueError: ``device`` is not a CUDA device.
        CudaUnavailableError: this machine has no CUDA.
        CudaError: a driver call failed.

    >>> cubridge.cuda.empty_cache()
    """
    _cubridge.cuda_empty_cache(device)


def memory_stats(device=None) -> dict[str, int]:
    """Byte counts for ``device`` (default: the current device): ``allocated_bytes`` (cubridge
    arrays alive now), ``allocated_bytes_peak``, ``allocations`` (made so far), ``reserved_bytes``
    (what the device's pool holds from the driver, for cubridge and every other user of the pool),
    ``reserved_bytes_peak`` and ``pool_used_bytes`` (handed out by the pool now, to anyone).

    Raises:
        ValueError: ``device`` is not a CUDA device.
        CudaUnavailableError: this machine has no CUDA.
        CudaError: a driver call failed.

    >>> cubridge.cuda.memory_stats()["allocated_bytes"]
    0
    """
    return _cubridge.cuda_memory_stats(device)


def shipped_kernels() -> list[tuple[str, int]]:
    """The kernels compiled ahead of time and shipped in this build, as ``(program, arch)``
    pairs (``arch`` 90 is compute capability 9.0). A call that needs one of them on a device of
    that major version loads it without compiling; wheels built by ``make wheel`` ship add's
    kernels for the common dtypes, a source build ships none. Works without CUDA.

    >>> archs = {arch for _, arch in cubridge.cuda.shipped_kernels()}
    """
    return _cubridge.cuda_shipped_kernels()


def loaded_programs() -> list[tuple[str, int]]:
    """The programs loaded in this process so far (``add``'s and device copies' kernels,
    ``ElementwiseKernel``, ``RawKernel``, ``RawModule`` (named ``raw_module``; files given by
    ``path`` are not listed), and those of extension modules built on the ``cubridge`` crate), as
    ``(name, device)`` pairs. An elementwise kernel, ``add`` among them, has one
    program per dtype signature and loop variant that a call needed. Each is loaded (shipped,
    read from a cache, or compiled) once per process and device.

    >>> cubridge.cuda.loaded_programs()
    []
    """
    return _cubridge.cuda_loaded_programs()


def wait_for_compiles() -> None:
    """Waits until no kernel is compiling in the background. The first call with a transposed
    input whose tiled kernel is neither shipped nor in the disk cache runs the strided kernel
    and compiles the tiled one on a thread (NVRTC takes hundreds of milliseconds for it); calls
    take the tiled kernel once it is loaded. Benchmarks call this after their warm-up so that
    they time the kernels that later calls run; a process that ends waits for them too (its
    compile then serves later processes from the disk cache). Works without CUDA.

    >>> cubridge.cuda.wait_for_compiles()
    """
    _cubridge.cuda_wait_for_compiles()


def record_stream(array, stream) -> None:
    """Records that ``array``'s memory is read on ``stream`` (an int, a torch or cupy stream, or
    any object with ``__cuda_stream__``), a use that no protocol reported to cubridge: when the
    memory is let go, its reuse waits for the work queued on that stream at that time.

    Raises:
        TypeError: ``array`` is not a ``cubridge.Array``.
        ValueError: ``array`` is not in CUDA device memory, or ``stream`` is None or not a
            stream.

    >>> a = cubridge.zeros(1024, device="cuda")
    >>> side = torch.cuda.Stream()
    >>> cubridge.cuda.record_stream(a, side)  # a's memory waits for side's work when freed
    """
    _cubridge.cuda_record_stream(array, stream)


def set_shareable(on: bool = True) -> None:
    """Makes the device memory that cubridge allocates from now on (``True``) shareable with
    other processes of the node: such an array sent through a ``multiprocessing`` or
    ``torch.multiprocessing`` queue or pipe arrives there as a zero-copy view of the same memory.
    That memory comes from a pool of its own, which the driver never trims: what it held stays
    reserved until the process exits (``empty_cache()`` cannot give it back). ``False`` goes back
    to the device's pool for later allocations. Arrays allocated before are not moved.

    Raises:
        ValueError: a device's driver offers no shareable (POSIX file descriptor) pools.
        CudaUnavailableError: this machine has no CUDA.

    >>> cubridge.cuda.set_shareable(True)
    >>> queue.put(cubridge.zeros(1024, device="cuda"))  # a view of this memory in the reader
    """
    _cubridge.cuda_set_shareable(on)


def _release_other_caches():
    """Asks PyTorch and CuPy, where already imported, to give their cached device memory back.
    cubridge calls this before an allocation fails for lack of memory."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()


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


def _pathfinder_header_dirs():
    """The CUDA headers' folder as ``cuda.pathfinder`` (installed by PyTorch and cuda-python)
    finds it, where it is importable; cubridge also searches for the headers itself. The
    library is left to cubridge's own search, which passes over an NVRTC newer than the
    driver (pathfinder would load the first one it finds)."""
    try:
        from cuda.pathfinder import locate_nvidia_header_directory

        found = locate_nvidia_header_directory("cudart")
        path = getattr(found, "abs_path", None)
    except Exception:  # noqa: BLE001 - an optional probe must never stop `import cubridge`
        return []
    return [path] if isinstance(path, str) and path else []


_cubridge._add_nvrtc_search_dirs(_nvidia_library_dirs() + _pathfinder_header_dirs())
