#!/usr/bin/env bash
# GPU training checks and the training throughput bench (issue 7), on the H200 machine.
#
#   bash bench/train_gpu.sh GHT_BIN RESULTS_DIR        (bench/run_gpu.sh stage `train`)
#
# 1. Learning: `small` for 300 steps on the demo corpus on the GPU where its plan places it
#    (everything fits in HBM), next to the CPU backend's first 20 steps on the same seed and data
#    (same configs/small.toml, --stop-at 20 so the LR schedule is identical). Checks: the first 20
#    losses track the CPU's within bf16 noise (steps 1-10 within 2e-3; steps 11-20 within
#    max(2%, twice the spread between two GPU runs that differ only in the attention kernel),
#    see the summary code), and the final eval loss is below the `tiny` CPU demo's (scripts/demo.sh settings;
#    reused from runs/tiny-demo when present).
# 2. Plan-driven modes: 20 steps of `small` with GHT_PLACE streaming gradients to the host
#    accumulator and recomputing every layer's activations; same check against the CPU curve.
# 3. Throughput and placement: configs/bench-h200.toml (the seed's layer shape, 10 layers, 5.85B
#    params) for a few steps as the plan places it with no GHT_* set, with everything in HBM
#    (GHT_OPTIMIZER=device), with master/m/v on the host (GHT_PLACE), under GHT_HBM_BUDGET=60GiB,
#    and at 14 layers (7.94B, does not fit in HBM with all its state): MFU, tokens/s, the forward /
#    backward / exposed-optimizer breakdown, and the plan's predicted bytes per tier next to the
#    allocator's measured peak (profile.json "placement").
# Everything lands in RESULTS_DIR (logs, profile JSONs, train_gpu_summary.json). Runtime: about
# 5 minutes (mostly the 5.85B-parameter initialisation, done twice). Knobs: TRAIN_RUNS_DIR (run
# directories, default build-gpu/train-runs), TINY_DEMO_STEPS (default 1500).
set -uo pipefail
GHT=${1:?usage: train_gpu.sh GHT_BIN RESULTS_DIR}
RES=${2:?usage: train_gpu.sh GHT_BIN RESULTS_DIR}
cd "$(dirname "$0")/.."
mkdir -p "$RES"
RUNS=${TRAIN_RUNS_DIR:-build-gpu/train-runs}
PARTS=${TRAIN_PARTS:-learn bench}  # either or both, so that a device call can run one of them
want() { [[ " $PARTS " == *" $1 "* ]]; }
mkdir -p "$RUNS"
fail=0
note() { echo; echo "--- $* ($(date -u +%T))"; }
run_logged() {  # run_logged NAME TIMEOUT CMD...: output to $RES/NAME.log and stdout
  local name=$1 limit=$2; shift 2
  echo "+ $*"
  timeout "$limit" "$@" 2>&1 | tee "$RES/$name.log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || { echo "FAIL: $name exited $rc"; fail=1; }
  return "$rc"
}

# ---- data ----------------------------------------------------------------------------------
note "demo corpus"
if [ ! -f build/data/demo/prep.json ]; then
  "$GHT" prep --input data/austen --out build/data/demo --val-fraction 0.05 --quiet || fail=1
fi

# ---- 1. learning check ---------------------------------------------------------------------
if want learn; then
rm -rf "$RUNS"/small-* "$RUNS"/tiny-demo
note "small on the GPU, 300 steps, state on the host"
run_logged train_small_gpu 240 "$GHT" train --config configs/small.toml --out "$RUNS/small-gpu" --backend cuda \
  --profile-steps 20
cp "$RUNS/small-gpu/profile.json" "$RES/train_small_gpu_profile.json" 2>/dev/null

note "small on the CPU backend, first 20 steps (same seed, data and schedule)"
run_logged train_small_cpu 240 "$GHT" train --config configs/small.toml --out "$RUNS/small-cpu" --backend cpu \
  --stop-at 20 -o train.log_every=1

