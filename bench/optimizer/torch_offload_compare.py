#!/usr/bin/env python3
"""Optimizer state offload for PyTorch, side by side on one model and batch (issue 42's target).

A residual MLP (LAYERS blocks of d -> 4d -> d, bf16 compute) whose fp32 AdamW state does not fit
in HBM next to its weights, gradients and activations, trained for a few steps by each
contender in its own process (so one's memory never counts against another):

  ghtier_gpu_link  ghtier.torch.AdamW(path="gpu_link"): bf16 parameters and gradients in HBM,
                   fp32 master/m/v in ghtier's pinned host memory, updated by ghtier's GPU kernel
                   over the link
  ghtier_gpu_link_bwd  the same, each parameter updated in backward as its gradient lands
                   (AdamW.step_in_backward), so the link traffic overlaps the backward
  ghtier_gpu_link_q8   the same with 8-bit m and v (state="q8"): an inexact choice, listed apart
  ghtier_cpu       ghtier.torch.AdamW(path="cpu"): the same state, updated by the host AdamW
  ghtier_cpu_bwd   the same in AdamW.step_in_backward: gradient copies on a copy stream and host
                   updates on a worker thread while the backward goes on
  torchao          torchao's CPUOffloadOptimizer(torch.optim.AdamW, fused CPU step): fp32
                   parameters in HBM under bf16 autocast, fp32 state on the host
  fsdp2            FSDP2 (fully_shard, one rank) with CPUOffloadPolicy and bf16 MixedPrecisionPolicy:
                   fp32 parameters and state on the host, torch.optim.AdamW on the CPU
  deepspeed        DeepSpeed ZeRO-2 with offload_optimizer=cpu (DeepSpeedCPUAdam), bf16, one rank
  torch_hbm        torch.optim.AdamW(fused) with everything in HBM: expected to run out of memory
                   (that is what makes this model need offloading); recorded as such

Each contender prints one JSON line (median step seconds after a warm-up step, tokens/s, peak
HBM, or the error that stopped it). The parent prints the table and each contender's ratio to
ghtier_gpu_link. Contenders whose package is missing are reported as "not installed".

  python3 bench/optimizer/torch_offload_compare.py [--layers 40] [--d 4096] [--tokens 8192]
      [--steps 4] [--only NAME,...] [--json OUT]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONTENDERS = ("ghtier_gpu_link", "ghtier_gpu_link_bwd", "ghtier_gpu_link_q8", "ghtier_cpu", "ghtier_cpu_bwd", "torchao",
              "fsdp2", "deepspeed", "torch_hbm")


def build_model(torch, layers, d, dtype, device):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(d, 4 * d, bias=False)
            self.down = torch.nn.Linear(4 * d, d, bias=False)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(x)))

    torch.manual_seed(0)
    with torch.device(device):
        model = torch.nn.Sequential(*[Block() for _ in range(layers)])
    return model.to(dtype)


def one_process(name, a):
    """Run one contender in this process; print its JSON line."""
    import torch

    dev = torch.device("cuda")
    steps_s = []
    autocast = name in ("torchao", "fsdp2", "torch_hbm")
    param_dtype = torch.bfloat16 if name.startswith("ghtier") else torch.float32
    x = torch.randn(a.tokens, a.d, device=dev, dtype=torch.bfloat16)

    def loss_of(model):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            return model(x).float().square().mean()

    if name.startswith("ghtier"):
        import ghtier.torch as gt
        model = build_model(torch, a.layers, a.d, param_dtype, dev)
        opt = gt.AdamW(model.parameters(), lr=1e-4, path="cpu" if name.startswith("ghtier_cpu") else "gpu_link",
                       state="q8" if name.endswith("_q8") else "fp32")
        if name.endswith("_bwd"):
            def step():
                with opt.step_in_backward():
                    loss_of(model).backward()
                opt.zero_grad(set_to_none=True)
        else:
            step = lambda: (loss_of(model).backward(), opt.step(), opt.zero_grad(set_to_none=True))
    elif name == "torchao":
        try:
            from torchao.optim import CPUOffloadOptimizer
        except ImportError:
            from torchao.prototype.low_bit_optim import CPUOffloadOptimizer
        model = build_model(torch, a.layers, a.d, param_dtype, dev)
        opt = CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-4, fused=True)
        step = lambda: (loss_of(model).backward(), opt.step(), opt.zero_grad())
    elif name == "fsdp2":
        import torch.distributed as dist
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("cpu:gloo,cuda:nccl", rank=0, world_size=1)
        model = build_model(torch, a.layers, a.d, param_dtype, "cpu")
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for blk in model:
            fully_shard(blk, offload_policy=CPUOffloadPolicy(), mp_policy=mp)
        fully_shard(model, offload_policy=CPUOffloadPolicy(), mp_policy=mp)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        step = lambda: (loss_of(model).backward(), opt.step(), opt.zero_grad())
    elif name == "deepspeed":
        import deepspeed
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29518")
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        cfg = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
               "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}},
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
        model = build_model(torch, a.layers, a.d, torch.float32, "cpu")
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        def step():
            loss = engine(x).float().square().mean()
            engine.backward(loss)
            engine.step()
    elif name == "torch_hbm":
        model = build_model(torch, a.layers, a.d, param_dtype, dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        step = lambda: (loss_of(model).backward(), opt.step(), opt.zero_grad(set_to_none=True))
    else:
        raise SystemExit(f"unknown contender {name!r} ({', '.join(CONTENDERS)})")

    params = sum(p.numel() for p in model.parameters())
    for i in range(a.steps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i > 0:  # the first step allocates the state
            steps_s.append(time.perf_counter() - t0)
        print(f"[{name}] step {i} {time.perf_counter() - t0:.3f} s", file=sys.stderr, flush=True)
    med = statistics.median(steps_s)
    print(json.dumps(dict(name=name, ok=True, params=params, tokens=a.tokens, step_s=med,
                          steps_s=steps_s, tok_s=a.tokens / med,
                          peak_hbm_gib=torch.cuda.max_memory_allocated() / 2**30)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--only", default=",".join(CONTENDERS))
    ap.add_argument("--timeout", type=float, default=300, help="seconds per contender")
    ap.add_argument("--json")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        return one_process(a.one, a)
    rows = []
    for name in a.only.split(","):
        cmd = [sys.executable, __file__, "--one", name, "--layers", str(a.layers), "--d", str(a.d),
               "--tokens", str(a.tokens), "--steps", str(a.steps)]
        t0 = time.time()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            out, err, rc = r.stdout, r.stderr, r.returncode
        except subprocess.TimeoutExpired as e:
            out, err, rc = e.stdout or "", (e.stderr or "") if isinstance(e.stderr, str) else "", "timeout"
        lines = [l for l in (out or "").splitlines() if l.startswith("{")]
        if lines:
            row = json.loads(lines[-1])
        else:
            tail = (err or "").strip().splitlines()[-3:]
            why = "not installed" if any("No module named" in l for l in tail) else " | ".join(tail)[-400:]
            row = dict(name=name, ok=False, rc=rc, error=why)
        row["wall_s"] = time.time() - t0
        print(json.dumps(row), flush=True)
        rows.append(row)
    ref = next((r for r in rows if r["name"] == "ghtier_gpu_link" and r["ok"]), None)
    print("\n| contender | params | step s | tok/s | peak HBM GiB | ghtier_gpu_link speed-up |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if r["ok"]:
            ratio = f"{r['step_s'] / ref['step_s']:.2f}x" if ref else "-"
            print(f"| {r['name']} | {r['params'] / 1e9:.2f}B | {r['step_s']:.3f} | {r['tok_s']:.0f} | "
                  f"{r['peak_hbm_gib']:.1f} | {ratio} |")
        else:
            print(f"| {r['name']} | - | failed: {r['error'][:160]} | - | - | - |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(layers=a.layers, d=a.d, tokens=a.tokens, steps=a.steps, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
