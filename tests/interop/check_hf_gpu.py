#!/usr/bin/env python3
"""Hugging Face parity of the CUDA backend (runs on the GPU machine, where torch and transformers exist).

1. `ght export --hf A --init small --seed 7` writes a randomly initialised `small` model.
2. `ght cuda-check --hf A --tokens T` runs our CUDA forward + backward (bf16 weights and
   activations, fp32 accumulation) on random tokens with HF's labels=input_ids convention, with
   the router aux and z coefficients set to 0 so that both sides optimise the same objective (HF's
   loss without output_router_logits is the cross-entropy alone). It writes the loss and the
   gradients of a few tensors.
3. transformers' Qwen3MoeForCausalLM computes the same loss
     - in bf16 on cuda (the reference the loss check uses: |ours - hf_bf16| / hf_bf16 <= 1e-2),
     - in fp32 on cuda with the weights rounded to bf16 (the same weights we use), with autograd:
       the gradient reference.
   Gradient check per tensor, both bounds set by the same rule, "within twice the error that
   HF's own bf16 run makes against the same fp32 reference":
     cosine(ours, ref) >= min(0.99, 1 - 2 x (1 - cosine(HF bf16, ref))), and
     rel_l2 = ||ours - ref|| / ||ref|| <= max(0.05, 2 x rel_l2(HF bf16, ref)).
   (The router gate's gradient is the noisiest in bf16: on the first H200 run HF's own bf16
   gradient had cosine 0.9898 against fp32, so a flat 0.99 would fail the reference itself.)
   Routing is top-k, so a token whose k-th and (k+1)-th router logits nearly tie may pick a
   different expert in bf16 than in fp32 on either side; that is why cosine is the primary check.

transformers is the independent reference; it is never a dependency of the library.
Usage: check_hf_gpu.py --ght build/bin/ght --work DIR [--preset small] [--batch 2] [--seq 128]
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

GRADS = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.1.mlp.gate.weight",
    "model.layers.0.mlp.experts.3.down_proj.weight",
    "model.norm.weight",
]


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def hf_grad(model, name):
    """The gradient of an HF-named tensor; handles transformers versions that fuse the experts
    into one 3-D parameter per layer (experts.gate_up_proj / experts.down_proj)."""
    params = dict(model.named_parameters())
    if name in params:
        return params[name].grad.float().cpu().numpy()
    parts = name.split(".")
    if ".mlp.experts." in name:
        e = int(parts[parts.index("experts") + 1])
        proj = parts[parts.index("experts") + 2]
        base = ".".join(parts[: parts.index("experts") + 1])
        cands = [base + "." + proj, base + "." + proj + ".weight"]
        if proj in ("gate_proj", "up_proj"):
            cands += [base + ".gate_up_proj", base + ".gate_up_proj.weight"]
        for c in cands:
            if c in params:
                g = params[c].grad.float().cpu().numpy()[e]
                return g, proj
    raise KeyError(f"no parameter {name} (nor a fused experts tensor) in the HF model")


def expert_slice(g, proj, shape):
    """Bring a slice of a fused experts gradient to our (out, in) shape."""
    out_dim, in_dim = shape
    if proj == "down_proj":
        return g if g.shape == (out_dim, in_dim) else g.T
    # gate_up fused: (2F, d) or (d, 2F); gate first, then up
    if g.shape[0] != 2 * out_dim:
        g = g.T
    return g[:out_dim] if proj == "gate_proj" else g[out_dim:]


def grad_of(model, name, shape):
    r = hf_grad(model, name)
    if isinstance(r, tuple):
        g, proj = r
        r = expert_slice(g, proj, shape)
    return np.asarray(r, dtype=np.float32).reshape(shape)


def compare(got, ref):
    got = got.astype(np.float64).ravel()
    ref = ref.astype(np.float64).ravel()
    rel = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
    cos = float(np.dot(got, ref) / max(np.linalg.norm(got) * np.linalg.norm(ref), 1e-30))
    return rel, cos


def hf_loss_and_grads(path, tokens, dtype, attn, round_to_bf16, want_grads):
    import torch
    from transformers import Qwen3MoeForCausalLM

    model = Qwen3MoeForCausalLM.from_pretrained(path, torch_dtype=dtype, attn_implementation=attn).cuda()
    if round_to_bf16:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(p.dtype))
    model.train()  # no dropout in Qwen3-MoE; train() only enables autograd bookkeeping
    ids = torch.from_numpy(tokens.astype(np.int64)).cuda()
    out = model(input_ids=ids, labels=ids, output_router_logits=False)
    loss = float(out.loss.float().item())
    grads = {}
    if want_grads:
        out.loss.backward()
        for name, shape in want_grads.items():
            grads[name] = grad_of(model, name, shape)
    del model
    torch.cuda.empty_cache()
    return loss, grads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ght", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--loss-tol", type=float, default=1e-2)
    args = ap.parse_args()

    import torch

    os.makedirs(args.work, exist_ok=True)
    a = os.path.join(args.work, "export")
    run([args.ght, "export", "--hf", a, "--init", args.preset, "--seed", "7"])
    with open(os.path.join(a, "config.json")) as f:
        cfg = json.load(f)
    rng = np.random.default_rng(13)
    tokens = rng.integers(0, cfg["vocab_size"], size=(args.batch, args.seq), dtype=np.int32)
    tok_path = os.path.join(args.work, "tokens.bin")
    tokens.tofile(tok_path)

    ours_dir = os.path.join(args.work, "ours")
    run([args.ght, "cuda-check", "--hf", a, "--tokens", tok_path, "--batch", str(args.batch), "--out", ours_dir,
         "--grads", ",".join(GRADS), "--aux-coef", "0", "--z-coef", "0", "--cpu"])
    with open(os.path.join(ours_dir, "result.json")) as f:
        ours = json.load(f)
    shapes = {n: tuple(ours["grads"][n]["shape"]) for n in GRADS}

    hf_bf16, g_bf16 = hf_loss_and_grads(a, tokens, torch.bfloat16, "sdpa", False, shapes)
    hf_fp32, g_ref = hf_loss_and_grads(a, tokens, torch.float32, "eager", True, shapes)

    ok = True
    ce = ours["loss"]["ce"]
    err_bf16 = abs(ce - hf_bf16) / abs(hf_bf16)
    err_fp32 = abs(ce - hf_fp32) / abs(hf_fp32)
    print(f"loss: ours (cuda, bf16) {ce:.6f} | HF bf16 {hf_bf16:.6f} (rel {err_bf16:.2e}, tol {args.loss_tol:g}) | "
          f"HF fp32 on bf16 weights {hf_fp32:.6f} (rel {err_fp32:.2e}) | ours cpu fp32 {ours['cpu_loss']['ce']:.6f}")
    ok &= err_bf16 <= args.loss_tol

    report = {"loss_ours": ce, "loss_hf_bf16": hf_bf16, "loss_hf_fp32": hf_fp32, "loss_rel_err_bf16": err_bf16,
              "grads": {}}
    for n in GRADS:
        got = np.fromfile(ours["grads"][n]["file"], dtype=np.float32).reshape(shapes[n])
        rel, cos = compare(got, g_ref[n])
        floor, floor_cos = compare(g_bf16[n], g_ref[n])
        tol = max(0.05, 2 * floor)
        cos_tol = min(0.99, 1 - 2 * (1 - floor_cos))
        good = cos >= cos_tol and rel <= tol
        ok &= good
        print(f"grad {n:48s} rel_l2 {rel:.3e} (tol {tol:.3e}) cosine {cos:.6f} (tol {cos_tol:.4f}) | HF bf16: rel_l2 {floor:.3e} "
              f"cosine {floor_cos:.6f} {'ok' if good else 'FAIL'}")
        report["grads"][n] = {"rel_l2": rel, "cosine": cos, "hf_bf16_rel_l2": floor, "hf_bf16_cosine": floor_cos,
                              "tol": tol, "cosine_tol": cos_tol, "ok": good}
    report["pass"] = bool(ok)
    print(json.dumps(report))
    print("hf gpu parity:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
