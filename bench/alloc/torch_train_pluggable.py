#!/usr/bin/env python3
"""A full PyTorch training loop through ghtier's pluggable allocator, against PyTorch's own.

The same small GPT (pre-norm blocks, causal SDPA attention, GELU MLP, bf16 autocast, AdamW) trains
on random tokens twice, each in a fresh process (the allocator is fixed once CUDA starts):
  caching  PyTorch's CUDA caching allocator
  ghtier   CUDAPluggableAllocator on build/lib/libghtier_alloc.so (ght_torch_malloc /
           ght_torch_free), tier GHT_TORCH_TIER (default hbm)
and reports for each: steps/s over the timed steps, model TFLOP/s, allocation requests per step,
peak bytes of live tensors (and, for the caching allocator, peak reserved), the final loss; then
the ratios ghtier / caching. The two numbers of the work: FLOPs per step = 6 * parameters * tokens
+ 12 * layers * d_model * seq * tokens (attention), printed with the result; the bytes an
allocator must move are none, so the ratio of steps/s is the allocator's cost.

Without PyTorch, a CUDA device or a CUDA build of the library it prints SKIP and exits 0 (1 where
GHT_TEST_REQUIRE_GPU=1).

  python3 bench/alloc/torch_train_pluggable.py [--lib build/lib/libghtier_alloc.so]
      [--layers 6 --d-model 768 --heads 12 --seq 512 --batch 8 --vocab 32768]
      [--warmup 5 --steps 30] [--json results.json]
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from ght_torch_check import missing_piece, skip_status  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_model(args):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, d, h):
            super().__init__()
            self.h = h
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d, bias=False)  # (d, 3d)
            self.proj = nn.Linear(d, d, bias=False)
            self.fc1 = nn.Linear(d, 4 * d, bias=False)
            self.fc2 = nn.Linear(4 * d, d, bias=False)

        def forward(self, x):  # x: (B, T, d)
            B, T, d = x.shape
            qkv = self.qkv(self.ln1(x)).view(B, T, 3, self.h, d // self.h)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, h, T, d/h)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, h, T, d/h)
            x = x + self.proj(a.transpose(1, 2).reshape(B, T, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(args.vocab, args.d_model)
            self.pos = nn.Embedding(args.seq, args.d_model)
            self.blocks = nn.ModuleList(Block(args.d_model, args.heads) for _ in range(args.layers))
            self.ln = nn.LayerNorm(args.d_model)
            self.head = nn.Linear(args.d_model, args.vocab, bias=False)

        def forward(self, idx):  # idx: (B, T) token ids
            x = self.emb(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for b in self.blocks:
                x = b(x)
            return self.head(self.ln(x))  # (B, T, vocab)

    return GPT()


def child(args):
    """One run; prints one JSON line."""
    import torch
    lib = None
    if args.child == "ghtier":
        lib = ctypes.CDLL(args.lib)
        lib.ght_init.restype = ctypes.c_int
        lib.ght_last_error.restype = ctypes.c_char_p
        lib.ght_stats_json.restype = ctypes.c_char_p
        if lib.ght_init() != 0:
            raise SystemExit("ght_init failed: " + lib.ght_last_error().decode())
        torch.cuda.memory.change_current_allocator(
            torch.cuda.memory.CUDAPluggableAllocator(args.lib, "ght_torch_malloc",
                                                     "ght_torch_free"))

    def alloc_count():
        if lib is not None:
            return json.loads(lib.ght_stats_json())["all"]["count"]
        return torch.cuda.memory_stats()["allocation.all.allocated"]

    torch.manual_seed(1234)
    model = build_model(args).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    params = sum(p.numel() for p in model.parameters())
    g = torch.Generator(device="cuda").manual_seed(5678)
    batches = [torch.randint(0, args.vocab, (args.batch, args.seq + 1), device="cuda", generator=g)
               for _ in range(4)]

    def step(i):
        tok = batches[i % len(batches)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tok[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, args.vocab),
                                                 tok[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    for i in range(args.warmup):
        step(i)
    torch.cuda.synchronize()
    count0 = alloc_count()
    t0 = time.perf_counter()
    for i in range(args.steps):
        loss = step(args.warmup + i)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    tokens = args.batch * args.seq
    flops = 6 * params * tokens + 12 * args.layers * args.d_model * args.seq * tokens
    out = {"allocator": args.child, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(), "params": params, "flops_per_step": flops,
           "steps": args.steps,
           "steps_per_s": args.steps / seconds, "tflops": flops * args.steps / seconds / 1e12,
           "allocs_per_step": (alloc_count() - count0) / args.steps, "final_loss": loss.item()}
    if lib is not None:
        s = json.loads(lib.ght_stats_json())
        out["peak_bytes"] = s["all"]["peak"]
        out["spills"] = s["spills"]
        out["tier"] = os.environ.get("GHT_TORCH_TIER", "hbm")
    else:
        out["peak_bytes"] = torch.cuda.max_memory_allocated()
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    print(json.dumps(out))
    return 0


def gib(b):
    return f"{b / 2**30:.2f} GiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "lib", "libghtier_alloc.so"))
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json", help="write both runs and the ratios here")
    ap.add_argument("--child", choices=["caching", "ghtier"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if not os.path.exists(args.lib):
        print(f"FAIL: {args.lib} not found: build it first (cmake --build build --target "
              "ghtier_alloc)")
        return 2
    args.lib = os.path.abspath(args.lib)
    missing = missing_piece(args.lib)
    if missing:
        return skip_status("torch_train_pluggable", missing)

    runs = {}
    for which in ("caching", "ghtier"):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", which, "--lib", args.lib]
        for k in ("layers", "d_model", "heads", "seq", "batch", "vocab", "warmup", "steps"):
            cmd += ["--" + k.replace("_", "-"), str(getattr(args, k))]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL: the {which} run exited with {r.returncode}:\n{r.stderr[-2000:]}")
            return 1
        runs[which] = json.loads(r.stdout.strip().splitlines()[-1])
    c, g = runs["caching"], runs["ghtier"]
    ratios = {"steps_per_s": g["steps_per_s"] / c["steps_per_s"],
              "allocs_per_step": g["allocs_per_step"] / max(c["allocs_per_step"], 1e-9),
              "peak_bytes": g["peak_bytes"] / max(c["peak_bytes"], 1)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {k: v for k, v in vars(args).items() if k not in ("child",)},
                       "runs": runs, "ratio_ghtier_to_caching": ratios}, f, indent=2)
    print(f"{c['device']}, torch {c['torch']}: GPT {c['params'] / 1e6:.1f}M parameters, "
          f"{args.layers} layers, d {args.d_model}, seq {args.seq}, batch {args.batch}; "
          f"{c['flops_per_step'] / 1e12:.2f} TFLOP per step (6*N*tokens + attention)")
    print(f"{'allocator':<10} {'steps/s':>9} {'TFLOP/s':>9} {'allocs/step':>12} "
          f"{'peak live':>11} {'peak reserved':>14} {'final loss':>11}")
    for name, r in runs.items():
        reserved = gib(r["peak_reserved_bytes"]) if "peak_reserved_bytes" in r else "-"
        print(f"{name:<10} {r['steps_per_s']:>9.2f} {r['tflops']:>9.1f} "
              f"{r['allocs_per_step']:>12.0f} {gib(r['peak_bytes']):>11} {reserved:>14} "
              f"{r['final_loss']:>11.4f}")
    print(f"{'ghtier/caching':<10} {ratios['steps_per_s']:>5.3f} steps/s, "
          f"{ratios['allocs_per_step']:.3f} allocs/step, "
          f"{ratios['peak_bytes']:.3f} peak live bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