note "small on the GPU, 20 steps, plan-driven: gradients streamed to the host, every layer recomputed"
GHT_PLACE="master=host,adam_*=host,grad=stream,activation=recompute" \
  run_logged train_small_gpu_stream 180 "$GHT" train --config configs/small.toml --out "$RUNS/small-gpu-stream" \
  --backend cuda --stop-at 20 -o train.log_every=1

# The bf16 noise reference: the default configuration with the other attention kernel (cuDNN
# fused SDPA <-> ghtier's own), the same math with different bf16 rounding.
other_att=fallback
grep -q "attention ran: fallback" "$RES/train_small_gpu.log" 2>/dev/null && other_att=cudnn
note "small on the GPU, 20 steps, attention $other_att (bf16 noise reference)"
GHT_ATTENTION=$other_att run_logged train_small_gpu_noise 180 "$GHT" train --config configs/small.toml \
  --out "$RUNS/small-gpu-noise" --backend cuda --stop-at 20 -o train.log_every=1

# Issue 14's convergence check of the one-step-delayed update: the same 300 steps, GHT_OPT_DELAY=1.
note "small on the GPU, 300 steps, one-step-delayed update (GHT_OPT_DELAY=1)"
GHT_OPT_DELAY=1 run_logged train_small_gpu_delay 240 "$GHT" train --config configs/small.toml \
  --out "$RUNS/small-gpu-delay" --backend cuda --profile-steps 20
cp "$RUNS/small-gpu-delay/profile.json" "$RES/train_small_gpu_delay_profile.json" 2>/dev/null

tiny_log=runs/tiny-demo/log.jsonl
if ! grep -q '"type":"eval"' "$tiny_log" 2>/dev/null; then
  note "tiny CPU demo (scripts/demo.sh settings) for the reference eval loss"
  tiny_log=$RUNS/tiny-demo/log.jsonl
  run_logged train_tiny_cpu 240 "$GHT" train --model tiny --data build/data/demo --out "$RUNS/tiny-demo" \
    --steps "${TINY_DEMO_STEPS:-1500}" --backend cpu -o train.eval_every=250 -o train.log_every=250 >/dev/null
fi

fi

# ---- 3. throughput -------------------------------------------------------------------------
if want bench; then
rm -rf "$RUNS"/bench-*
note "random uint32 tokens for bench-h200 (vocab 151936)"
bash bench/make_bench_data.sh "$GHT" || fail=1

# bench NAME DESCRIPTION [VAR=VALUE ...] -- [ght train args...]: one throughput run, when NAME is in
# TRAIN_BENCH_RUNS (default: default hbm host budget60 layers14); TRAIN_BENCH_STEPS overrides the
# number of steps. Results: $RES/train_bench_NAME{.log,_profile.json}.
bench() {
  local name=$1 what=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  [[ " ${TRAIN_BENCH_RUNS:-default hbm host budget60 layers14} " == *" $name "* ]] || return 0
  note "bench-h200: $what"
  rm -rf "$RUNS/bench-$name"  # a fresh run directory (ght train refuses to train into an old run)
  (
    export GHT_SAVE_CHECKPOINTS=off
    for e in "${envs[@]}"; do export "${e?}"; done
    run_logged "train_bench_$name" 300 "$GHT" train --config configs/bench-h200.toml --out "$RUNS/bench-$name" \
      --backend cuda --profile-steps 100 ${TRAIN_BENCH_STEPS:+-o train.steps=$TRAIN_BENCH_STEPS} "$@"
  ) || fail=1
  cp "$RUNS/bench-$name/profile.json" "$RES/train_bench_${name}_profile.json" 2>/dev/null
  cp "$RUNS/bench-$name/log.jsonl" "$RES/train_bench_${name}_log.jsonl" 2>/dev/null  # for ght report
}
bench default "no GHT_* set: the plan decides (everything fits in HBM)" --
bench hbm "everything in HBM (GHT_OPTIMIZER=device)" GHT_OPTIMIZER=device --
bench host "master/m/v in host memory (GHT_PLACE, mapped pinned), updated over PCIe by the GPU" \
  "GHT_PLACE=master=host,adam_*=host" --
