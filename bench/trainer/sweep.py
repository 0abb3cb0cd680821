#!/usr/bin/env python3
"""Shape sweep: `ght train` next to its PyTorch peer (bench/trainer/torch_peer.py), eager and
torch.compile, on realistic MoE shapes, everything in HBM of one H200 (issue 13, item 1).

Each shape is one dict of ModelConfig fields below (SHAPES): it becomes `ght train -o model.KEY=V`
overrides on configs/bench-h200.toml (constant lr 1e-4, no checkpoints), and the peer reads the
configuration ght itself resolves from them (`ght train ... --print-config`), so both train the
same model from one source. Tokens are random (throughput only), tokens/step is the same for both.

How to run (on the GPU machine, repo root, after `bench/run_gpu.sh build`):
  bench/run_gpu.sh sweep                               # the opt-in run_gpu.sh stage
  SWEEP_SHAPES="olmoe-like qwen3-like" bench/run_gpu.sh sweep   # a subset (split across calls)
  python3 bench/trainer/sweep.py --ght build-gpu/bin/ght --out DIR [--shapes "a b"]
  python3 bench/trainer/sweep.py --list [--ght build/bin/ght]   # CPU: the shapes, their parameter
        counts, and (with --ght) the check that ght agrees with them and plans them all in HBM
Per shape: random uint32 shards for its vocabulary (build/data/sweep-rand-V, made once; SWEEP_DATA);
`ght train --backend cuda --profile-steps N` (GHT_SAVE_CHECKPOINTS=off, a fresh run directory; tokens/s and
MFU are the median of its profile steps after the first); the peer eager then compiled (W warm-up
steps excluded, N timed). Output in --out: sweep.json (everything), sweep.md (the table, also
printed last), sweep_NAME_ght.log / _ght_profile.json / _config.json / _peer.log, sweep_peer.jsonl.
The table and JSON are rewritten after every shape, so a call that runs out of time keeps what it
measured, and they keep earlier calls' results (same --out) for the shapes, parts and modes this
one did not run. Knobs (flags or environment): SWEEP_SHAPES, SWEEP_PARTS ("ght peer"), SWEEP_MODES
("eager,compile"), SWEEP_PEER_PARITY (1: first the peer's logits on this device against ght's, ~20 s;
0: off), SWEEP_STEPS (ght profile steps, 4), SWEEP_PEER_WARMUP (2), SWEEP_PEER_STEPS (4),
SWEEP_DEADLINE_S (570: no stage starts, and a running one is killed, past this many seconds
after the sweep started, so that the table is still written inside a 600 s device call).

MFU: strict = tokens/s * (6 * N_active_nonembedding + 12 * L * H * head_dim * T) / 989.4e12, as
ght; the seed's count = tokens/s * (6 * N_active with embeddings + 12 * L * T * d_model) / 989.4e12, as
ght's step log prints it beside the strict one; Megatron = strict plus 6 * V * d per token (the LM head).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import torch_peer as tp  # noqa: E402  (no torch import at module level: the formulas only)

BASE_CONFIG = "configs/bench-h200.toml"
PEAK = tp.PEAK_FLOPS
MODEL_KEYS = ("d_model", "layers", "heads", "kv_heads", "head_dim", "experts", "top_k", "expert_ffn",
              "vocab", "tied_embeddings", "seq_len", "micro_batch", "grad_accum")

# Layer shapes of published MoE designs, with fewer layers so that each trains with everything in
# HBM (ght: 18 B/param + activations; the peer: 16 B/param + bf16 copies + activations) and
# initialises quickly; 16,384 tokens per step for all. "like" = the per-layer shape, not the model.
SHAPES = [
    {"name": "olmoe-like", "about": "OLMoE-1B-7B layer: MHA, 64 experts of 1024, top-8, untied 50k",
     "model": dict(d_model=2048, layers=6, heads=16, kv_heads=16, head_dim=128, experts=64, top_k=8,
                   expert_ffn=1024, vocab=50304, tied_embeddings=False, seq_len=4096, micro_batch=2,
                   grad_accum=2)},
    {"name": "qwen3-like", "about": "Qwen3-30B-A3B layer: GQA 8, 128 experts of 768, top-8, untied 152k",
     "model": dict(d_model=2048, layers=4, heads=32, kv_heads=4, head_dim=128, experts=128, top_k=8,
                   expert_ffn=768, vocab=151936, tied_embeddings=False, seq_len=4096, micro_batch=2,
                   grad_accum=2)},
    {"name": "mixtral-like", "about": "Mixtral-style d 4096, GQA 4, 16 experts of 2048, top-2, untied 32k",
     "model": dict(d_model=4096, layers=4, heads=32, kv_heads=8, head_dim=128, experts=16, top_k=2,
                   expert_ffn=2048, vocab=32000, tied_embeddings=False, seq_len=4096, micro_batch=1,
                   grad_accum=4)},
    {"name": "switch-like", "about": "Switch-style top-1: d 1024, head_dim 64 MHA, 64 experts of 2048, tied 32k, 16k-token micro-batch",
     "model": dict(d_model=1024, layers=6, heads=16, kv_heads=16, head_dim=64, experts=64, top_k=1,
                   expert_ffn=2048, vocab=32768, tied_embeddings=True, seq_len=2048, micro_batch=8,
                   grad_accum=1)},
    {"name": "fine-grained", "about": "fine-grained experts: d 3072, head_dim 64 GQA 2, 64 experts of 512, top-4, untied 100k",
     "model": dict(d_model=3072, layers=6, heads=48, kv_heads=24, head_dim=64, experts=64, top_k=4,
                   expert_ffn=512, vocab=100352, tied_embeddings=False, seq_len=2048, micro_batch=4,
                   grad_accum=2)},
    {"name": "seed-4l", "about": "the seed's layer (bench-h200): d 4096, 40/8 heads of 128, 48 experts of 800, top-4, tied 152k",
     "model": dict(d_model=4096, layers=4, heads=40, kv_heads=8, head_dim=128, experts=48, top_k=4,
                   expert_ffn=800, vocab=151936, tied_embeddings=True, seq_len=4096, micro_batch=1,
                   grad_accum=4)},
    {"name": "seed21b-4l", "about": "seed-21b's layer: d 4096, 40/8 heads of 128, 64 experts of 800, top-4, tied 152k (4 of 30 layers)",
     "model": dict(d_model=4096, layers=4, heads=40, kv_heads=8, head_dim=128, experts=64, top_k=4,
                   expert_ffn=800, vocab=151936, tied_embeddings=True, seq_len=4096, micro_batch=1,
                   grad_accum=4)},
    # Not in the default list: the bench-h200 model itself (10 layers, 5.85B), to set the peer next
    # to the PyTorch numbers recorded in HARDWARE.md (20.7k eager / 26.2k compiled tokens/s).
    {"name": "bench-h200", "default": False, "about": "configs/bench-h200.toml as it is (10 layers, 5.85B)",
     "model": dict(d_model=4096, layers=10, heads=40, kv_heads=8, head_dim=128, experts=48, top_k=4,
                   expert_ffn=800, vocab=151936, tied_embeddings=True, seq_len=4096, micro_batch=1,
                   grad_accum=4)},
    # Not in the default list: a tiny shape for checking the pipeline on a CPU (tests/cli/sweep_shapes_test.sh).
    {"name": "smoke", "default": False, "about": "pipeline check only (CPU)",
     "model": dict(d_model=64, layers=2, heads=4, kv_heads=2, head_dim=16, experts=4, top_k=2, expert_ffn=64,
                   vocab=512, tied_embeddings=False, seq_len=64, micro_batch=2, grad_accum=2)},
]
# ModelConfig fields the sweep leaves at the base config's values (configs/bench-h200.toml's
# preset); the formulas below do not depend on them.
BASE_MODEL = dict(norm_topk_prob=True, rope_theta=1000000.0, rms_eps=1e-6, aux_loss_coef=0.01, z_loss_coef=0.001)


def full_model(shape):
    m = dict(BASE_MODEL)
    m.update(shape["model"])
    return m


def overrides(shape):
    out = []
    for k in MODEL_KEYS:
        v = shape["model"][k]
        out += ["-o", f"model.{k}={str(v).lower() if isinstance(v, bool) else v}"]
    return out


def counts(m):
    return {"params_total": tp.total_params(m), "params_active": tp.active_params(m),
            "params_active_nonembedding": tp.active_nonembedding_params(m),
            "flops_per_token": tp.flops_per_token(m), "megatron_flops_per_token": tp.megatron_flops_per_token(m),
            "seed_flops_per_token": tp.seed_flops_per_token(m),
            "tokens_per_step": tp.tokens_per_step(m), "micro_batch_tokens": m["seq_len"] * m["micro_batch"]}


# Rough device seconds per stage, for skipping a stage that cannot finish before SWEEP_DEADLINE_S
# and for planning how to split the sweep across calls. Guesses, not measurements: ght initialises
# its weights on the CPU (about 1 minute per 5B parameters on the 16-core H200 machine) and then
# runs a few short steps; the peer starts Python, PyTorch and CUDA, and torch.compile compiles the
# forward and backward in its first step (a minute or two for a few MoE layers).
def est_ght_s(c):
    return 20 + 12 * c["params_total"] / 1e9


def est_peer_s(modes):
    return 15 + sum({"eager": 20, "compile": 100}.get(x, 60) for x in modes.split(","))


def fmt_b(n):
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e7 else f"{n / 1e6:.2f}M"


def describe(m):
    tie = "tied" if m["tied_embeddings"] else "untied"
    return (f"d {m['d_model']}, L {m['layers']}, {m['heads']}/{m['kv_heads']} heads of {m['head_dim']} "
            f"(GQA {m['heads'] // m['kv_heads']}), {m['experts']} experts of {m['expert_ffn']} top-{m['top_k']}, "
            f"V {m['vocab']} {tie}, {m['micro_batch']}x{m['seq_len']} tokens x {m['grad_accum']}")


# ---- --list: the shapes, checked against ght ---------------------------------------------------

def ght_plan(ght, shape):
    """ght's own numbers for a shape: `ght plan --profile pcie5 --json` (the H200's nominal memory).
    Total parameters = the bf16 weight regions' bytes / 2; FLOPs per token = step_flops / tokens."""
    cmd = [ght, "plan", "--config", os.path.join(ROOT, BASE_CONFIG), *overrides(shape), "--profile", "pcie5", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, GHT_PLAN_TOLERANCE="exact"))
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()[-500:]}")
    p = json.loads(r.stdout)
    regions = p["regions"]
    weight_bytes = sum(x["bytes"] for x in regions if x["class"] == "weight")
    return {"params_total": weight_bytes // 2,
            "flops_per_token": p["step_flops"] / tp.tokens_per_step(full_model(shape)),
            "all_hbm": all(x["tier"] == "hbm" for x in regions),
            "activation_mode": p["summary"].get("activation_mode"),
            "hbm_bytes": p["prediction"].get("hbm_bytes")}


