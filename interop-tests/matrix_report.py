"""Turns interop-matrix runs into MATRIX.md (every cell, and what each exchange costs) and
MATRIX-kernels.md (the cells of users' kernels, reductions and modules).

    python3 -m pytest interop-tests/test_matrix.py --matrix-json run.json
    python3 interop-tests/matrix_report.py run.json [more.json ...] --out interop-tests
    python3 interop-tests/matrix_report.py [--kernels] run.json > report.md

`interop-tests/run_matrix.py` does both in one command. `--out DIR` writes both reports there;
without it the report (`--kernels`: only the cells of kernels, reductions and modules) goes to
stdout.

Several runs may be given (say, a CPU machine and a GPU machine); for each cell the first run
that ran it counts, and a failure in any run wins. Cells come from matrix_libs.cells(), so a cell
no run reached is shown as not run, never as a pass.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.metadata
import json
import os
import pathlib
import platform
import subprocess
import sys
from collections import Counter, defaultdict

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import matrix_libs as m  # noqa: E402

# The users' kernels' cells (MATRIX-kernels.md): elementwise, raw, reduction and module kernels.
KERNEL_KINDS = ("kernel", "raw", "reduce", "module")
DTYPE_GROUPS = {
    "bool": ["bool"],
    "int8-64": ["int8", "int16", "int32", "int64"],
    "uint8-64": ["uint8", "uint16", "uint32", "uint64"],
    "float16": ["float16"],
    "bfloat16": ["bfloat16"],
    "float32/64": ["float32", "float64"],
    "complex": ["complex64", "complex128"],
}


def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment():
    """The machine, its GPUs and the library versions, for the top of the report."""
    env = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "commit": os.environ.get("CUBRIDGE_COMMIT") or _git_commit(),
        "gpus": [],
        "versions": {},
    }
    for dist in ["cubridge", "numpy", "torch", "cupy", "cupy-cuda13x", "cupy-cuda12x", "jax",
                 "jaxlib", "numba", "numba-cuda", "ml_dtypes", "pytest"]:  # fmt: skip
        v = _version(dist)
        if v:
            env["versions"][dist] = v
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        env["gpus"] = [line.strip() for line in out.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError):
        pass
    torch = m.LIBS["torch"].module
    if torch is not None and torch.version.cuda:
        env["versions"]["torch CUDA"] = torch.version.cuda
    return env


def _git_commit():
    # A copy of the tree without its history (a GPU machine's) names the commit it was made
    # from in CUBRIDGE_COMMIT.
    if os.environ.get("CUBRIDGE_COMMIT"):
        return os.environ["CUBRIDGE_COMMIT"]
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
            cwd=pathlib.Path(__file__).parent,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None


class Notes:
    """Numbered footnotes, one per distinct text."""

    def __init__(self):
        self.texts = {}

    def mark(self, text):
        if text not in self.texts:
            self.texts[text] = len(self.texts) + 1
        return self.texts[text]


def merge(runs):
    results = {}
    for run in runs:
        for rec in run["cells"]:
            old = results.get(rec["id"])
            if old is None or old["outcome"] == "skipped" or rec["outcome"] == "failed":
                results[rec["id"]] = rec
    return results


def status(cell, results):
    """(kind, text): kind is pass, fail, unsupported, na or notrun."""
    why = m.why_not_applicable(cell)
    if why:
        return "na", why
    rec = results.get(cell.id)
    if rec is None:
        return "notrun", "not run"
    if rec["outcome"] == "passed":
        return "pass", ""
    if rec["outcome"] == "unsupported":
        lim = rec.get("limit", {})
        return "unsupported", f"not supported by {lim.get('holder')}: {lim.get('reason')}"
    if rec["outcome"] == "skipped":
        return "notrun", f"not run here: {rec.get('reason', '').removeprefix('Skipped: ')}"
    return "fail", rec.get("error", "")


def render(statuses, notes):
    """One table cell for a group of cells."""
    kinds = Counter(k for k, _ in statuses)
    if not statuses:
        return ""
    parts = []
    if kinds["fail"]:
        parts.append(f"**✗ {kinds['fail']}**")
    if kinds["pass"]:
        parts.append("✓" if len(kinds) == 1 else f"✓ {kinds['pass']}")
    for kind, symbol in [("unsupported", "n/s"), ("notrun", "not run"), ("na", "·")]:
        texts = sorted({t for k, t in statuses if k == kind})
        if texts:
            refs = ",".join(str(notes.mark(t)) for t in texts)
            parts.append(f"{symbol}<sup>{refs}</sup>")
    return " ".join(parts)


def table(title, rows, columns, lookup, results, notes):
    """rows: [(label, key)], columns: [(label, key)]; lookup(rowkey, colkey) -> [cells]."""
    lines = [f"| {title} | " + " | ".join(c for c, _ in columns) + " |"]
    lines.append("|---" * (len(columns) + 1) + "|")
    for label, rk in rows:
        groups = [[status(c, results) for c in lookup(rk, ck)] for _, ck in columns]
        if all(all(k == "na" for k, _ in g) for g in groups):
            continue
        lines.append(f"| {label} | " + " | ".join(render(g, notes) for g in groups) + " |")
    return "\n".join(lines)


def build(runs, kernels_only=False):
    """The report of `runs`: every cell, or with `kernels_only` the cells of KERNEL_KINDS."""
    results = merge(runs)
    cells = [c for c in m.cells() if not kernels_only or c.kind in KERNEL_KINDS]
    notes = Notes()
    by = defaultdict(list)
    for c in cells:
        by[(c.group, c.producer, c.consumer, c.protocol, c.device)].append(c)
    pairs = [(f"{p} → {c}, {proto}", (p, c, proto)) for p in m.LIBRARIES for c in m.LIBRARIES
             for proto in m.PROTOCOLS]  # fmt: skip

    out = [
        "# cubridge interop matrix" + (": kernels, reductions and modules" if kernels_only else ""),
        "",
    ]
    out.append(
        "Generated by `interop-tests/matrix_report.py` from the `--matrix-json` output of "
        "`python3 -m pytest interop-tests/test_matrix.py`; do not edit by hand. What every cell "
        "proves is in `interop-tests/test_matrix.py`; the limits of other libraries, each tied "
        "to the error that library raises, are in `interop-tests/matrix_libs.py`."
    )
    out.append("")
    machines = {}
    for run in runs:  # parts of one run on one machine (same commit and versions) share a line
        env = run["environment"]
        key = json.dumps({k: v for k, v in env.items() if k != "date"}, sort_keys=True)
        machines.setdefault(key, []).append(env["date"])
    for i, (key, dates) in enumerate(machines.items(), 1):
        env = json.loads(key)
        when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]} ({len(dates)} parts)"
        out.append(f"**Run {i}:** {when}, cubridge commit `{env.get('commit')}`, "
                   f"{env['platform']}, {env['cpus']} CPUs, Python {env['python']}.  ")  # fmt: skip
        gpus = env.get("gpus") or ["none"]
        out.append(f"GPUs (name, memory, driver): {'; '.join(gpus)}.  ")
        out.append("Libraries: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()) + ".")
        out.append("")

    counts = Counter(status(c, results)[0] for c in cells)
    ours = Counter(
        status(c, results)[0] for c in cells
        if "cubridge" in (c.consumer, *c.producer.split(","))
    )  # fmt: skip
    out.append("## Summary")
    out.append("")
    out.append("| cells | passed | not supported by another library or protocol | failed | "
               "not run here | not applicable |")  # fmt: skip
    out.append("|---|---|---|---|---|---|")
    for label, k in [("all", counts), ("with cubridge as a producer or consumer", ours)]:
        out.append(f"| {label} | {k['pass']} | {k['unsupported']} | {k['fail']} | "
                   f"{k['notrun']} | {k['na']} |")  # fmt: skip
    out.append("")
    out.append(
        "Legend: ✓ every cell passed (values equal numpy's, bit for bit; for transfers also the "
        "same data pointer, and the producer deleted and its memory reused before the read; for "
        "add, `out` written in place); **✗ n** n cells failed; "
        "n/s<sup>k</sup> not supported by the library named in note k, which raised that "
        "library's own error; · not applicable (note says why); not run: the library or the "
        "GPU was missing on the machine of every run. A number after a symbol counts cells "
        "where a table cell covers several."
    )
    out.append("")

    if not kernels_only:

        def transfer_lookup(group, device):
            return lambda rk, ck: [c for c in by[(group, *rk, device)] if ck(c)]

        out.append("## Dtypes (contiguous arrays)")
        for device in ["cpu", "cuda:0"]:
            out.append("")
            out.append(f"### {device}")
            out.append("")
            cols = [(g, lambda c, ds=ds: c.dtype in ds) for g, ds in DTYPE_GROUPS.items()]
            out.append(table("producer → consumer, protocol", pairs, cols,
                             transfer_lookup("dtypes", device), results, notes))  # fmt: skip

        out.append("")
        out.append(f"## Layouts ({' and '.join(m.LAYOUT_DTYPES)})")
        for device in ["cpu", "cuda:0"]:
            out.append("")
            out.append(f"### {device}")
            out.append("")
            cols = [(lay, lambda c, lay=lay: c.layout == lay) for lay in m.LAYOUTS]
            out.append(table("producer → consumer, protocol", pairs, cols,
                             transfer_lookup("layouts", device), results, notes))  # fmt: skip

        out.append("")
        out.append("## Devices (float32, contiguous)")
        out.append("")

        def device_lookup(rk, dev):
            group = "dtypes" if dev in ("cpu", "cuda:0") else "devices"
            return [c for c in by[(group, *rk, dev)] if c.dtype == "float32"]

        out.append(table("producer → consumer, protocol", pairs, [(d, d) for d in m.DEVICES],
                         device_lookup, results, notes))  # fmt: skip

        out.append("")
        out.append("## Streams (cuda:0, float32)")
        out.append("")
        out.append(
            "default: written on the default stream. side: written on a non-default stream behind "
            "a 0.1 s kernel and handed over while it runs (the consumer must see the new values). "
            "none: exported with `stream=-1` while the kernel runs (the export must not wait); the "
            "user synchronizes, then the consumer reads."
        )
        out.append("")
        stream_cells = [c for c in cells if c.kind == "stream"]
        spairs = [(f"{p} → {c}, {proto}", (p, c, proto)) for p in m.LIBRARIES for c in m.LIBRARIES
                  for proto in ("dlpack-versioned", "cai")]  # fmt: skip
        out.append(table("producer → consumer, protocol", spairs, [(s, s) for s in m.STREAM_MODES],
                         lambda rk, mode: [c for c in stream_cells
                                           if (c.producer, c.consumer, c.protocol) == rk
                                           and c.stream == mode],
                         results, notes))  # fmt: skip

        out.append("")
        out.append("## cubridge.add(x, y, out=z) across producers")
        for device in ["cpu", "cuda:0"]:
            adds = [c for c in cells if c.kind == "add" and c.device == device]
            libs = sorted({p for c in adds for p in c.producer.split(",")}, key=m.LIBRARIES.index)
            out.append("")
            out.append(f"### {device}: float32, x (3, 4) + y (4,) broadcast; rows x, y; columns z")
            out.append("")
            out.append(table("x, y", [(f"{x}, {y}", (x, y)) for x in libs for y in libs],
                             [(z, z) for z in libs],
                             lambda rk, z, adds=adds: [c for c in adds if c.group == "add-producers"
                                            and c.producer == f"{rk[0]},{rk[1]},{z}"],
                             results, notes))  # fmt: skip
            out.append("")
            out.append(f"### {device}: every dtype and layout, x, y and z from one producer "
                       "(z from cubridge for jax)")  # fmt: skip
            out.append("")
            cols = [(g, ("add-dtypes", ds)) for g, ds in DTYPE_GROUPS.items()]
            cols += [(lay, ("add-layouts", [lay])) for lay in m.LAYOUTS]
            out.append(table("producer", [(p, p) for p in libs], cols,
                             lambda p, ck, adds=adds: [c for c in adds if c.group == ck[0]
                                            and c.producer.startswith(p + ",")
                                            and (c.dtype if ck[0] == "add-dtypes" else c.layout)
                                            in ck[1]],
                             results, notes))  # fmt: skip

    out.append("")
    out.append("## Users' kernels on cuda:0")
    out.append("")
    out.append("A `cubridge.ElementwiseKernel` `z = x + y` (`T x, T y` → `T z`) with x, y and `out` "
               "from any producer, and a `cubridge.RawKernel` `y = x + x` on one producer's "
               "arrays (`y` written in place).")  # fmt: skip
    kern = [c for c in cells if c.kind == "kernel"]
    libs = sorted({p for c in kern for p in c.producer.split(",")}, key=m.LIBRARIES.index)
    out.append("")
    out.append("### ElementwiseKernel: float32, x (3, 4), y (4,) broadcast; rows x, y; columns z")
    out.append("")
    out.append(table("x, y", [(f"{x}, {y}", (x, y)) for x in libs for y in libs],
                     [(z, z) for z in libs],
                     lambda rk, z: [c for c in kern if c.group == "kernel-producers"
                                    and c.producer == f"{rk[0]},{rk[1]},{z}"],
                     results, notes))  # fmt: skip
    out.append("")
    out.append("### ElementwiseKernel: every dtype and layout, x, y and z from one producer "
               "(z from cubridge for jax); streams: x written on the producer's side stream "
               "behind a 0.1 s kernel, the kernel called under that stream")  # fmt: skip
    out.append("")
    cols = [(g, ("kernel-dtypes", ds)) for g, ds in DTYPE_GROUPS.items()]
    cols += [(lay, ("kernel-layouts", [lay])) for lay in m.LAYOUTS]
    cols += [(f"stream {s}", ("kernel-streams", [s])) for s in ("default", "side")]

    def kernel_lookup(p, ck):
        def key(c):
            return {"kernel-dtypes": c.dtype, "kernel-layouts": c.layout}.get(c.group, c.stream)

        return [c for c in kern if c.group == ck[0] and c.producer.startswith(p + ",")
                and key(c) in ck[1]]  # fmt: skip

    out.append(table("producer", [(p, p) for p in libs], cols, kernel_lookup, results, notes))
    raw = [c for c in cells if c.kind == "raw"]
    raw_dtypes = sorted({c.dtype for c in raw}, key=m.DTYPES.index)
    out.append("")
    out.append("### RawKernel: x and y of one producer, by dtype")
    out.append("")
    out.append(table("producer", [(p, p) for p in sorted({c.producer for c in raw},
                                                          key=m.LIBRARIES.index)],
                     [(d, d) for d in raw_dtypes],
                     lambda p, d: [c for c in raw if c.producer == p and c.dtype == d],
                     results, notes))  # fmt: skip
    out.append("")
    out += reductions(cells, results, notes)
    out += modules(cells, results, notes)
    if not kernels_only:
        out += costs(runs)
    out.append("## Notes")
    out.append("")
    for text, n in sorted(notes.texts.items(), key=lambda kv: kv[1]):
        out.append(f"{n}. {text}")
    failures = [results[c.id] for c in cells
                if status(c, results)[0] == "fail"]  # fmt: skip
    out.append("")
    out.append("## Failures")
    out.append("")
    if not failures:
        out.append("None.")
    for rec in failures:
        last = rec.get("error", "").strip().splitlines()[-1:] or [""]
        out.append(f"- `{rec['id']}`: {last[0][:300]}")
    out.append("")
    return "\n".join(out)


REDUCE_OPS = {"sum": "cubridge.sum", "kernel": "ReductionKernel"}


def reductions(cells, results, notes):
    """The reduce cells' tables: producers of x and out on each device, then one producer's
    dtypes, layouts and streams on the host and cuda:0."""
    red = [c for c in cells if c.kind == "reduce"]
    if not red:
        return []
    out = ["## Reductions", ""]
    out.append("`cubridge.sum(x, axis=a, out=z)` and a user's `cubridge.ReductionKernel` "
               "(`T x` → `T y`, the square root of the sum of squares accumulated in float; "
               "CUDA only) with `out=z` written in place; the expected values are numpy's on "
               "host copies.")  # fmt: skip
    for device in ["cpu", "cuda:0", "cuda:1"]:
        here = [c for c in red if c.device == device]
        libs = sorted({p for c in here for p in c.producer.split(",")}, key=m.LIBRARIES.index)
        ops = [op for op in REDUCE_OPS if any(c.op == op for c in here)]
        out += ["", f"### {device}: float32, x (3, 4) over axis 1; rows x; columns z", ""]
        out.append(table("x, reduction", [(f"{x}, {REDUCE_OPS[op]}", (x, op)) for op in ops
                                          for x in libs],
                         [(z, z) for z in libs],
                         lambda rk, z, here=here: [c for c in here
                                                   if c.group == "reduce-producers"
                                                   and c.producer == f"{rk[0]},{z}"
                                                   and c.op == rk[1]],
                         results, notes))  # fmt: skip
    cols = [(g, ("reduce-dtypes", ds)) for g, ds in DTYPE_GROUPS.items()]
    cols += [(lay, ("reduce-layouts", [lay])) for lay in m.LAYOUTS]
    cols += [(f"stream {s}", ("reduce-streams", [s])) for s in ("default", "side")]

    def key(c):
        return {"reduce-dtypes": c.dtype, "reduce-layouts": c.layout}.get(c.group, c.stream)

    for device in ["cpu", "cuda:0"]:
        here = [c for c in red if c.device == device and c.group != "reduce-producers"]
        libs = sorted({c.producer.split(",")[0] for c in here}, key=m.LIBRARIES.index)
        out += ["", f"### {device}: every dtype (axis 1 of (3, 4)) and layout (axis 0 of the "
                "view), x and z from one producer (z from cubridge for jax); streams: x "
                "written on the producer's side stream behind a 0.1 s kernel, reduced under "
                "that stream", ""]  # fmt: skip
        out.append(table("producer, reduction",
                         [(f"{p}, {REDUCE_OPS[op]}", (p, op)) for op in REDUCE_OPS for p in libs],
                         cols,
                         lambda rk, ck, here=here: [c for c in here if c.group == ck[0]
                                                    and c.producer.startswith(rk[0] + ",")
                                                    and c.op == rk[1] and key(c) in ck[1]],
                         results, notes))  # fmt: skip
    out.append("")
    return out


def modules(cells, results, notes):
    """The module cells' table: rows the library whose arrays the kernel ran on, or that took in
    the `__device__` variable; columns dtype and device."""
    mod = [c for c in cells if c.kind == "module"]
    if not mod:
        return []
    out = ["## RawModule", ""]
    out.append("A `cubridge.RawModule` with a template kernel `matrix_axpo<T>` (`y[i] = 2 * "
               "x[i] + matrix_offset<T>[i % 4]`) and a template `__device__` variable "
               "`matrix_offset<T>` (from `get_global`), both in `name_expressions`. Kernel rows: x and y from that producer, y "
               "written in place, the variable written by cubridge. Variable rows: the "
               "variable taken in zero-copy by that library (torch.from_dlpack, cupy.asarray, "
               "numba.cuda.as_cuda_array, jax.numpy.from_dlpack), written there (jax, whose "
               "arrays are immutable, reads what cubridge wrote), then read by the kernel on "
               "cubridge arrays.")  # fmt: skip
    out.append("")
    rows = [(f"kernel on {p}'s arrays", ("module-kernels", p)) for p in m.LIBRARIES]
    rows += [(f"variable in {c}", ("module-globals", c)) for c in m.LIBRARIES]
    combos = sorted({(c.dtype, c.device) for c in mod}, key=lambda k: (k[1], m.DTYPES.index(k[0])))

    def lib(c):
        return c.producer if c.group == "module-kernels" else c.consumer

    out.append(table("library", rows, [(f"{d}, {dev}", (d, dev)) for d, dev in combos],
                     lambda rk, ck: [c for c in mod if c.group == rk[0] and lib(c) == rk[1]
                                     and (c.dtype, c.device) == ck],
                     results, notes))  # fmt: skip
    out.append("")
    return out


def costs(runs):
    """The table of what each exchange costs on cuda:0, from the runs' cost records (the first
    run that measured a pair counts)."""
    found = {}
    for run in runs:
        for rec in run.get("costs", []):
            key = (rec["producer"], rec["consumer"], rec["protocol"], rec["n"])
            found.setdefault(key, rec)
    if not found:
        return []
    sizes = sorted({k[3] for k in found})
    protocols = [p for p in ("dlpack", "cai") if any(k[2] == p for k in found)]
    out = ["## What each exchange costs (cuda:0, float32)", ""]
    out.append(
        "The median time of one exchange of a producer's array, measured in the same run, in "
        "one process alone on the machine: "
        "dlpack is `consumer.from_dlpack(x)` as users call it (the consumer asks for the "
        "capsule it reads, or takes the producer's C exchange table where it reads one); cai "
        "hands over only `__cuda_array_interface__`. The time covers the producer's export, "
        "the consumer's import, the device work it queued (waited for) and the consumer's "
        "array let go. *copy*: the consumer's array does not share the producer's memory. –: "
        "the pair cannot exchange this way (the cells above say why)."
    )
    out.append("")
    head = [f"{proto}, 2^{n.bit_length() - 1}" for proto in protocols for n in sizes]
    out.append("| producer → consumer | " + " | ".join(head) + " |")
    out.append("|---" * (len(head) + 1) + "|")

    def shown(rec):
        if rec is None:
            return "–"
        us = rec["median_us"]
        text = f"{us:.1f} µs" if us < 1000 else f"{us / 1000:.2f} ms"
        return text + (" *copy*" if rec["copied"] else "")

    for p in m.LIBRARIES:
        for c in m.LIBRARIES:
            row = [found.get((p, c, proto, n)) for proto in protocols for n in sizes]
            if any(row):
                out.append(f"| {p} → {c} | " + " | ".join(shown(r) for r in row) + " |")
    out.append("")
    return out


def main(args):
    kernels_only = "--kernels" in args
    out_dir = None
    if "--out" in args:
        at = args.index("--out")
        out_dir = pathlib.Path(args[at + 1])
        args = args[:at] + args[at + 2 :]
    paths = [a for a in args if a != "--kernels"]
    runs = [json.loads(pathlib.Path(p).read_text()) for p in paths]
    if out_dir is None:
        sys.stdout.write(build(runs, kernels_only))
        return
    (out_dir / "MATRIX.md").write_text(build(runs))
    (out_dir / "MATRIX-kernels.md").write_text(build(runs, kernels_only=True))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
