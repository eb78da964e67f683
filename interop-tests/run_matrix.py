"""Runs the whole interop matrix once and writes its two reports from that one run:

    python3 interop-tests/run_matrix.py [pytest options ...]

runs `interop-tests/test_matrix.py` (spread over pytest-xdist workers where it is installed),
keeps the cells' outcomes and the exchange costs in `interop-tests/run.json`, and writes
`interop-tests/MATRIX.md` and `interop-tests/MATRIX-kernels.md` from it. On a CUDA machine run it
with the wheel installed and JAX on the GPU (leave JAX_PLATFORMS unset; this sets
XLA_PYTHON_CLIENT_PREALLOCATE=false so that JAX does not take most of the GPU). The reports name
the machine, the library versions and the commit (CUBRIDGE_COMMIT where the tree has no git
history)."""

import importlib.util
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).parent


def main(extra):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    run = HERE / "run.json"
    cmd = [sys.executable, "-m", "pytest", str(HERE / "test_matrix.py"), "-q", "-p",
           "no:cacheprovider", f"--matrix-json={run}"]  # fmt: skip
    if importlib.util.find_spec("xdist") is not None and not any(a.startswith("-n") for a in extra):
        cmd += ["-n", str(min(8, os.cpu_count() or 1))]
    done = subprocess.run(cmd + extra)
    if not run.exists():
        sys.exit(f"the run wrote no {run} (pytest exited {done.returncode})")
    subprocess.run([sys.executable, str(HERE / "matrix_report.py"), str(run), "--out", str(HERE)],
                   check=True)  # fmt: skip
    # pytest's own status: 1 where any cell failed.
    sys.exit(done.returncode)


if __name__ == "__main__":
    main(sys.argv[1:])