def ght_config(ght, shape):
    cmd = [ght, "train", "--config", os.path.join(ROOT, BASE_CONFIG), *overrides(shape), "--print-config"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout)


def list_shapes(args, shapes):
    ok = True
    print("| shape | what | params total / active (non-embedding) | GFLOP/token strict / seed's count / Megatron | micro-batch / step tokens "
          "| est. s ght + peer |" + (" ght plan: params, FLOPs, HBM |" if args.ght else ""))
    print("|---|---|---|---|---|---|" + ("---|" if args.ght else ""))
    total_s = 0
    for s in shapes:
        m = full_model(s)
        c = counts(m)
        row = (f"| {s['name']} | {describe(m)} | {fmt_b(c['params_total'])} / {fmt_b(c['params_active'])} "
               f"({fmt_b(c['params_active_nonembedding'])}) | {c['flops_per_token'] / 1e9:.2f} / "
               f"{c['seed_flops_per_token'] / 1e9:.2f} / "
               f"{c['megatron_flops_per_token'] / 1e9:.2f} | {c['micro_batch_tokens']} / {c['tokens_per_step']} "
               f"| {est_ght_s(c):.0f} + {est_peer_s(args.modes):.0f} |")
        total_s += est_ght_s(c) + est_peer_s(args.modes)
        if args.ght:
            problems = []
            try:
                p = ght_plan(args.ght, s)
                cfg = ght_config(args.ght, s)
                if p["params_total"] != c["params_total"]:
                    problems.append(f"ght plans {p['params_total']} parameters, the sweep counts {c['params_total']}")
                if abs(p["flops_per_token"] - c["flops_per_token"]) > 1e-9 * c["flops_per_token"]:
                    problems.append(f"ght's FLOPs/token {p['flops_per_token']:.6g} != {c['flops_per_token']:.6g}")
                if not p["all_hbm"]:
                    problems.append("ght's plan does not keep everything in HBM")
                for k, v in m.items():
                    if cfg["model"].get(k) != v:
                        problems.append(f"ght resolved model.{k}={cfg['model'].get(k)}, the sweep has {v}")
                row += (f" {'agree' if not problems else 'DIFFER'}, {'all HBM' if p['all_hbm'] else 'NOT all HBM'} "
                        f"{p['hbm_bytes'] / 2**30:.1f} GiB, activations {p['activation_mode']} |")
            except (RuntimeError, ValueError, KeyError) as e:
                problems.append(str(e))
                row += " ERROR |"
            for pr in problems:
                print(f"sweep: {s['name']}: {pr}", file=sys.stderr)
            ok &= not problems
        print(row)
    print(f"estimated device time (a guess; the sweep skips what cannot finish before SWEEP_DEADLINE_S): "
          f"{total_s:.0f} s for {len(shapes)} shapes")
    if args.ght:
        print(f"sweep --list: {len(shapes)} shapes {'agree with' if ok else 'DO NOT agree with'} {args.ght}")
    return 0 if ok else 1


