"""Runs the whole interop matrix once and writes its two reports from that one run:

    python3 interop-tests/run_matrix.py [pytest options ...]

runs `interop-tests/test_matrix.py`'s cells (spread over pytest-xdist workers where it is
installed), then its exchange costs (in one process, alone on the machine), keeps the outcomes
and the costs in `interop-tests/run.json`, and writes
`interop-tests/MATRIX.md` and `interop-tests/MATRIX-kernels.md` from it. On a CUDA machine run it
with the wheel installed and JAX on the GPU (leave JAX_PLATFORMS unset; this sets
XLA_PYTHON_CLIENT_PREALLOCATE=false so that JAX does not take most of the GPU). The reports name
the machine, the library versions and the commit (CUBRIDGE_COMMIT where the tree has no git
history)."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).parent


def main(extra):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    run, costs = HERE / "run.json", HERE / "costs.json"
    base = [sys.executable, "-m", "pytest", str(HERE / "test_matrix.py"), "-q", "-p",
            "no:cacheprovider"]  # fmt: skip
    workers = []
    if importlib.util.find_spec("xdist") is not None and not any(a.startswith("-n") for a in extra):
        workers = ["-n", str(min(8, os.cpu_count() or 1))]
    # The cells, spread over workers; then the exchange costs in one process of their own, so
    # that no other worker's work shares the GPU and the CPUs while they are timed.
    cells = subprocess.run(
        base + workers + ["-k", "not test_exchange_cost", f"--matrix-json={run}"] + extra
    )
    timed = subprocess.run(base + ["-k", "test_exchange_cost", f"--matrix-json={costs}"] + extra)
    if not run.exists():
        sys.exit(f"the run wrote no {run} (pytest exited {cells.returncode})")
    if costs.exists():
        merged = json.loads(run.read_text())
        merged["costs"] = json.loads(costs.read_text()).get("costs", [])
        run.write_text(json.dumps(merged))
        costs.unlink()
    subprocess.run([sys.executable, str(HERE / "matrix_report.py"), str(run), "--out", str(HERE)],
                   check=True)  # fmt: skip
    # pytest's own status: non-zero where any cell (or cost measurement) failed.
    sys.exit(cells.returncode or timed.returncode)


if __name__ == "__main__":
    main(sys.argv[1:])