bench budget60 "GHT_HBM_BUDGET=60GiB: the plan moves part of the state to the host" GHT_HBM_BUDGET=60GiB --
bench layers14 "14 layers (7.94B): does not fit in HBM with its state; the plan's mixed placement" -- \
  -o model.layers=14 -o train.steps=4
bench host_ga16 "state on the host, 16 micro-batches per step (4x the tokens per PCIe update)" \
  "GHT_PLACE=master=host,adam_*=host" -- \
  -o model.grad_accum=16 -o train.steps=4
# Expert GEMM A/B in the full model (everything in HBM, 4 steps each)
# Speculative updates during the last backward (GHT_OPT_SPECULATE): A/B without clipping (the
# random-token bench clips every step, which turns speculation off after step 1), with 4
# micro-batches per step and with 1 (whole backward as the window; a larger undo arena).
bench host_noclip "state on the host, no clipping, speculation on (default arena)" "GHT_PLACE=master=host,adam_*=host" -- -o optimizer.max_grad_norm=0
bench host_noclip_nospec "state on the host, no clipping, speculation off" "GHT_PLACE=master=host,adam_*=host" GHT_OPT_SPECULATE=0 -- \
  -o optimizer.max_grad_norm=0
bench host_ga1_noclip "state on the host, no clipping, 1 micro-batch of 4, speculation with a 24 GiB arena" "GHT_PLACE=master=host,adam_*=host" \
  GHT_OPT_SPECULATE=24GiB -- -o optimizer.max_grad_norm=0 -o model.micro_batch=4 -o model.grad_accum=1
bench host_ga1_noclip_nospec "state on the host, no clipping, 1 micro-batch of 4, speculation off" "GHT_PLACE=master=host,adam_*=host" \
  GHT_OPT_SPECULATE=0 -- -o optimizer.max_grad_norm=0 -o model.micro_batch=4 -o model.grad_accum=1
bench hbm_loop "everything in HBM, expert GEMMs cublaslt_loop" GHT_OPTIMIZER=device GHT_EXPERT_GEMM=cublaslt_loop -- \
  -o train.steps=4
bench hbm_streams "everything in HBM, expert GEMMs cublaslt_streams" GHT_OPTIMIZER=device \
  GHT_EXPERT_GEMM=cublaslt_streams -- -o train.steps=4
# Issue 13's target shape: everything in HBM, 16 micro-batches (65,536 tokens per step), the
# default expert GEMMs (CUTLASS when built in) against the cublaslt_streams default they replaced.
bench hbm_ga16 "everything in HBM, 16 micro-batches (64k tokens/step), default expert GEMMs" GHT_OPTIMIZER=device -- \
  -o model.grad_accum=16 -o train.steps=6
bench hbm_ga16_streams "everything in HBM, 16 micro-batches, expert GEMMs cublaslt_streams (the previous default)" \
  GHT_OPTIMIZER=device GHT_EXPERT_GEMM=cublaslt_streams -- -o model.grad_accum=16 -o train.steps=6
bench hbm_ga16_bf16grad "everything in HBM, 16 micro-batches, bf16 gradient accumulation (GHT_GRAD_ACCUM=bf16)" \
  GHT_OPTIMIZER=device GHT_GRAD_ACCUM=bf16 -- -o model.grad_accum=16 -o train.steps=6
fi

# ---- report --------------------------------------------------------------------------------
note "summary"
BENCH_RUNS="${TRAIN_BENCH_RUNS:-default hbm host budget60 layers14}" PARTS="$PARTS" python3 - "$RUNS" "${tiny_log:-}" "$RES" <<'EOF'
import json, os, sys
runs, tiny_log, res = sys.argv[1], sys.argv[2], sys.argv[3]