# ---- the run -----------------------------------------------------------------------------------

class Clock:
    def __init__(self, deadline_s):
        self.t0, self.deadline = time.monotonic(), deadline_s

    def left(self):
        return self.deadline - (time.monotonic() - self.t0)


def run_logged(cmd, log, timeout, env=None):
    """Run cmd in its own process group, output to log (and the last lines echoed); on timeout the
    whole group (the peer's compile workers too) is killed. Returns (rc, output, timed_out)."""
    if timeout <= 5:
        return None, "", True
    print("+ " + " ".join(cmd), flush=True)
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
        try:
            rc, timed_out = p.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            rc, timed_out = p.wait(), True
    out = open(log, errors="replace").read()
    tail = [ln for ln in out.splitlines() if not ln.startswith("PEER_JSON ")][-6:]
    for ln in tail:
        print("  | " + ln[:300])
    if timed_out:
        print(f"  killed after {timeout:.0f} s (its time limit: --ght-timeout / --peer-timeout, or SWEEP_DEADLINE_S)")
    return rc, out, timed_out


def make_data(ght, data_dir, vocab, need_tokens):
    """Random uint32 token shards in [0, vocab): DATA_DIR/sweep-rand-V (made once)."""
    d = os.path.join(data_dir, f"sweep-rand-{vocab}")
    n = max(1 << 20, 3 * need_tokens)
    meta = os.path.join(d, "sweep_tokens")
    if os.path.exists(os.path.join(d, "prep.json")) and os.path.exists(meta) and int(open(meta).read()) >= n:
        return d
    os.makedirs(os.path.dirname(d), exist_ok=True)
    raw = d + ".u32"
    try:
        import numpy as np
        np.random.default_rng(vocab).integers(0, vocab, size=n, dtype=np.uint32).tofile(raw)
    except ImportError:
        import array
        import random
        r = random.Random(vocab)
        array.array("I", (r.randrange(vocab) for _ in range(n))).tofile(open(raw, "wb"))
    subprocess.run([ght, "prep", "--from-tokens", raw, "--dtype", "uint32", "--vocab", str(vocab), "--out", d,
                    "--val-fraction", "0.1", "--overwrite", "--quiet"], check=True, cwd=ROOT)
    os.remove(raw)
    open(meta, "w").write(str(n))
    return d


