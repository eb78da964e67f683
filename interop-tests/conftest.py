"""Shared fixtures for the interop tests: optional frameworks, the dtype table, hypothesis profiles.

Every framework import is tried once here; tests that need a missing framework are skipped with
the reason, and CUDA tests are marked ``cuda`` and skip cleanly where no GPU is present.
"""

import importlib
import math
import os
import subprocess
import sys
from fractions import Fraction

import cubridge as cb
import numpy as np
import pytest
from hypothesis import HealthCheck, settings


def run_child(code, env=None):
    """Runs `code` in a new Python process; asserts it exited cleanly and returns the result
    (stdout and stderr as text)."""
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done


def _try_import(name):
    try:
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - any import failure means "not available here"
        return None


torch = _try_import("torch")
jax = _try_import("jax")
if jax is not None:
    jax.config.update("jax_enable_x64", True)
    # The suite's JAX arrays are host arrays unless a test places them elsewhere, also where
    # JAX runs on a GPU by default (the matrix and the CUDA tests name their devices).
    jax.config.update("jax_default_device", jax.devices("cpu")[0])
    jnp = importlib.import_module("jax.numpy")
else:
    jnp = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
needs_jax = pytest.mark.skipif(jax is None, reason="jax is not installed")

settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile("slow", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def examples(factor):
    """Examples for a property that deserves `factor` times the profile's count (the fuzzers of
    untrusted descriptors): profiles shorten or lengthen them like every other property."""
    return settings.default.max_examples * factor


# All 15 dtypes; numpy has all but bfloat16.
ALL_DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
]  # fmt: skip
NUMPY_DTYPES = [d for d in ALL_DTYPES if d != "bfloat16"]
# torch has no uint16/32/64 arithmetic on CPU in every version, but it can hold them.
TORCH_DTYPES = ALL_DTYPES


# Fraction bits and exponent bits of the binary floating dtypes.
FLOAT_FORMATS = {"float16": (10, 5), "bfloat16": (7, 8), "float32": (23, 8), "float64": (52, 11)}


def rounded(value, dtype):
    """`value` (a Python int or float, taken exactly) rounded once, to nearest with ties to
    even, into the floating `dtype`, as a Python float (infinite past the dtype's range): the
    reference for conversions, computed in exact fractions, independently of any library."""
    if isinstance(value, float) and not math.isfinite(value):
        return value
    fraction, exponent = FLOAT_FORMATS[dtype]
    x = abs(Fraction(value))
    sign = -1.0 if value < 0 or math.copysign(1.0, value) < 0 else 1.0
    if x == 0:
        return sign * 0.0
    top = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** top > x:
        top -= 1  # now 2**top <= x < 2**(top + 1)
    bias = 2 ** (exponent - 1) - 1
    quantum = Fraction(2) ** (max(top, 1 - bias) - fraction)
    r = round(x / quantum) * quantum  # round() of a Fraction takes ties to even
    if r > (2 - Fraction(2) ** -fraction) * Fraction(2) ** bias:
        return sign * math.inf
    return sign * float(r)


# Values one rounding apart from two: each lies just past a tie of float16 or bfloat16 (or a
# float32 tie that then makes one of theirs), in normal and subnormal ranges and at the top.
NEAR_TIES = {
    "float16": [1 + 2**-11 + 2**-40, 65520 - 2**-20, -(2048 + 1 + 2**-30), 2**-25 + 2**-60,
                3 * 2**-25 - 2**-70, 2**-14 + 2**-25 + 2**-50],
    "bfloat16": [1 + 2**-8 + 2**-40, -(3 + 2**-6 + 2**-45), 2.0**127 * (2 - 2**-8) - 2.0**90,
                 2**-133 + 2**-160, 2**-126 + 2**-134 + 2**-150],
}  # fmt: skip
INT_NEAR_TIES = {
    "float16": [2049, -2051, 4097, 65519, 65520, 2**40],
    "bfloat16": [2**24 + 2**16 + 1, -(2**60 + 2**52 + 1), 2**62 - 2**53 - 1, 257, 2**63 - 1],
}


def float_values(a):
    """A cubridge array's values as a float64 numpy array (bfloat16 through ml_dtypes or torch,
    both exact widenings)."""
    if a.dtype == "bfloat16" and torch is not None:
        return torch.from_dlpack(a).double().numpy()
    return a.to_numpy().astype(np.float64)


def torch_dtype(name):
    return getattr(torch, name)


def sample(shape, dtype, seed=0):
    """Deterministic test values of a numpy dtype, small enough not to overflow int8 sums."""
    return np.asarray(_sample(shape, dtype, seed))


