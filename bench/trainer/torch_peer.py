#!/usr/bin/env python3
"""The PyTorch peer of `ght train`: the same Qwen3-MoE model, trained the way a PyTorch user would.

Bench code only (issue 13); it never goes in the library. The model is ghtier's (trainer/model.hpp,
trainer/model.cpp): embedding; per layer RMSNorm -> GQA attention with per-head QK-RMSNorm and RoPE
(rotate_half) -> residual -> RMSNorm -> MoE (fp32 router softmax, top-k, renormalised when
norm_topk_prob, SwiGLU experts) -> residual; final RMSNorm; LM head (tied or untied). Loss =
mean CE + aux_loss_coef * sum_l aux_l + z_loss_coef * sum_l z_l, with ghtier's per-layer aux
(E * sum_e (c_e/N) * P_e) and z (mean_t logsumexp(router logits)^2). Parameter shapes match
ghtier's tensor for tensor, except that each layer's experts are stacked ((E, 2F, d) gate|up and
(E, d, F) down, the same numbers of parameters), so the parameter count equals
ModelConfig::total_params().

How it runs (the PyTorch idiom the bench compares against):
  - fp32 parameters, bf16 autocast (CUDA); the router logits and softmax in fp32;
  - experts through torch._grouped_mm (2-D tokens x 3-D weights, int32 group ends), checked
    against a per-expert loop at start; where it is missing or fails, a per-expert loop with a
    printed note (recorded in the JSON as "experts");
  - attention through F.scaled_dot_product_attention(is_causal=True) with enable_gqa, the math
    backend disabled so that a slow fallback fails instead of hiding (repeat_interleave of k/v
    where enable_gqa is unsupported, noted);
  - torch.optim.AdamW(fused=True) with ghtier's hyperparameters (no weight decay on norms),
    clip_grad_norm_(max_grad_norm) as ghtier does, constant lr;
  - modes: eager, and compile (torch.compile(model), default mode).
Tokens are random ids; a step is grad_accum micro-batches of micro_batch x seq_len tokens, as in
ght. Warm-up steps (the compile happens there) are excluded; the timed steps are measured with CUDA
events, and tokens/s is tokens_per_step / median step time (ght: the median of its profile steps
after the first).

The configuration is ght's own resolved JSON, one source of truth:
  ght train --config configs/bench-h200.toml -o model.layers=4 --print-config > cfg.json
  python3 bench/trainer/torch_peer.py --config-json cfg.json --modes eager,compile --name bench4l
Output: one JSON line per (shape, mode) on stdout, prefixed "PEER_JSON " (also appended to --json
FILE): name, mode, tokens_per_s, step_ms (median), strict and Megatron MFU, peak memory, compile
(first warm-up step) seconds, first/last loss; an out-of-memory or other failure is reported as
{"error": ..., "oom": true|false} and the next mode still runs.

CPU debugging (fp32, no autocast, tiny shapes only):
  ght train --model tiny --print-config > tiny.json
  python3 bench/trainer/torch_peer.py --config-json tiny.json --device cpu --modes eager \
      --warmup 1 --steps 30 --same-batch --lr 3e-3
Its "loss_first" / "loss_last" show that forward, backward and the optimizer work. The same math as
ght's, checked on the CPU against ght's fp32 reference logits:
  ght export --hf DIR --init tiny --seed 7
  python3 bench/trainer/torch_peer.py --config-json tiny.json --parity-hf DIR --ght build/bin/ght
and its CE, aux, grad norm and one AdamW update against ght's CPU backend (two steps on one batch):
  python3 bench/trainer/torch_peer.py --config-json tiny.json --parity-train WORK_DIR --ght build/bin/ght
Measured on the CPU (torch 2.15): logits 4e-7 (tiny), 7e-7 (small), 5e-7 (untied); training step
<= 5e-7 relative on every compared number (tiny, small).
"""
import argparse
import gc
import json
import math
import os
import statistics
import sys
import time

PEAK_FLOPS = 989.4e12  # dense bf16 peak of an H100/H200 SXM (DESIGN.md), as ght's MFU


def flops_per_token(m):
    """ModelConfig::flops_per_token(): 6 * N_active_nonembedding + 12 * L * H * head_dim * T."""
    return 6.0 * active_nonembedding_params(m) + 12.0 * m["layers"] * m["heads"] * m["head_dim"] * m["seq_len"]