def run_ght(args, shape, data, clock):
    name = shape["name"]
    run_dir = os.path.join(args.runs, f"sweep-{name}")
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run directory: ght refuses an old run
    # Exact, like the peer's fp32 AdamW: unpinned, the plan may take q8 m/v where it is faster.
    env = dict(os.environ, GHT_SAVE_CHECKPOINTS="off", GHT_PLAN_TOLERANCE="exact")
    cmd = [args.ght, "train", "--config", os.path.join(ROOT, BASE_CONFIG), *overrides(shape), "--data", data,
           "--out", run_dir, "--backend", "cuda", "--steps", str(args.steps), "--profile-steps", str(args.steps),
           "-o", "train.log_every=1", "-o", "train.eval_batches=1"]
    rc, out, timed_out = run_logged(cmd, os.path.join(args.out, f"sweep_{name}_ght.log"),
                                    min(args.ght_timeout, clock.left() - 15), env)
    rec = {"command": " ".join(cmd), "rc": rc}
    prof = os.path.join(run_dir, "profile.json")
    if os.path.exists(prof):
        shutil.copy(prof, os.path.join(args.out, f"sweep_{name}_ght_profile.json"))
        p = json.load(open(prof))
        med = p.get("median_excluding_first_step", {})
        pl = p.get("placement", {})
        rec.update({"tokens_per_s": med.get("tokens_per_s"), "mfu": med.get("mfu"), "step_ms": med.get("wall_ms"),
                    "forward_ms": med.get("forward_ms"), "backward_ms": med.get("backward_ms"),
                    "opt_exposed_ms": med.get("opt_exposed_ms"), "profile_steps": len(p.get("steps", [])),
                    "flops_per_token": p.get("flops_per_token"), "tokens_per_step": p.get("tokens_per_step"),
                    "state_host_bytes": pl.get("state_host_bytes"), "recomputed_layers": pl.get("recomputed_layers"),
                    "hbm_peak_bytes": pl.get("memory", {}).get("hbm", {}).get("peak")})
    if rc != 0 or timed_out or not rec.get("tokens_per_s"):
        lines = [ln for ln in out.splitlines() if ln.strip()]
        rec["error"] = "timed out" if timed_out else (lines[-1][:500] if lines else f"exit {rc}")
        rec["oom"] = "out of memory" in out.lower()
    return rec