def _sample(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.startswith(("int", "uint")):
        return rng.integers(0, 60, size=shape).astype(dtype)
    if dtype.startswith("complex"):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def torch_sample(shape, dtype, seed=0):
    """Test values as a torch CPU tensor of any dtype (bfloat16 included)."""
    if dtype == "bfloat16":
        return torch.from_numpy(sample(shape, "float32", seed)).to(torch.bfloat16)
    if dtype in ("uint16", "uint32", "uint64"):
        return torch.from_numpy(sample(shape, "int64", seed)).to(torch_dtype(dtype))
    return torch.from_numpy(sample(shape, dtype, seed))


@pytest.fixture
def cb_module():
    return cb


_CUDA_NOT_RUN = []


def pytest_collection_modifyitems(config, items):
    """Without a GPU the tests marked cuda are deselected, not skipped one by one, and the
    summary says how many were not run (they are neither passed nor skipped); `-m cuda` or
    --matrix-json keeps them, each skipped with its reason.

    A test marked whole_gpu reads the device's free memory (`cb.cuda.mem_info`) or fills
    most of it, so other processes on the GPU (pytest-xdist's other workers) change what it
    measures or take what it needs: beside them it is skipped, saying so. Run those tests
    without -n: `pytest -m whole_gpu interop-tests`."""
    keep = "cuda" in (config.option.markexpr or "") or config.getoption("--matrix-json")
    if not keep and not cb.cuda.is_available():
        _CUDA_NOT_RUN[:] = [item for item in items if item.get_closest_marker("cuda")]
        items[:] = [item for item in items if not item.get_closest_marker("cuda")]
        config.hook.pytest_deselected(items=_CUDA_NOT_RUN)
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2:
        return
    skip = pytest.mark.skip(reason="needs the GPU to itself: run -m whole_gpu without -n")
    for item in items:
        if item.get_closest_marker("whole_gpu"):
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    if _CUDA_NOT_RUN:
        terminalreporter.write_line(
            f"{len(_CUDA_NOT_RUN)} CUDA tests not run: no NVIDIA GPU with a working driver here"
            " (cubridge.cuda.is_available() is False; -m cuda lists each skip)"
        )


# --- the interop matrix's record (test_matrix.py; matrix_report.py reads it) -----------------

_MATRIX = {}


def pytest_addoption(parser):
    parser.addoption(
        "--matrix-json",
        default=None,
        help="write each interop-matrix cell's outcome to this JSON file (see matrix_report.py)",
    )


_CELLS = {}


def _matrix_test(nodeid):
    """(test name, parameter id) of a test of test_matrix.py, or None."""
    if "test_matrix.py::" not in nodeid or "[" not in nodeid:
        return None
    name, _, param = nodeid.split("::")[-1].partition("[")
    return name, param[:-1]


def _cell(param):
    if not _CELLS:
        import matrix_libs

        _CELLS.update((c.id, c) for c in matrix_libs.cells())
    return _CELLS.get(param)


def pytest_runtest_logreport(report):
    """Records each matrix cell's outcome, and each exchange's cost, from the test reports: in
    the one process of a plain run, and in the controller of a pytest-xdist run (which receives
    every worker's reports), so that one JSON file holds the whole run."""
    found = _matrix_test(report.nodeid)
    if found is None:
        return
    props = dict(report.user_properties)
    if found[0] == "test_exchange_cost":
        if report.when == "call" and "cost" in props:
            _COSTS[found[1]] = props["cost"]
        return
    cell = _cell(found[1])
    if cell is None:
        return
    if report.when != "call" and not (report.skipped or report.failed):
        return
    if hasattr(report, "wasxfail"):
        result = "unsupported"
    else:
        result = report.outcome  # passed, failed, skipped
    record = {"cell": cell.as_dict(), "id": cell.id, "outcome": result}
    if "limit" in props:
        record["limit"] = props["limit"]
    if result == "skipped":
        longrepr = report.longrepr
        record["reason"] = longrepr[2] if isinstance(longrepr, (tuple, list)) else ""
    if result == "failed":
        record["error"] = str(report.longrepr)[-1500:]
    _MATRIX.setdefault(cell.id, record)
    if result == "failed":
        _MATRIX[cell.id] = record


_COSTS = {}


def pytest_sessionfinish(session):
    path = session.config.getoption("--matrix-json")
    if not path or not (_MATRIX or _COSTS) or hasattr(session.config, "workerinput"):
        return  # (a pytest-xdist worker: its controller writes the file)
    import json

    import matrix_report

    with open(path, "w") as f:
        json.dump(
            {
                "environment": matrix_report.environment(),
                "cells": list(_MATRIX.values()),
                "costs": list(_COSTS.values()),
            },
            f,
        )
