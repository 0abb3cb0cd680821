#!/usr/bin/env python3
"""Load ghtier's allocator library before and after `import torch`, and run CUDA work through it.

Issue 12: a program that loaded libghtier.so and then imported torch crashed inside torch's
import (`free(): invalid pointer`): libghtier.so brought the system's cuBLAS, cuDNN, TBB and
libgomp into the process before PyTorch's own copies. The allocator now lives in
libghtier_alloc.so, which needs only libnuma and hwloc (the CUDA runtime is linked statically),
and which promotes itself to the global symbol scope when loaded: a plain ctypes.CDLL load of it
still crashed `import torch` (SIGSEGV) until it did, for a reason not identified (H200 machine,
torch 2.11, 2026-12-01). Each case below runs in a fresh
process, so a crash (a signal) fails that case without stopping the others:

  before         ctypes.CDLL(lib) (RTLD_LOCAL), then import torch
  before-global  ctypes.CDLL(lib, RTLD_GLOBAL), then import torch: its symbols are visible to
                 every library loaded later, the harshest order
  after          import torch, then ctypes.CDLL(lib)

In each, PyTorch's CUDA allocator becomes ghtier's (CUDAPluggableAllocator with ght_torch_malloc
/ ght_torch_free), a small matmul runs on the GPU and is compared with the CPU, ght_where()
confirms that the result is a ghtier block, and the tensors are freed again. Prints one PASS or
FAIL line per case and exits 1 if any failed. `--full LIB` adds an informational case that loads
libghtier.so (the full library) before torch; its outcome does not change the exit status.

Without PyTorch, a CUDA device or a CUDA build of the library it prints SKIP and exits 0 (1 where
GHT_TEST_REQUIRE_GPU=1, the GPU machine).

  python3 examples/torch_import_order.py [--lib build/lib/libghtier_alloc.so]
                                         [--full build/lib/libghtier.so]
"""
import argparse
import os
import signal
import subprocess
import sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ght_torch_check import missing_piece, skip_status  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The child: argv = [mode, lib]. Prints "ok ..." last on success; any failure is an exception,
# a non-zero exit or a signal.
CHILD = r"""
import ctypes, json, sys
mode, lib_path = sys.argv[1], sys.argv[2]

def load():
    flags = ctypes.RTLD_GLOBAL if mode == "before-global" else ctypes.RTLD_LOCAL
    lib = ctypes.CDLL(lib_path, mode=flags)
    lib.ght_init.restype = ctypes.c_int
    lib.ght_last_error.restype = ctypes.c_char_p
    lib.ght_stats_json.restype = ctypes.c_char_p
    return lib

if mode in ("before", "before-global", "full-before"):
    lib = load()
    import torch
else:
    import torch
    lib = load()

if lib.ght_init() != 0:
    raise SystemExit("ght_init failed: " + lib.ght_last_error().decode())
alloc = torch.cuda.memory.CUDAPluggableAllocator(lib_path, "ght_torch_malloc", "ght_torch_free")
torch.cuda.memory.change_current_allocator(alloc)

g = torch.Generator().manual_seed(7)
a = torch.randn(256, 256, generator=g) + 0.5
b = torch.rand(256, 256, generator=g) - 0.25
c = (a.cuda() @ b.cuda()).relu_()
torch.cuda.synchronize()

class Placement(ctypes.Structure):
    _fields_ = [("tier", ctypes.c_int), ("tensor_class", ctypes.c_int),
                ("bytes", ctypes.c_size_t), ("region", ctypes.c_char_p), ("spilled", ctypes.c_int)]
p = Placement()
lib.ght_where.argtypes = [ctypes.c_void_p, ctypes.POINTER(Placement)]
if lib.ght_where(ctypes.c_void_p(c.data_ptr()), ctypes.byref(p)) != 0:
    raise SystemExit("the result is not a ghtier block: " + lib.ght_last_error().decode())
want = (a @ b).relu_()
err = (c.cpu() - want).abs().max().item()
if not err <= 1e-3:
    raise SystemExit(f"matmul differs from the CPU: max error {err:.3e}")
del c
torch.cuda.synchronize()
count = json.loads(lib.ght_stats_json())["all"]["count"]
if count < 3:
    raise SystemExit(f"ghtier served {count} allocations; expected at least 3 (a, b, c)")
print(f"ok: torch {torch.__version__}, {count} allocations through ghtier, max error {err:.1e}")
"""


def run_case(mode, lib):
    env = dict(os.environ, GHT_TORCH_TIER="hbm")
    r = subprocess.run([sys.executable, "-c", CHILD, mode, lib], capture_output=True, text=True,
                       env=env, timeout=600)
    last = (r.stdout.strip().splitlines() or [""])[-1]
    if r.returncode == 0 and last.startswith("ok"):
        return True, last
    if r.returncode < 0:
        why = f"killed by {signal.Signals(-r.returncode).name}"
    else:
        why = f"exit status {r.returncode}"
    tail = (r.stderr.strip() or r.stdout.strip()).splitlines()[-3:]
    return False, why + ("; " + " | ".join(tail) if tail else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "lib", "libghtier_alloc.so"))
    ap.add_argument("--full", help="also load this library (libghtier.so) before torch, for "
                                   "information only")
    args = ap.parse_args()
    if not os.path.exists(args.lib):
        print(f"FAIL: {args.lib} not found: build it first (cmake --build build --target "
              "ghtier_alloc)")
        return 2
    lib = os.path.abspath(args.lib)
    # The check itself imports torch after nothing: if that works and the cases below crash,
    # the crash is ghtier's.
    missing = missing_piece(lib)
    if missing:
        return skip_status("torch_import_order", missing)

    failed = 0
    cases = {"before": "loaded before", "before-global": "loaded with RTLD_GLOBAL before",
             "after": "loaded after"}
    for mode, what in cases.items():
        ok, detail = run_case(mode, lib)
        print(f"{'PASS' if ok else 'FAIL'}: {os.path.basename(lib)} {what} import torch: {detail}")
        failed += not ok
    if args.full:
        ok, detail = run_case("full-before", os.path.abspath(args.full))
        print(f"INFO: {os.path.basename(args.full)} loaded before import torch: "
              f"{'works' if ok else 'fails'}: {detail}")
    print("torch_import_order: " + ("all orders pass" if failed == 0 else f"{failed} FAILED"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
