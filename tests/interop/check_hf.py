#!/usr/bin/env python3
"""Hugging Face interop check (runs where torch and transformers exist, e.g. the H200 machine).

1. `ght export --hf A --init small --seed 7` writes a randomly initialised `small` model.
2. transformers loads A as Qwen3MoeForCausalLM (fp32, eager attention) and computes logits on
   random tokens; `ght logits --hf A` computes our fp32 CPU-backend logits on the same tokens.
   The max relative error max|ours - hf| / max|hf| must be <= 1e-4.
3. `ght import --hf A --out RUN` then `ght export --hf B --ckpt <RUN's checkpoint>`; every tensor
   of B must be byte-equal to A's.

transformers is the independent reference; it is never a dependency of the library.
Usage: check_hf.py --ght build/bin/ght --work DIR [--preset small] [--tol 1e-4]
"""
import argparse
import glob
import json
import os
import subprocess
import sys

import numpy as np


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def load_safetensors_dir(d):
    from safetensors.numpy import load_file
    out = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        out.update(load_file(f))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ght", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    args = ap.parse_args()

    import torch
    from transformers import AutoConfig, Qwen3MoeForCausalLM

    os.makedirs(args.work, exist_ok=True)
    a = os.path.join(args.work, "export_a")
    b = os.path.join(args.work, "export_b")
    run_dir = os.path.join(args.work, "imported_run")
    run([args.ght, "export", "--hf", a, "--init", args.preset, "--seed", "7"])

    cfg = AutoConfig.from_pretrained(a)
    print("config:", cfg.model_type, "layers", cfg.num_hidden_layers, "experts", cfg.num_experts,
          "top-k", cfg.num_experts_per_tok, "vocab", cfg.vocab_size)
    model = Qwen3MoeForCausalLM.from_pretrained(a, torch_dtype=torch.float32,
                                                attn_implementation="eager")
    model.eval()
    rng = np.random.default_rng(11)
    tokens = rng.integers(0, cfg.vocab_size, size=(args.batch, args.seq), dtype=np.int32)
    tok_path = os.path.join(args.work, "tokens.bin")
    tokens.tofile(tok_path)
    with torch.no_grad():
        hf = model(torch.from_numpy(tokens.astype(np.int64))).logits.float().numpy()

    ours_path = os.path.join(args.work, "logits_ours.bin")
    run([args.ght, "logits", "--hf", a, "--tokens", tok_path, "--batch", str(args.batch),
         "--out", ours_path])
    ours = np.fromfile(ours_path, dtype=np.float32).reshape(hf.shape)
    err = float(np.max(np.abs(ours - hf)) / np.max(np.abs(hf)))
    print(f"logits: shape {hf.shape}, max|hf| {np.max(np.abs(hf)):.4f}, "
          f"max relative error {err:.3e} (tolerance {args.tol:g})")
    ok = err <= args.tol

    run([args.ght, "import", "--hf", a, "--out", run_dir])
    ckpts = sorted(glob.glob(os.path.join(run_dir, "ckpt_*")))
    if not ckpts:
        print("FAIL: import wrote no checkpoint under", run_dir)
        return 1
    run([args.ght, "export", "--hf", b, "--ckpt", ckpts[-1]])
    ta, tb = load_safetensors_dir(a), load_safetensors_dir(b)
    diff = [k for k in ta if k not in tb or ta[k].tobytes() != tb[k].tobytes()]
    extra = [k for k in tb if k not in ta]
    print(f"round trip: {len(ta)} tensors, {len(diff)} differ, {len(extra)} extra")
    if diff or extra:
        print("  differing:", diff[:5], "extra:", extra[:5])
        ok = False
    print(json.dumps({"logits_max_rel_err": err, "tolerance": args.tol,
                      "tensors": len(ta), "roundtrip_differ": len(diff) + len(extra)}))
    print("interop:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