def layer_dense_params(m):
    d, q, kv = m["d_model"], m["heads"] * m["head_dim"], m["kv_heads"] * m["head_dim"]
    return d * q + 2 * d * kv + q * d + 2 * m["head_dim"] + d * m["experts"] + 2 * d


def expert_params(m):
    return 3 * m["d_model"] * m["expert_ffn"]


def embedding_params(m):
    e = m["vocab"] * m["d_model"]
    return e if m["tied_embeddings"] else 2 * e


def total_params(m):
    return embedding_params(m) + m["layers"] * (layer_dense_params(m) + m["experts"] * expert_params(m)) + m["d_model"]


def active_nonembedding_params(m):
    return m["layers"] * (layer_dense_params(m) + m["top_k"] * expert_params(m)) + m["d_model"]


def active_params(m):
    return embedding_params(m) + active_nonembedding_params(m)


def megatron_flops_per_token(m):
    """Strict FLOPs plus the LM head, 6 * V * d (Megatron's convention)."""
    return flops_per_token(m) + 6.0 * m["vocab"] * m["d_model"]


def seed_flops_per_token(m):
    """ModelConfig::seed_flops_per_token(), the seed's count: 6 * N_active (embeddings included)
    + 12 * L * T * d_model."""
    return 6.0 * active_params(m) + 12.0 * m["layers"] * m["seq_len"] * m["d_model"]


def tokens_per_step(m):
    return m["seq_len"] * m["micro_batch"] * m["grad_accum"]


# ---- the model ---------------------------------------------------------------------------------

