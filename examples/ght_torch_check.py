"""What a machine lacks to run ghtier's PyTorch examples and benchmarks, checked in a child
process so that neither torch nor CUDA is initialised in the caller (shared by
examples/torch_pluggable.py, examples/torch_import_order.py and
bench/alloc/torch_train_pluggable.py)."""
import os
import subprocess
import sys

_PROBE = r"""
import ctypes, json, sys
try:
    import torch
except Exception as e:
    print(f"PyTorch cannot be imported ({type(e).__name__}: {e})"); sys.exit(1)
if not torch.cuda.is_available():
    print(f"PyTorch {torch.__version__} sees no CUDA device"
          + ("" if torch.version.cuda else " (a CPU-only build of PyTorch)")); sys.exit(1)
lib = ctypes.CDLL(sys.argv[1])
lib.ght_stats_json.restype = ctypes.c_char_p
s = lib.ght_stats_json()
if not s or not json.loads(s)["tiers"]["hbm"]["present"]:
    print(f"{sys.argv[1]} has no hbm tier (built without CUDA?)"); sys.exit(1)
"""


def missing_piece(lib):
    """One line naming what is missing (no PyTorch, no CUDA device, a library without an hbm
    tier), or None when the allocator library `lib` can serve PyTorch here."""
    r = subprocess.run([sys.executable, "-c", _PROBE, lib], capture_output=True, text=True)
    if r.returncode == 0:
        return None
    out = r.stdout.strip() or r.stderr.strip() or f"probe exited with {r.returncode}"
    return out.splitlines()[-1]


def skip_status(name, what):
    """Exit status of script `name` on a machine that cannot run it because of `what`: 0 with a
    SKIP line, or 1 where GHT_TEST_REQUIRE_GPU=1 (the GPU machine, where a skip would hide a
    failure)."""
    if os.environ.get("GHT_TEST_REQUIRE_GPU") == "1":
        print(f"FAIL: GHT_TEST_REQUIRE_GPU=1 but {what}")
        return 1
    print(f"SKIP: {name}: {what}")
    return 0
