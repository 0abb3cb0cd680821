#!/usr/bin/env python3
"""Place PyTorch's CUDA tensors through ghtier and check a matmul on them.

PyTorch loads build/lib/libghtier_alloc.so, ghtier's allocator library, as its CUDA allocator
(CUDAPluggableAllocator with ght_torch_malloc / ght_torch_free). That library needs only cudart,
libnuma and hwloc; libghtier.so (kernels, optimizer, trainer) would also bring cuBLAS, cuDNN, TBB
and an OpenMP runtime into PyTorch's process, which crashed torch's import (issue 12).
GHT_TORCH_TIER chooses where the tensors live:
  hbm   device memory from ghtier's stream-ordered pool
  host  host memory (mapped pinned, or coherent system memory on GH200) that CUDA kernels read
        over the link; the tensor's data pointer is that memory's device address
The product is compared with one computed on plain CUDA tensors in a separate process (the
allocator can only be changed before CUDA is initialised), ghtier's where() confirms the tier of
every tensor, and ghtier's statistics are printed. Exits non-zero on any mismatch. Without
PyTorch, a CUDA device or a CUDA build of ghtier it says which is missing and exits 0 (SKIP), or
1 where GHT_TEST_REQUIRE_GPU=1 (the GPU machine).

  python3 examples/torch_pluggable.py                      # both tiers, one process each
  GHT_TORCH_TIER=host python3 examples/torch_pluggable.py  # one tier
  options: --lib PATH (default build/lib/libghtier_alloc.so)  --n N (matrix size, default 2048)
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ght_torch_check import missing_piece, skip_status  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIERS = {"hbm": 0, "host": 1}


class Placement(ctypes.Structure):
    _fields_ = [("tier", ctypes.c_int), ("tensor_class", ctypes.c_int),
                ("bytes", ctypes.c_size_t), ("region", ctypes.c_char_p),
                ("spilled", ctypes.c_int)]


def inputs(n, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    # Random, non-zero, and not symmetric: a transposed or stale operand cannot pass.
    a = torch.randn(n, n, generator=g, dtype=torch.float32) + 0.5
    b = torch.rand(n, n, generator=g, dtype=torch.float32) - 0.25
    return a, b


def reference(args):
    """Child process: the product on plain CUDA tensors (PyTorch's own allocator)."""
    import torch
    a, b = inputs(args.n, args.seed)
    c = (a.cuda() @ b.cuda()).cpu()
    torch.save(c, args.reference)
    return 0


def run_one(args, tier):
    with tempfile.TemporaryDirectory() as tmp:
        ref_path = os.path.join(tmp, "ref.pt")
        child = subprocess.run([sys.executable, os.path.abspath(__file__), "--reference", ref_path,
                                "--n", str(args.n), "--seed", str(args.seed)])
        if child.returncode != 0:
            print("torch_pluggable: the reference process failed", file=sys.stderr)
            return 1

        import torch
        ght = ctypes.CDLL(args.lib)  # the same instance PyTorch loads below
        ght.ght_init.restype = ctypes.c_int
        ght.ght_last_error.restype = ctypes.c_char_p
        ght.ght_stats_json.restype = ctypes.c_char_p
        ght.ght_where.argtypes = [ctypes.c_void_p, ctypes.POINTER(Placement)]
        if ght.ght_init() != 0:
            print("torch_pluggable: ght_init failed:", ght.ght_last_error().decode(), file=sys.stderr)
            return 1
        allocator = torch.cuda.memory.CUDAPluggableAllocator(args.lib, "ght_torch_malloc",
                                                             "ght_torch_free")
        torch.cuda.memory.change_current_allocator(allocator)

        a_cpu, b_cpu = inputs(args.n, args.seed)
        a, b = a_cpu.cuda(), b_cpu.cuda()
        c = a @ b
        torch.cuda.synchronize()
        ok = True
        for name, t in (("a", a), ("b", b), ("c", c)):
            p = Placement()
            if ght.ght_where(ctypes.c_void_p(t.data_ptr()), ctypes.byref(p)) != 0:
                print(f"FAIL: tensor {name} is not a ghtier block: {ght.ght_last_error().decode()}")
                ok = False
                continue
            got = "hbm" if p.tier == 0 else "host"
            print(f"tensor {name}: {p.bytes} bytes on {got}, region {p.region.decode()}")
            if p.tier != TIERS[tier]:
                print(f"FAIL: tensor {name} is on {got}, GHT_TORCH_TIER={tier}")
                ok = False
        if tier == "host":
            # Host memory: the CPU reads the tensor's bytes where the GPU put them.
            raw = ctypes.string_at(c.data_ptr(), 16)
            if raw != c[0, :4].cpu().numpy().tobytes():
                print("FAIL: the host bytes of c differ from what the GPU wrote")
                ok = False
        ref = torch.load(ref_path)
        got = c.cpu()
        err = (got - ref).abs().max().item()
        scale = ref.abs().max().item()
        tol = 1e-5 * scale * (args.n ** 0.5)
        print(f"matmul {args.n}x{args.n}: max |ghtier - plain CUDA| = {err:.3e} "
              f"(tolerance {tol:.3e}, max |ref| {scale:.3e})")
        if not err <= tol:
            print("FAIL: the product differs from the plain-CUDA reference")
            ok = False
        del a, b, c
        torch.cuda.synchronize()
        stats = json.loads(ght.ght_stats_json().decode())
        print("ghtier statistics:")
        print(json.dumps({"tiers": stats["tiers"], "classes": {"other": stats["classes"]["other"]},
                          "spills": stats["spills"]}, indent=2))
        print(f"torch_pluggable [{tier}]: {'ok' if ok else 'FAILED'}")
        return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "lib", "libghtier_alloc.so"))
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--reference", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reference:
        return reference(args)
    if not os.path.exists(args.lib):
        print(f"torch_pluggable: {args.lib} not found: build it first "
              "(cmake --build build --target ghtier_alloc)", file=sys.stderr)
        return 2
    missing = missing_piece(args.lib)
    if missing:
        return skip_status("torch_pluggable", missing)
    tier = os.environ.get("GHT_TORCH_TIER")
    if tier:
        if tier not in TIERS:
            print(f"torch_pluggable: GHT_TORCH_TIER={tier} (expected hbm or host)", file=sys.stderr)
            return 2
        return run_one(args, tier)
    # Both tiers, each in a fresh process: the allocator is fixed once CUDA is initialised.
    status = 0
    for t in TIERS:
        env = dict(os.environ, GHT_TORCH_TIER=t)
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--lib", args.lib,
                            "--n", str(args.n), "--seed", str(args.seed)], env=env)
        status = status or r.returncode
    print("torch_pluggable: all tiers ok" if status == 0 else "torch_pluggable: FAILED")
    return status


if __name__ == "__main__":
    sys.exit(main())