def build(torch, cfg, device, notes):
    import torch.nn as nn
    import torch.nn.functional as F

    m = cfg["model"]
    d, H, KV, D = m["d_model"], m["heads"], m["kv_heads"], m["head_dim"]
    E, K, Fh, V, L = m["experts"], m["top_k"], m["expert_ffn"], m["vocab"], m["layers"]
    eps, theta = float(m["rms_eps"]), float(m["rope_theta"])
    # compute dtype: bf16 under autocast on CUDA (and on the CPU with --cpu-bf16, to debug that path)
    cdt = torch.bfloat16 if device.type == "cuda" or cfg.get("cpu_bf16") else torch.float32
    use_grouped = cfg.get("experts", "auto") != "loop" and probe_grouped_mm(torch, device, cdt, notes)
    if cfg.get("experts") == "loop":
        notes.append("--experts loop: per-expert loop")
    use_gqa = probe_sdpa_gqa(torch, device, cdt, notes)

    def rms(x, w):
        return F.rms_norm(x.float(), (x.shape[-1],), w, eps)

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def experts_forward(xp, w, offs):  # xp (M, in) cdt; w (E, out, in) fp32; offs (E) int32 ends
        wt = w.to(cdt).transpose(-2, -1)  # (E, in, out), the layout grouped_mm wants
        if use_grouped:
            return torch._grouped_mm(xp, wt, offs=offs)
        ends = offs.tolist()  # host sync; the fallback only
        outs, start = [], 0
        for e, end in enumerate(ends):
            outs.append(xp[start:end] @ wt[e])
            start = end
        return torch.cat(outs, dim=0)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.Parameter(torch.ones(d))
            self.wq = nn.Parameter(torch.empty(H * D, d))
            self.wk = nn.Parameter(torch.empty(KV * D, d))
            self.wv = nn.Parameter(torch.empty(KV * D, d))
            self.wo = nn.Parameter(torch.empty(d, H * D))
            self.q_norm = nn.Parameter(torch.ones(D))
            self.k_norm = nn.Parameter(torch.ones(D))
            self.ln2 = nn.Parameter(torch.ones(d))
            self.router = nn.Parameter(torch.empty(E, d))
            self.w_gate_up = nn.Parameter(torch.empty(E, 2 * Fh, d))  # rows [0, F) gate, [F, 2F) up
            self.w_down = nn.Parameter(torch.empty(E, d, Fh))

        def forward(self, h, cos, sin):  # h (B, T, d) fp32 residual stream
            B, T, _ = h.shape
            x = rms(h, self.ln1)
            q = F.linear(x, self.wq).view(B, T, H, D)
            k = F.linear(x, self.wk).view(B, T, KV, D)
            v = F.linear(x, self.wv).view(B, T, KV, D).transpose(1, 2)
            q = rms(q, self.q_norm).transpose(1, 2)  # (B, H, T, D) fp32
            k = rms(k, self.k_norm).transpose(1, 2)
            q = (q * cos + rotate_half(q) * sin).to(v.dtype)
            k = (k * cos + rotate_half(k) * sin).to(v.dtype)
            if use_gqa:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=(KV != H))
            else:
                k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + F.linear(a.transpose(1, 2).reshape(B, T, H * D), self.wo)
            y, aux, z = self.moe(rms(h, self.ln2).view(B * T, d))
            return h + y.view(B, T, d), aux, z

        def moe(self, x):  # x (N, d) fp32
            N = x.shape[0]
            with torch.autocast(device_type=device.type, enabled=False):
                logits = F.linear(x, self.router)  # (N, E) fp32
            probs = torch.softmax(logits, dim=-1)
            top_w, top_i = torch.topk(probs, K, dim=-1)  # descending
            if m["norm_topk_prob"]:
                top_w = top_w / top_w.sum(dim=-1, keepdim=True)
            flat = top_i.reshape(-1)  # (N*K)
            counts = torch.zeros(E, dtype=torch.int32, device=x.device).scatter_add_(
                0, flat, torch.ones_like(flat, dtype=torch.int32))
            aux = E * torch.sum((counts.float() / N) * probs.mean(dim=0))  # uniform routing: K
            z = torch.logsumexp(logits, dim=-1).square().mean()
            order = torch.argsort(flat, stable=True)  # rows grouped by expert
            offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
            token = order // K
            xp = x.to(cdt)[token]  # (N*K, d)
            gu = experts_forward(xp, self.w_gate_up, offs)  # (N*K, 2F)
            act = F.silu(gu[:, :Fh]) * gu[:, Fh:]
            yp = experts_forward(act, self.w_down, offs)  # (N*K, d), expert order
            inv = torch.empty_like(order)
            inv[order] = torch.arange(order.numel(), device=order.device)
            y = yp[inv].view(N, K, d)  # token order
            out = torch.bmm(top_w.to(y.dtype).unsqueeze(1), y).squeeze(1)  # (N, d)
            return out, aux, z

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Parameter(torch.empty(V, d))
            self.layers = nn.ModuleList(Layer() for _ in range(L))
            self.norm = nn.Parameter(torch.ones(d))
            self.head = None if m["tied_embeddings"] else nn.Parameter(torch.empty(V, d))
            inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
            fr = torch.outer(torch.arange(m["seq_len"], dtype=torch.float64), inv_freq)
            emb = torch.cat((fr, fr), dim=-1)
            self.register_buffer("cos", emb.cos().float(), persistent=False)  # (T, D)
            self.register_buffer("sin", emb.sin().float(), persistent=False)

        def logits(self, tokens):  # (B, T) int64 -> (B, T, V) logits, summed router aux and z
            T = tokens.shape[1]
            cos, sin = self.cos[:T], self.sin[:T]
            h = F.embedding(tokens, self.embed)
            aux = z = 0.0
            for layer in self.layers:
                h, a, zz = layer(h, cos, sin)
                aux, z = aux + a, z + zz
            x = rms(h, self.norm)
            return F.linear(x, self.embed if self.head is None else self.head), aux, z

        def forward(self, tokens, targets):  # (B, T) int64 each
            logits, aux, z = self.logits(tokens)
            ce = F.cross_entropy(logits.float().view(-1, V), targets.reshape(-1))
            return ce + m["aux_loss_coef"] * aux + m["z_loss_coef"] * z, ce

    with torch.device(device):
        model = Model()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)  # ghtier's init: N(0, 0.02) matrices, ones for norms
    n = sum(p.numel() for p in model.parameters())
    if n != total_params(m):
        raise RuntimeError(f"peer has {n} parameters, ModelConfig::total_params() says {total_params(m)}")
    return model, cdt