def records(path, kind):
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    j = json.loads(line)
                except ValueError:
                    continue
                if j.get("type") == kind:
                    out.append(j)
    except OSError:
        pass
    return out

ok = True
summary = {}
parts = os.environ.get("PARTS", "learn bench").split()
if "learn" in parts:
    gpu = {r["step"]: r["loss"] for r in records(f"{runs}/small-gpu/log.jsonl", "step")}
    cpu = {r["step"]: r["loss"] for r in records(f"{runs}/small-cpu/log.jsonl", "step")}
    stream = {r["step"]: r["loss"] for r in records(f"{runs}/small-gpu-stream/log.jsonl", "step")}
    ref = {r["step"]: r["loss"] for r in records(f"{runs}/small-gpu-noise/log.jsonl", "step")}
    # "Within bf16 noise", measured in this same run: the default GPU run and a third GPU run that
    # differs only in its attention kernel (cuDNN vs ghtier's) are the same math with different bf16
    # rounding; their spread is the bf16 noise, independent of the two curves under test. Up to step 10
    # (LR still warming up) both tested curves must agree with the CPU to 2e-3, which catches any real
    # bias (measured before: < 8e-4). From step 11 trajectories amplify rounding differences (loss
    # spikes near the LR peak), so each must stay within max(2%, 2 x the running maximum of that spread).
    print("step | cpu fp32  | gpu bf16  | rel diff | gpu stream+recompute | rel diff | bf16 spread | bound")
    worst, worst_s, noise, lc, viol = 0.0, 0.0, 0.0, True, []
    for s in range(1, 21):
        c, g, st, rf = cpu.get(s), gpu.get(s), stream.get(s), ref.get(s)
        if c is None or g is None or st is None or rf is None:
            print(f"{s:4d} | missing (cpu {c}, gpu {g}, stream {st}, noise reference {rf})")
            lc = False
            continue
        d, ds = abs(g - c) / c, abs(st - c) / c
        noise = max(noise, abs(g - rf) / c)
        bound = 2e-3 if s <= 10 else max(0.02, 2 * noise)
        worst, worst_s = max(worst, d), max(worst_s, ds)
        if d > bound or ds > bound:
            lc = False
            viol.append(s)
        print(f"{s:4d} | {c:9.5f} | {g:9.5f} | {d:8.2e} | {st:9.5f}            | {ds:8.2e} | {noise:11.2e} | "
              f"{bound:.2e}{'  <-- outside' if s in viol else ''}")
    summary["first20_max_rel_diff_gpu"] = worst
    summary["first20_max_rel_diff_stream_recompute"] = worst_s
    summary["first20_bf16_spread_attention_kernels"] = noise
    summary["first20_steps_outside_bound"] = viol
    print(f"first 20 steps track the CPU backend within bf16 noise: worst gpu {worst:.2e}, stream+recompute "
          f"{worst_s:.2e}, bf16 spread {noise:.2e} -> {'PASS' if lc else 'FAIL at steps ' + str(viol)}")
    ok &= lc
    ev_gpu = records(f"{runs}/small-gpu/log.jsonl", "eval")
    ev_tiny = records(tiny_log, "eval")
    if ev_gpu and ev_tiny:
        g, t = ev_gpu[-1]["eval_loss"], ev_tiny[-1]["eval_loss"]
        summary.update({"small_gpu_eval_loss": g, "small_gpu_eval_step": ev_gpu[-1]["step"],
                        "tiny_cpu_demo_eval_loss": t, "tiny_cpu_demo_eval_step": ev_tiny[-1]["step"]})
        print(f"final eval loss: small on GPU {g:.4f} (step {ev_gpu[-1]['step']}) vs tiny CPU demo {t:.4f} "
              f"(step {ev_tiny[-1]['step']}) -> {'PASS' if g < t else 'FAIL'}")
        ok &= g < t
    else:
        print("final eval loss: missing (see the logs)")
    ev_delay = records(f"{runs}/small-gpu-delay/log.jsonl", "eval")
    if ev_gpu and ev_delay:
        g, d = ev_gpu[-1]["eval_loss"], ev_delay[-1]["eval_loss"]
        rel = (d - g) / g
        summary.update({"small_gpu_delay_eval_loss": d, "small_gpu_delay_eval_step": ev_delay[-1]["step"],
                        "small_gpu_delay_rel_to_exact": rel})
        print(f"delayed update (GHT_OPT_DELAY=1): eval loss {d:.4f} at step {ev_delay[-1]['step']} vs exact {g:.4f} "
              f"-> {100 * rel:+.2f}% ({'within' if abs(rel) <= 0.01 else 'OUTSIDE'} the 1% of issue 14)")
    else:
        print("delayed update: eval loss missing (see train_small_gpu_delay.log)")
        ok = False
