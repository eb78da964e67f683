"""cubridge in thirty lines: arrays from numpy and torch go into cubridge.add without copies, and
the result goes back out through DLPack, sharing memory. Runs on CUDA when it is available, on
the CPU otherwise."""

import cubridge as cb
import numpy as np

try:
    import torch
except ImportError:
    torch = None

on_gpu = cb.cuda.is_available() and torch is not None and torch.cuda.is_available()
print(f"cubridge {cb.__version__}; CUDA available: {cb.cuda.is_available()}")

if on_gpu:
    a = torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3)
    b = torch.ones(3, dtype=torch.float32, device="cuda")
else:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)  # a numpy array ...
    b = torch.ones(3) if torch is not None else np.ones(3, dtype=np.float32)  # ... and a tensor

c = cb.add(a, b)  # reads both in place, broadcasting b over a's rows
print("a + b =", c)

back = torch.from_dlpack(c) if torch is not None else np.from_dlpack(c)
print(back)
ptr = back.data_ptr() if torch is not None else back.ctypes.data
print("shares cubridge's memory:", ptr == c.data_ptr)

expected = np.arange(6, dtype=np.float32).reshape(2, 3) + 1
got = back.cpu().numpy() if torch is not None else back
assert np.array_equal(got, expected), (got, expected)
print("matches numpy: True")

# In place into a foreign array: out= is written directly.
if torch is not None and not on_gpu:
    out = torch.zeros(2, 3)
    cb.add(a, b, out=out)
    print("written into a torch tensor:", out.tolist())