def probe_grouped_mm(torch, device, cdt, notes):
    """torch._grouped_mm where it exists and agrees with a per-expert loop (uneven groups, an
    empty one, and its backward); else the loop, with a note."""
    if not hasattr(torch, "_grouped_mm"):
        notes.append("torch._grouped_mm missing in torch " + torch.__version__ + ": per-expert loop")
        return False
    try:
        g = torch.Generator(device="cpu").manual_seed(0)
        sizes = [16, 0, 40, 8]
        a = torch.randn(sum(sizes), 32, generator=g).to(device, cdt).requires_grad_()
        w = torch.randn(4, 48, 32, generator=g).to(device, cdt).requires_grad_()
        offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
        y = torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
        y.float().square().sum().backward()
        ga, gw = a.grad.clone(), w.grad.clone()
        a.grad = w.grad = None
        ref, s = [], 0
        for e, n in enumerate(sizes):
            ref.append(a[s:s + n] @ w[e].t())
            s += n
        ref = torch.cat(ref)
        ref.float().square().sum().backward()
        tol = 2e-2 if cdt != torch.float32 else 1e-4
        for got, want in ((y, ref), (ga, a.grad), (gw, w.grad)):
            err = (got.float() - want.float()).abs().max().item()
            if err > tol * (1 + want.float().abs().max().item()):
                raise RuntimeError(f"differs from the loop by {err:.3g}")
        return True
    except Exception as e:  # noqa: BLE001 (any failure means the fallback)
        notes.append(f"torch._grouped_mm unusable here ({type(e).__name__}: {str(e)[:200]}): per-expert loop")
        return False


def probe_sdpa_gqa(torch, device, cdt, notes):
    import torch.nn.functional as F
    try:
        q = torch.randn(1, 4, 16, 64, device=device, dtype=cdt)
        kv = torch.randn(1, 2, 16, 64, device=device, dtype=cdt)
        F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        return True
    except Exception as e:  # noqa: BLE001
        notes.append(f"SDPA enable_gqa unusable ({type(e).__name__}: {str(e)[:160]}): k/v repeat_interleave")
        return False


# ---- one run -----------------------------------------------------------------------------------