if "bench" in parts:
    print()
    print("| run | MFU | tokens/s | step ms | fwd ms | bwd ms | opt exposed ms | opt update ms | speculated M params | link GB h2d/d2h "
          "| state GiB HBM/host | HBM peak GiB (plan, ratio) | host peak GiB (plan, ratio) | spills |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in ["bench_" + n for n in os.environ["BENCH_RUNS"].split()]:
        path = f"{res}/train_{name}_profile.json"
        try:
            p = json.load(open(path))
        except (OSError, ValueError):
            print(f"| {name} | missing | | | | | | | | | | | | |")
            ok = False
            continue
        m = p["median_excluding_first_step"]
        summary[name] = m
        pl = p.get("placement", {})
        mem = pl.get("memory", {})
        G = 2.0 ** 30
        def peak_vs_plan(tier):
            peak, plan = mem.get(tier, {}).get("peak", 0), pl.get(f"plan_{tier}_bytes", 0)
            m[f"{tier}_peak_over_plan"] = peak / plan if plan else None
            return f"{peak / G:.2f} ({plan / G:.2f}, {peak / plan:.3f})" if plan else f"{peak / G:.2f} (-)"
        print(f"| {name} | {100 * m['mfu']:.1f}% | {m['tokens_per_s']:.0f} | {m['wall_ms']:.0f} | {m['forward_ms']:.0f} | "
              f"{m['backward_ms']:.0f} | {m['opt_exposed_ms']:.0f} | {m['opt_update_ms']:.0f} | "
              f"{m.get('speculated_params', 0) / 1e6:.0f} | {m['link_gb_h2d']:.1f}/{m['link_gb_d2h']:.1f} | "
              f"{pl.get('state_hbm_bytes', 0) / G:.1f}/{pl.get('state_host_bytes', 0) / G:.1f} | "
              f"{peak_vs_plan('hbm')} | {peak_vs_plan('host')} | {pl.get('spills', '-')} |")
    if "bench_default" in summary and "bench_hbm" in summary and summary["bench_hbm"]["mfu"] > 0:
        r = summary["bench_default"]["mfu"] / summary["bench_hbm"]["mfu"]
        summary["default_over_hbm"] = r
        print(f"default (plan) / everything in HBM: {r:.3f} (goal: within 5%)")
    if "bench_host" in summary and "bench_hbm" in summary and summary["bench_hbm"]["mfu"] > 0:
        tax = 1 - summary["bench_host"]["mfu"] / summary["bench_hbm"]["mfu"]
        summary["offload_tax"] = tax
        print(f"offload tax (1 - MFU_host / MFU_hbm): {100 * tax:.1f}%; goal: >= 55% MFU with the state on the host")
    print("medians exclude the first (warm-up) step;", "formula:",
          json.load(open(f"{res}/train_bench_host_profile.json")).get("formula", "?")
          if os.path.exists(f"{res}/train_bench_host_profile.json") else "")
summary["pass"] = bool(ok)
json.dump(summary, open(f"{res}/train_gpu_summary_{'_'.join(parts)}.json", "w"), indent=2)
sys.exit(0 if ok else 1)
EOF
[ $? -eq 0 ] || fail=1
exit $fail