def run_peer(args, shape, cfg_path, clock):
    name = shape["name"]
    cmd = [args.python, os.path.join(HERE, "torch_peer.py"), "--config-json", cfg_path, "--name", name,
           "--modes", args.modes, "--warmup", str(args.peer_warmup), "--steps", str(args.peer_steps),
           "--device", args.peer_device, "--json", os.path.join(args.out, "sweep_peer.jsonl")]
    rc, out, timed_out = run_logged(cmd, os.path.join(args.out, f"sweep_{name}_peer.log"),
                                    min(args.peer_timeout, clock.left() - 10))
    recs = {}
    for ln in out.splitlines():
        if ln.startswith("PEER_JSON "):
            r = json.loads(ln[len("PEER_JSON "):])
            recs[r["mode"]] = r
    skipped = [ln for ln in out.splitlines() if ln.startswith("torch_peer: skipped")]
    for mode in args.modes.split(","):
        if mode not in recs:
            recs[mode] = {"error": skipped[0] if skipped else ("timed out" if timed_out else f"no result (exit {rc})")}
    return recs


def peer_parity(args):
    """The peer's logits on this device (bf16 autocast on CUDA) against ght's fp32 CPU logits on an
    exported `small` model: a gross-error check of the path the sweep times (a wrong expert layout
    or attention call gives O(1) errors; bf16 rounding and the top-k choices it flips give a few
    percent). About 20 s."""
    work = os.path.join(args.out, "peer_parity")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    try:
        subprocess.run([args.ght, "export", "--hf", os.path.join(work, "hf"), "--init", "small", "--seed", "7"],
                       check=True, capture_output=True, cwd=ROOT)
        cfg = subprocess.run([args.ght, "train", "--model", "small", "--print-config"], check=True,
                             capture_output=True, text=True, cwd=ROOT).stdout
        open(os.path.join(work, "small.json"), "w").write(cfg)
        r = subprocess.run([args.python, os.path.join(HERE, "torch_peer.py"), "--config-json", os.path.join(work, "small.json"),
                            "--parity-hf", os.path.join(work, "hf"), "--ght", args.ght, "--device", args.peer_device,
                            "--tol", "0.15"], capture_output=True, text=True, cwd=ROOT, timeout=120)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        return json.loads(lines[-1]) if lines else {"error": (r.stdout + r.stderr).strip()[-500:]}
    except (subprocess.SubprocessError, OSError, ValueError) as e:
        return {"error": str(e)[:500]}