def run_mode(torch, cfg, mode, args, device, notes):
    m, o = cfg["model"], cfg["optimizer"]
    rec = {"name": args.name, "mode": mode, "device": str(device), "torch": torch.__version__,
           "tokens_per_step": tokens_per_step(m), "params_total": total_params(m),
           "params_active": active_params(m), "flops_per_token": flops_per_token(m),
           "megatron_flops_per_token": megatron_flops_per_token(m), "seed_flops_per_token": seed_flops_per_token(m)}
    model = opt = None
    try:
        torch.manual_seed(args.seed)
        gc.collect()  # the previous mode's model, optimizer and compiled graphs
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        model, cdt = build(torch, cfg, device, notes)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        lr = args.lr if args.lr is not None else float(cfg["schedule"]["lr"])
        kw = {"fused": True} if device.type == "cuda" else {}
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": float(o["weight_decay"])},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=lr,
                                betas=(float(o["beta1"]), float(o["beta2"])), eps=float(o["eps"]), **kw)
        step_fn = torch.compile(model) if mode == "compile" else model
        B, T, A = m["micro_batch"], m["seq_len"], m["grad_accum"]
        g = torch.Generator(device=device).manual_seed(args.seed)
        n_batches = A if args.same_batch else A * (args.warmup + args.steps)
        data = torch.randint(0, m["vocab"], (n_batches, B, T + 1), device=device, generator=g)
        max_norm = float(o["max_grad_norm"])

        def step(i):
            for a in range(A):
                b = data[(i * A + a) % n_batches]
                with torch.autocast(device_type=device.type, dtype=cdt, enabled=(cdt != torch.float32)):
                    loss, ce = step_fn(b[:, :-1], b[:, 1:])
                (loss / A).backward()
            if max_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=device.type == "cuda")
            opt.step()
            opt.zero_grad(set_to_none=True)
            return ce.detach()

        losses, t0 = [], time.perf_counter()
        for i in range(args.warmup):
            losses.append(step(i))
            if i == 0:
                sync(torch, device)
                rec["first_step_s"] = time.perf_counter() - t0  # includes the compile in compile mode
        sync(torch, device)
        rec["warmup_s"] = time.perf_counter() - t0
        times = []
        for i in range(args.warmup, args.warmup + args.steps):
            if device.type == "cuda":
                ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                ev0.record()
                losses.append(step(i))
                ev1.record()
                times.append((ev0, ev1))
            else:
                t = time.perf_counter()
                losses.append(step(i))
                times.append(time.perf_counter() - t)
        sync(torch, device)
        ms = [a.elapsed_time(b) for a, b in times] if device.type == "cuda" else [1e3 * t for t in times]
        med = statistics.median(ms)
        tps = tokens_per_step(m) / (med / 1e3)
        lv = [float(x) for x in torch.stack(losses).cpu()]
        rec.update({"step_ms": med, "step_ms_all": ms, "tokens_per_s": tps,
                    "mfu": tps * flops_per_token(m) / PEAK_FLOPS,
                    "mfu_megatron": tps * megatron_flops_per_token(m) / PEAK_FLOPS,
                    "mfu_seed": tps * seed_flops_per_token(m) / PEAK_FLOPS,
                    "loss_first": lv[0], "loss_last": lv[-1], "finite": all(math.isfinite(x) for x in lv)})
        if device.type == "cuda":
            rec["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
            rec["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    except Exception as e:  # noqa: BLE001: an OOM or a compile failure is a result, not a crash
        msg = f"{type(e).__name__}: {e}"
        rec["error"] = msg[:2000]
        rec["oom"] = "out of memory" in msg.lower() or "OutOfMemory" in type(e).__name__
        if device.type == "cuda":
            rec["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    finally:
        rec["notes"] = sorted(set(notes))
        del model, opt
        gc.collect()
        if mode == "compile":
            torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    rec["experts"] = "loop" if any("per-expert loop" in n for n in notes) else "grouped_mm"
    return rec


def load_hf(torch, model, hf_dir, m):
    """Weights of a Hugging Face Qwen3-MoE directory (`ght export --hf`) into the peer, by name."""
    import glob
    import struct
    dt = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    tensors = {}
    for path in sorted(glob.glob(os.path.join(hf_dir, "*.safetensors"))):
        raw = open(path, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        for name, h in header.items():
            if name == "__metadata__":
                continue
            a, b = h["data_offsets"]
            t = torch.frombuffer(bytearray(raw[8 + n + a:8 + n + b]), dtype=dt[h["dtype"]])
            tensors[name] = t.reshape(h["shape"]).float()
    F_ = m["expert_ffn"]
    with torch.no_grad():
        def put(dst, name):
            dst.copy_(tensors.pop(name))
        put(model.embed, "model.embed_tokens.weight")
        for i, lay in enumerate(model.layers):
            p = f"model.layers.{i}."
            for ours, theirs in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj"), ("wo", "o_proj"),
                                 ("q_norm", "q_norm"), ("k_norm", "k_norm")):
                put(getattr(lay, ours), p + f"self_attn.{theirs}.weight")
            put(lay.ln1, p + "input_layernorm.weight")
            put(lay.ln2, p + "post_attention_layernorm.weight")
            put(lay.router, p + "mlp.gate.weight")
            for e in range(m["experts"]):
                q = p + f"mlp.experts.{e}."
                put(lay.w_gate_up[e, :F_], q + "gate_proj.weight")
                put(lay.w_gate_up[e, F_:], q + "up_proj.weight")
                put(lay.w_down[e], q + "down_proj.weight")
        put(model.norm, "model.norm.weight")
        if model.head is not None:
            put(model.head, "lm_head.weight")
    tensors.pop("lm_head.weight", None)  # a tied export may still write it
    if tensors:
        raise RuntimeError(f"{hf_dir}: tensors the peer has no place for: {sorted(tensors)[:5]}")


def parity(torch, cfg, args):
    """The peer's fp32 CPU logits against ght's (`ght logits`) on one exported model: the same
    math, tensor for tensor. Exit status 0 when max|peer - ght| / max|ght| <= --tol."""
    import subprocess
    m = cfg["model"]
    device = torch.device(args.device)
    notes = []
    model, cdt = build(torch, cfg, device, notes)
    load_hf(torch, model, args.parity_hf, m)
    B, T = 2, min(64, m["seq_len"])
    g = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(0, m["vocab"], (B, T), generator=g, dtype=torch.int32)
    tok_path = os.path.join(args.parity_hf, "peer_tokens.bin")
    out_path = os.path.join(args.parity_hf, "ght_logits.bin")
    tokens.numpy().tofile(tok_path)
    subprocess.run([args.ght, "logits", "--hf", args.parity_hf, "--tokens", tok_path, "--batch", str(B),
                    "--out", out_path], check=True, stdout=subprocess.DEVNULL)
    theirs = torch.frombuffer(bytearray(open(out_path, "rb").read()), dtype=torch.float32).view(B, T, m["vocab"])
    with torch.no_grad(), torch.autocast(device_type=device.type, dtype=cdt, enabled=cdt != torch.float32):
        ours, aux, z = model.logits(tokens.long().to(device))
    err = ((ours.float().cpu() - theirs).abs().max() / theirs.abs().max()).item()
    ok = err <= args.tol
    print(json.dumps({"parity_max_rel_err": err, "tolerance": args.tol, "device": str(device),
                      "dtype": str(cdt), "aux": float(aux), "z": float(z), "notes": notes, "pass": ok}))
    return 0 if ok else 1


def parity_train(torch, cfg, args):
    """Loss terms, gradients and the AdamW update against ght's fp32 CPU backend: ght trains two
    steps on a shard that holds exactly one micro-batch of windows (so both steps see the same
    tokens, in an order that does not change the loss), from the weights `ght export --init` gives
    the same seed; the peer does the same from those weights with ght's logged step-1 lr. Compares
    step 1's CE, aux and grad norm and step 2's CE (after one update)."""
    import subprocess
    m, work = cfg["model"], args.parity_train
    B, T = m["micro_batch"], m["seq_len"]
    if m["grad_accum"] != 1:
        raise SystemExit("--parity-train needs grad_accum = 1")
    os.makedirs(work, exist_ok=True)
    hf, data, run = (os.path.join(work, x) for x in ("hf", "data", "run"))
    n = B * T + 1  # exactly B windows of T + 1 tokens (stride T)
    g = torch.Generator().manual_seed(args.seed)
    toks = torch.randint(1, m["vocab"], (2 * n,), generator=g, dtype=torch.int32)  # no EOT (0): no doc masks
    toks.numpy().astype("uint32").tofile(os.path.join(work, "tokens.u32"))
    preset = cfg["model"]["name"]
    run_q = {"stdout": subprocess.DEVNULL, "check": True}
    subprocess.run([args.ght, "prep", "--from-tokens", os.path.join(work, "tokens.u32"), "--dtype", "uint32",
                    "--vocab", str(m["vocab"]), "--out", data, "--val-fraction", "0.5", "--overwrite", "--quiet"], **run_q)
    subprocess.run([args.ght, "export", "--hf", hf, "--init", preset, "--seed", str(cfg["train"]["seed"])], **run_q)
    subprocess.run([args.ght, "train", "--model", preset, "--data", data, "--out", run, "--overwrite", "--steps", "2",
                    "--backend", "cpu", "-o", "train.log_every=1", "-o", "train.eval_every=0"], **run_q,
                   env=dict(os.environ, GHT_SAVE_CHECKPOINTS="off"))
    steps = [json.loads(ln) for ln in open(os.path.join(run, "log.jsonl")) if '"type":"step"' in ln]
    model, _ = build(torch, cfg, torch.device("cpu"), [])
    load_hf(torch, model, hf, m)
    o = cfg["optimizer"]
    opt = torch.optim.AdamW([{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": o["weight_decay"]},
                             {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}],
                            lr=steps[0]["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    w = toks[:n].long()
    x = torch.stack([w[b * T:b * T + T] for b in range(B)])
    y = torch.stack([w[b * T + 1:b * T + T + 1] for b in range(B)])
    logits, aux, z = model.logits(x)
    ce = torch.nn.functional.cross_entropy(logits.view(-1, m["vocab"]), y.reshape(-1))
    (ce + m["aux_loss_coef"] * aux + m["z_loss_coef"] * z).backward()
    gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), o["max_grad_norm"]))
    opt.step()
    with torch.no_grad():
        logits2, _, _ = model.logits(x)
        ce2 = float(torch.nn.functional.cross_entropy(logits2.view(-1, m["vocab"]), y.reshape(-1)))
    got = {"ce1": ce.item(), "aux1": float(aux.detach()), "gnorm1": gnorm, "ce2": ce2}
    want = {"ce1": steps[0]["loss"], "aux1": steps[0]["aux_loss"], "gnorm1": steps[0]["grad_norm"], "ce2": steps[1]["loss"]}
    rel = {k: abs(got[k] - want[k]) / max(abs(want[k]), 1e-12) for k in got}
    ok = all(v <= args.tol for v in rel.values())
    print(json.dumps({"peer": got, "ght": want, "rel_err": rel, "tolerance": args.tol, "pass": ok}))
    return 0 if ok else 1


def sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config-json", required=True, help="ght's resolved configuration (ght train ... --print-config)")
    ap.add_argument("--name", default="", help="shape name recorded in the JSON")
    ap.add_argument("--modes", default="eager,compile", help="comma-separated: eager, compile")
    ap.add_argument("--device", default="cuda", help="cuda (bf16 autocast) or cpu (fp32; debugging, tiny shapes)")
    ap.add_argument("--warmup", type=int, default=2, help="steps run before timing (the compile happens in the first)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--lr", type=float, default=None, help="default: the config's schedule.lr (constant)")
    ap.add_argument("--same-batch", action="store_true", help="reuse one step's batches (the CPU learning check)")
    ap.add_argument("--cpu-bf16", action="store_true", help="--device cpu: bf16 autocast as on CUDA (debugging)")
    ap.add_argument("--experts", default="auto", help="auto (torch._grouped_mm when it works) or loop")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--json", default="", help="also append each record to this JSONL file")
    ap.add_argument("--parity-hf", default="", help="instead of training: compare the peer's logits (fp32 on the "
                    "CPU, bf16 autocast with --device cuda) with `ght logits` (fp32) on this `ght export --hf` directory "
                    "(its config must be --config-json's)")
    ap.add_argument("--parity-train", default="", metavar="WORK_DIR", help="instead of training: CE, aux, grad norm "
                    "and one AdamW update against ght's CPU backend on one micro-batch (a preset's config)")
    ap.add_argument("--ght", default="build/bin/ght", help="the ght binary, for --parity-hf / --parity-train")
    ap.add_argument("--tol", type=float, default=1e-4, help="--parity-hf: max relative error")
    args = ap.parse_args()
    cfg = json.load(open(args.config_json))
    if "model" not in cfg:
        cfg = {"model": cfg}
    cfg.setdefault("optimizer", {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "max_grad_norm": 1.0})
    cfg.setdefault("schedule", {"lr": 1e-4})
    args.name = args.name or cfg["model"].get("name", "custom")
    cfg["experts"] = args.experts
    cfg["cpu_bf16"] = args.cpu_bf16
    try:
        import torch
    except ImportError as e:
        print(f"torch_peer: skipped: PyTorch cannot be imported ({e})")
        return 0
    if args.parity_train:
        return parity_train(torch, cfg, args)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("torch_peer: skipped: no CUDA device (use --device cpu for the CPU debugging path)")
        return 0
    if args.parity_hf:
        return parity(torch, cfg, args)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.enable_math_sdp(False)  # a silent math fallback would be an unfair peer
        torch.backends.cuda.matmul.allow_tf32 = False
    rc = 0
    for mode in [x for x in args.modes.split(",") if x]:
        if mode not in ("eager", "compile"):
            print(f"torch_peer: unknown mode '{mode}' (eager, compile)", file=sys.stderr)
            return 2
        notes = []
        rec = run_mode(torch, cfg, mode, args, device, notes)
        for n in rec["notes"]:
            print(f"torch_peer: note: {n}", file=sys.stderr)
        line = json.dumps(rec)
        print("PEER_JSON " + line, flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(line + "\n")
        if "error" in rec:
            rc = 1
        else:
            print(f"torch_peer: {args.name} {mode}: {rec['tokens_per_s']:.0f} tokens/s, step {rec['step_ms']:.1f} ms, "
                  f"strict MFU {100 * rec['mfu']:.1f}%, Megatron {100 * rec['mfu_megatron']:.1f}%, "
                  f"first step {rec.get('first_step_s', 0):.1f} s", file=sys.stderr, flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
