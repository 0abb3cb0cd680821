#!/usr/bin/env python3
"""Train a small model with ghtier.torch.AdamW: fp32 master weights, m and v in host memory
(or HBM with --path device), the update run by ghtier's GPU kernel over the link (CUDA
parameters, the default path) or by its host AdamW (--path cpu, and on machines without a GPU).

The model is a tiny transformers Qwen3MoeForCausalLM (2 layers, 4 experts) when transformers is
installed, else an nn.Sequential MLP. It learns a repeating token sequence; the script prints
the loss, the optimizer state ghtier holds (memory_stats) and a checkpoint round trip through
torch.optim.AdamW's format, and exits 1 if the loss did not fall. On a GPU the parameters live
in HBM and, where ghtier was built with CUDA, PyTorch's CUDA tensors come from ghtier's
allocator (use_allocator); on a CPU-only machine everything runs on the host.

  pip install .   # from the repository root (or scripts/test-python.sh)
  python3 examples/torch_offload_adamw.py [--steps 30] [--state fp32|bf16|q8] [--cpu]
      [--path auto|cpu|gpu_link|device] [--in-backward]
"""
import argparse
import io
import sys

import torch

import ghtier
import ghtier.torch as gt

VOCAB, SEQ, BATCH = 128, 32, 8


def make_model(device):
    try:
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    except ImportError:
        model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 64), torch.nn.Linear(64, 128),
                                    torch.nn.GELU(), torch.nn.Linear(128, VOCAB))
        return model.to(device), "nn.Sequential (transformers is not installed)"
    cfg = Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                         moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=SEQ, decoder_sparse_step=1)
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(cfg).to(device), "transformers Qwen3MoeForCausalLM (tiny)"


def loss_of(model, tokens):
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    out = model(inputs)
    logits = out.logits if hasattr(out, "logits") else out
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--state", default="fp32", choices=["fp32", "bf16", "q8"])
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU exists")
    ap.add_argument("--path", default="auto", choices=["auto", "cpu", "gpu_link", "device"])
    ap.add_argument("--in-backward", action="store_true",
                    help="update each parameter as its gradient lands (AdamW.step_in_backward; no clipping)")
    args = ap.parse_args()

    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    if device == "cuda" and ghtier.core().has_cuda:
        gt.use_allocator()  # before the first CUDA tensor
    torch.manual_seed(0)
    model, what = make_model(device)
    clip = {} if args.in_backward else dict(max_grad_norm=1.0, skip_nonfinite=True)
    opt = gt.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, state=args.state,
                   path=args.path, **clip)
    pattern = torch.arange(SEQ + 1) * 7 % VOCAB  # a sequence to learn
    tokens = torch.stack([pattern.roll(i) for i in range(BATCH)]).to(device)
    print(f"model: {what}, {sum(p.numel() for p in model.parameters())} parameters on {device}; "
          f"ghtier {ghtier.__version__}, AdamW state {args.state} in "
          f"{'HBM' if opt.path == 'device' else 'host memory'}, path {opt.path}, "
          f"allocator {'ghtier' if gt.allocator_in_use() else 'PyTorch'}")

    losses = []
    for step in range(args.steps):
        loss = loss_of(model, tokens)
        if args.in_backward:
            with opt.step_in_backward():
                loss.backward()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 10 == 0 or step == args.steps - 1:
            norm = opt.last_step["grad_norm"]
            print(f"step {step:3d}  loss {losses[-1]:.4f}" + (f"  grad norm {norm:.3f}" if norm is not None else ""))

    stats = gt.memory_stats()
    held = {c: stats["classes"][c]["current"] for c in ("master", "adam_m", "adam_v")}
    print("optimizer state held by ghtier (bytes):", held,
          "host tier current:", stats["tiers"]["host"]["current"])

    # The checkpoint is torch.optim.AdamW's format: it loads into torch's optimizer.
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    ref = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ref.load_state_dict(torch.load(buf))
    print(f"checkpoint: {len(ref.state)} parameter states loaded into torch.optim.AdamW")

    if not losses[-1] < losses[0]:
        print(f"FAIL: the loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})")
        return 1
    print(f"ok: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
