"""First-call latency of the CUDA add: each case in a fresh process with its own on-disk kernel
cache, CUDA and torch already initialised, timing the first cubridge.add (wall time until its
kernel is queued and, separately, done):

  cold: empty cache, so NVRTC compiles and the module loads (goal <= 100 ms);
  warm: a new process on the cache the cold one filled (goal <= 5 ms to the first launch);
  cold transposed: empty cache, the first add with a transposed input, whose tiled kernel is a
  module of its own (compiled on the first such call; no goal of its own).

    python benches/first_call.py [--runs 5]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from _common import header, save_json, versions

CHILD = r"""
import json, time, torch, cubridge as cb
import sys
a = torch.ones(1 << 20, device="cuda", dtype=torch.float16)
b = torch.ones(1 << 20, device="cuda", dtype=torch.float32)
if sys.argv[1] == "transposed":
    a = a.view(1024, 1024).T
    b = b.view(1024, 1024)
torch.cuda.synchronize()
cb.cuda.synchronize()
t0 = time.perf_counter()
r = cb.add(a, b)
t1 = time.perf_counter()
torch.cuda.synchronize()
t2 = time.perf_counter()
assert torch.equal(torch.from_dlpack(r), a.float() + b)
print(json.dumps({"launch": t1 - t0, "done": t2 - t0}))
"""


def child(cache, layout="contiguous"):
    env = dict(os.environ, CUBRIDGE_CACHE_DIR=cache)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, layout], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--out", default=".")
    args = p.parse_args()
    info = versions()
    print(header(info))
    cold, warm, cold_t = [], [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as cache:
            cold.append(child(cache))
            warm.append(child(cache))
        with tempfile.TemporaryDirectory() as cache:
            cold_t.append(child(cache, "transposed"))
    med = lambda xs, k: statistics.median(x[k] for x in xs) * 1e3  # noqa: E731
    print(
        f"\nfirst cubridge.add (float16 + float32, 2^20 elements), median of {args.runs} processes"
    )
    print(
        f"  cold cache: {med(cold, 'launch'):7.2f} ms to launch, {med(cold, 'done'):7.2f} ms "
        "to done (goal <= 100 ms)"
    )
    print(
        f"  warm cache: {med(warm, 'launch'):7.2f} ms to launch, {med(warm, 'done'):7.2f} ms "
        "to done (goal <= 5 ms to launch)"
    )
    print(
        f"  cold cache, transposed input (1024 x 1024): {med(cold_t, 'launch'):7.2f} ms to "
        f"launch, {med(cold_t, 'done'):7.2f} ms to done"
    )
    os.makedirs(args.out, exist_ok=True)
    save_json(
        os.path.join(args.out, "first_call.json"),
        {"info": info, "cold": cold, "warm": warm, "cold_transposed": cold_t},
    )


if __name__ == "__main__":
    main()