def pct(x):
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) else "–"


def num(x):
    return f"{x:,.0f}" if isinstance(x, (int, float)) else "–"


def table(results):
    lines = ["| shape | params total / active | tokens/step | ght tokens/s | ght MFU strict | ght MFU seed's count "
             "| ght MFU Megatron | eager tokens/s (MFU) | compile tokens/s (MFU) | ght ÷ compile | notes |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        c, g, pe = r["counts"], r.get("ght", {}), r.get("peer", {})
        ev, co = pe.get("eager", {}), pe.get("compile", {})
        notes = []
        for who, x in (("ght", g), ("eager", ev), ("compile", co)):
            if x.get("error"):
                notes.append(f"{who}: {'OOM' if x.get('oom') else x['error'][:80]}")
        if g.get("state_host_bytes"):
            notes.append(f"ght state on host {g['state_host_bytes'] / 2**30:.1f} GiB")
        if g.get("recomputed_layers"):
            notes.append(f"ght recomputed {g['recomputed_layers']} layers")
        if co.get("experts") == "loop" or ev.get("experts") == "loop":
            notes.append("peer experts: loop")
        gt, ct = g.get("tokens_per_s"), co.get("tokens_per_s")
        ratio = f"{gt / ct:.2f}" if gt and ct else "–"
        mg, sd = g.get("mfu_megatron"), g.get("mfu_seed")  # set by write()
        lines.append(f"| {r['name']} | {fmt_b(c['params_total'])} / {fmt_b(c['params_active'])} | {c['tokens_per_step']:,} "
                     f"| {num(gt)} | {pct(g.get('mfu'))} | {pct(sd)} | {pct(mg)} | {num(ev.get('tokens_per_s'))} ({pct(ev.get('mfu'))}) "
                     f"| {num(ct)} ({pct(co.get('mfu'))}) | {ratio} | {'; '.join(notes)} |")
    return "\n".join(lines)


def write(args, results, meta):
    """sweep.json and sweep.md in --out, with the results of earlier calls into the same --out for
    shapes this call did not run (one table across calls that split the sweep)."""
    path = os.path.join(args.out, "sweep.json")
    try:
        earlier = {r["name"]: r for r in json.load(open(path)).get("shapes", [])}
    except (OSError, ValueError, AttributeError):
        earlier = {}
    for r in results:  # a call that ran only some parts or modes keeps the others' earlier results
        e = earlier.get(r["name"], {})
        if "ght" not in r and "ght" in e:
            r["ght"] = e["ght"]
        if "peer" in e:
            r["peer"] = {**e["peer"], **r.get("peer", {})}
    mine = {r["name"] for r in results}
    order = [s["name"] for s in SHAPES]
    results = sorted([r for n, r in earlier.items() if n not in mine] + results,
                     key=lambda r: order.index(r["name"]) if r["name"] in order else len(order))
    for r in results:
        g = r.get("ght", {})
        if g.get("tokens_per_s"):
            g["mfu_megatron"] = g["tokens_per_s"] * r["counts"]["megatron_flops_per_token"] / PEAK
            if r["counts"].get("seed_flops_per_token"):
                g["mfu_seed"] = g["tokens_per_s"] * r["counts"]["seed_flops_per_token"] / PEAK
    json.dump({**meta, "shapes": results}, open(path, "w"), indent=2)
    t = table(results)
    with open(os.path.join(args.out, "sweep.md"), "w") as f:
        f.write(f"# Shape sweep, {meta['date']}\n\n{meta['formula']}\n\n{t}\n\n")
        if "peer_parity" in meta:
            f.write(f"Peer parity (`small`, this device, against ght's fp32 logits): {json.dumps(meta['peer_parity'])}\n\n")
        f.write("Shapes:\n")
        for r in results:
            f.write(f"- {r['name']}: {r['describe']} ({r['about']})\n")
    return t


def main():
    env = os.environ.get
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--list", action="store_true", help="print the shapes (and check them against --ght); no GPU")
    ap.add_argument("--ght", default=env("SWEEP_GHT", ""), help="the ght binary")
    ap.add_argument("--out", default=env("SWEEP_OUT", os.path.join(ROOT, "build-gpu", "results", "sweep")))
    ap.add_argument("--runs", default=env("SWEEP_RUNS", os.path.join(ROOT, "build-gpu", "train-runs")))
    ap.add_argument("--data-dir", default=env("SWEEP_DATA", os.path.join(ROOT, "build", "data")),
                    help="where the random-token shards are made (sweep-rand-VOCAB)")
    ap.add_argument("--shapes", default=env("SWEEP_SHAPES", ""), help="names, space- or comma-separated; "
                    "default: every shape but bench-h200; 'all' adds it")
    ap.add_argument("--parts", default=env("SWEEP_PARTS", "ght peer"))
    ap.add_argument("--modes", default=env("SWEEP_MODES", "eager,compile"))
    ap.add_argument("--steps", type=int, default=int(env("SWEEP_STEPS", "4")), help="ght steps, all profiled")
    ap.add_argument("--peer-warmup", type=int, default=int(env("SWEEP_PEER_WARMUP", "2")))
    ap.add_argument("--peer-steps", type=int, default=int(env("SWEEP_PEER_STEPS", "4")))
    ap.add_argument("--deadline-s", type=float, default=float(env("SWEEP_DEADLINE_S", "570")))
    ap.add_argument("--ght-timeout", type=float, default=240)
    ap.add_argument("--peer-timeout", type=float, default=360)
    ap.add_argument("--python", default=env("SWEEP_PYTHON", sys.executable), help="the python with torch, for the peer")
    ap.add_argument("--peer-device", default=env("SWEEP_PEER_DEVICE", "cuda"), help="cpu: the peer's fp32 debugging path")
    args = ap.parse_args()

    names = args.shapes.replace(",", " ").split()
    if names == ["all"]:
        shapes = [s for s in SHAPES if s["name"] != "smoke"]
    elif names:
        by = {s["name"]: s for s in SHAPES}
        unknown = [n for n in names if n not in by]
        if unknown:
            print(f"sweep: unknown shape(s) {', '.join(unknown)}; known: {', '.join(by)}", file=sys.stderr)
            return 2
        shapes = [by[n] for n in names]
    else:
        shapes = [s for s in SHAPES if s.get("default", True)]
    if args.list:
        return list_shapes(args, shapes)
    if not args.ght:
        print("sweep: --ght GHT_BIN is required to run (or --list)", file=sys.stderr)
        return 2
    args.ght = os.path.abspath(args.ght)
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.runs, exist_ok=True)
    clock = Clock(args.deadline_s)
    parts = args.parts.split()
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "ght": args.ght,
            "formula": "MFU strict = tokens/s x (6 N_active_nonembedding + 12 L H head_dim T) / 989.4e12; "
                       "Megatron adds 6 V d per token (the LM head). ght: median of its profile steps after the "
                       f"first ({args.steps} steps); peer: median of {args.peer_steps} steps after "
                       f"{args.peer_warmup} warm-up steps.",
            "base_config": BASE_CONFIG, "parts": parts, "modes": args.modes}
    results, skipped = [], []
    fail = False
    if "peer" in parts and os.environ.get("SWEEP_PEER_PARITY", "1") != "0":
        meta["peer_parity"] = peer_parity(args)
        print(f"peer parity ({args.peer_device}, `small` against ght's fp32 logits): {meta['peer_parity']}", flush=True)
        if not meta["peer_parity"].get("pass"):
            print("WARNING: the peer does not compute ght's model on this device; its timings are suspect")
            fail = True
    for s in shapes:
        m = full_model(s)
        r = {"name": s["name"], "about": s["about"], "describe": describe(m), "model": m, "counts": counts(m),
             "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        results.append(r)
        print(f"\n--- {s['name']}: {describe(m)} ({clock.left():.0f} s left)", flush=True)
        try:
            cfg = ght_config(args.ght, s)
            cfg_path = os.path.join(args.out, f"sweep_{s['name']}_config.json")
            json.dump(cfg, open(cfg_path, "w"), indent=2)
            if "ght" in parts:
                if clock.left() < est_ght_s(r["counts"]) + 15:
                    r["ght"] = {"error": "skipped: SWEEP_DEADLINE_S"}
                else:
                    data = make_data(args.ght, args.data_dir, m["vocab"], args.steps * r["counts"]["tokens_per_step"])
                    r["ght"] = run_ght(args, s, data, clock)
            if "peer" in parts:
                if clock.left() < est_peer_s(args.modes) + 10:
                    r["peer"] = {mode: {"error": "skipped: SWEEP_DEADLINE_S"} for mode in args.modes.split(",")}
                else:
                    r["peer"] = run_peer(args, s, cfg_path, clock)
        except (RuntimeError, OSError, subprocess.CalledProcessError, ValueError) as e:
            r["error"] = str(e)[:1000]
            print(f"sweep: {s['name']}: {e}", file=sys.stderr)
        errs = [r.get("error"), r.get("ght", {}).get("error")] + [x.get("error") for x in r.get("peer", {}).values()]
        if any(e and e.startswith("skipped:") for e in errs):
            skipped.append(s["name"])
        fail |= any(e and not e.startswith("skipped:") for e in errs)
        write(args, results, meta)
    print()
    print(write(args, results, meta))
    print(f"\n{meta['formula']}\nresults: {args.out}/sweep.json, sweep.md (with earlier calls' rows for shapes not run now)")
    if skipped:
        print(f"not run for lack of time (SWEEP_DEADLINE_S): SWEEP_SHAPES=\"{' '.join(skipped)}\" for a later call")
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main())
