#!/usr/bin/env python3
"""The markdown summary of bench/dist/multi_gpu.sh: reads the runs under OUT, prints markdown,
writes OUT/summary.json. Usage: summary.py OUT (environment: DRY, GPUS, LAUNCHER, PARTS, ACCUM, LOSS_H)."""
import json
import os
import statistics
import sys

out = sys.argv[1]
runs = os.path.join(out, "runs")
dry = os.environ.get("DRY") == "1"
gpus = int(os.environ.get("GPUS", "2"))
parts = os.environ.get("PARTS", "").split(",")
launcher = os.environ.get("LAUNCHER", "mpirun")
summary = {"gpus": gpus, "dry_run": dry, "launcher": launcher, "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}}


def records(run, kind):
    path = os.path.join(runs, run, "log.jsonl")
    try:
        with open(path) as f:
            return [r for r in map(json.loads, f) if r.get("type") == kind]
    except OSError:
        return []


def profile(run):
    try:
        with open(os.path.join(runs, run, "profile.json")) as f:
            return json.load(f)
    except OSError:
        return None


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec="{:.3g}", none="n/a"):
    return none if x is None else spec.format(x)


def tokens_per_step(run):
    c = records(run, "config")
    if not c:
        return None
    m = c[0]["config"]["model"]
    return m["seq_len"] * m["micro_batch"] * m["grad_accum"]


status = {}
try:
    for line in open(os.path.join(out, "status.txt")):
        name, rc = line.split()
        status[name] = int(rc)
except OSError:
    pass

print(f"# Multi-GPU benchmark ({'DRY RUN on the CPU backend: checks the script, not a measurement' if dry else f'{gpus} GPUs'}, launched by {launcher})\n")
print("NCCL environment: " + (", ".join(f"{k}={v}" for k, v in sorted(summary["nccl_env"].items())) or "(none set)") + "\n")
print("| run | exit |\n| --- | --- |")
for name, rc in status.items():
    print(f"| {name} | {'ok' if rc == 0 else f'FAILED ({rc})'} |")
summary["status"] = status

if "check" in parts:
    print("\n## Correctness\n")
    checks = {}
    for name in status:
        if not name.startswith("check_"):
            continue
        lines = [l.rstrip() for l in open(os.path.join(out, name + ".log")) if l.strip() and not l.startswith("+ ")]
        keep = [l for l in lines if any(w in l for w in ("within", "identical", "refused", "skipped", "FAIL", "differs",
                                                         "export", "resharded", "DiLoCo", "missing shard"))]
        checks[name] = keep
        print(f"**{name[6:]}** ({'passed' if status[name] == 0 else 'FAILED'}):\n")
        for l in keep[-14:]:
            print(f"- {l}")
        print()
    summary["check"] = checks

if "scale" in parts:
    print("\n## Data-parallel scaling (state on the host, sharded)\n")
    res = {}
    for n, run in ((1, "scale-1"), (gpus, f"scale-{gpus}")):
        steps = records(run, "step")[1:]  # the first is a warm-up
        prof = profile(run) or {}
        psteps = [s for s in prof.get("steps", [])[1:] if not s.get("traced")]
        place = prof.get("placement", {})
        red, exp = median(s.get("dp_reduce_ms") for s in psteps), median(s.get("dp_reduce_exposed_ms") for s in psteps)
        res[n] = {
            "tokens_per_step": (tokens_per_step(run) or 0) * n,
            "tokens_per_s": median(s["tokens_per_s"] for s in steps),
            "mfu": median(s.get("mfu") for s in steps),
            "state_host_bytes_rank0": place.get("state_host_bytes"),
            "state_hbm_bytes_rank0": place.get("state_hbm_bytes"),
            "host_peak_bytes_rank0": place.get("memory", {}).get("host", {}).get("peak"),
            "wall_ms": median(s.get("wall_ms") for s in psteps),
            "backward_ms": median(s.get("backward_ms") for s in psteps),
            "reduce_ms": red,
            "reduce_exposed_ms": exp,
            "reduce_hidden_share": (1 - exp / red) if red and exp is not None else None,
            "gather_ms": median(s.get("dp_gather_ms") for s in psteps),
            "forward_wait_ms": median(s.get("opt_stall_ms") for s in psteps),
        }
    one, many = res[1], res[gpus]
    eff = many["tokens_per_s"] / (gpus * one["tokens_per_s"]) if one["tokens_per_s"] and many["tokens_per_s"] else None
    summary["scale"] = {"runs": res, "efficiency": eff, "target": 0.9}
    gib = lambda b: fmt(None if b is None else b / 2**30, "{:.2f} GiB")
    print("| | 1 rank | %d ranks |\n| --- | --- | --- |" % gpus)
    rows = [("tokens per step", "tokens_per_step", "{:,.0f}"), ("tokens/s (median, first step left out)", "tokens_per_s", "{:,.0f}"),
            ("MFU (strict)", "mfu", "{:.1%}"), ("step wall ms", "wall_ms", "{:.0f}"), ("backward ms", "backward_ms", "{:.0f}"),
            ("reduce-scatter GPU ms (sum over units)", "reduce_ms", "{:.1f}"),
            ("comm stream busy after the last backward (exposed) ms", "reduce_exposed_ms", "{:.1f}"),
            ("share of the reduce-scatter hidden behind the backward", "reduce_hidden_share", "{:.0%}"),
            ("all-gather GPU ms (sum over units, after each unit's update)", "gather_ms", "{:.1f}"),
            ("forward's wait for the update / gather ms", "forward_wait_ms", "{:.1f}")]
    for label, key, spec in rows:
        print(f"| {label} | {fmt(one[key], spec)} | {fmt(many[key], spec)} |")
    for label, key in (("host state of rank 0 (master, m, v)", "state_host_bytes_rank0"),
                       ("HBM state of rank 0", "state_hbm_bytes_rank0"), ("host peak of rank 0", "host_peak_bytes_rank0")):
        print(f"| {label} | {gib(one[key])} | {gib(many[key])} |")
    print(f"\nScaling efficiency tokens/s({gpus}) / ({gpus} x tokens/s(1)): **{fmt(eff, '{:.3f}')}** (target >= 0.9). "
          "Every rank holds the same share of the state as rank 0, to within ranks x 16 parameters per unit.")

if "diloco" in parts:
    print("\n## DiLoCo communication (H=2 measured; H=50, H=500 from the measured times)\n")
    run = f"diloco-{gpus}"
    outer, steps = records(run, "outer"), records(run, "step")
    # A step record's time is the inner step alone (the outer step runs after it is measured).
    tps = median(s["tokens_per_s"] for s in steps[1:]) or median(s["tokens_per_s"] for s in steps)
    tok = (tokens_per_step(run) or 0) * gpus
    t_inner = tok / tps if tps else None
    t_outer = median(o.get("seconds") for o in outer)
    t_ar = median(o.get("allreduce_seconds") for o in outer)
    share = {h: (t_outer / (h * t_inner + t_outer) if t_outer is not None and t_inner else None) for h in (50, 500)}
    summary["diloco"] = {"inner_step_s": t_inner, "outer_step_s": t_outer, "allreduce_s": t_ar, "share": share,
                         "outer_steps": len(outer), "target_share_h500": 0.02}
    print("| inner step s | outer step s (copies, all-reduce, update) | of it the all-reduce s | share at H=50 | share at H=500 |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| {fmt(t_inner)} | {fmt(t_outer)} | {fmt(t_ar)} | {fmt(share[50], '{:.2%}')} | {fmt(share[500], '{:.2%}')} |")
    print(f"\n{len(outer)} outer steps measured; share = t_outer / (H x t_inner + t_outer); target at H=500: <= 2%. "
          "t_inner: the median inner step after the first.")

if "loss" in parts:
    h = os.environ.get("LOSS_H", "50")
    print(f"\n## Loss: DiLoCo (H={h}) against data parallel at equal tokens\n")
    dp = {e["step"]: e["eval_loss"] for e in records("loss-dp", "eval")}
    dl = {e["step"]: e["eval_loss"] for e in records("loss-diloco", "eval")}
    summary["loss"] = {"data_parallel": dp, "diloco": dl, "H": int(h)}
    print("| step | data parallel eval loss | DiLoCo eval loss | DiLoCo - DP |\n| --- | --- | --- | --- |")
    for s in sorted(set(dp) | set(dl)):
        a, b = dp.get(s), dl.get(s)
        print(f"| {s} | {fmt(a, '{:.4f}')} | {fmt(b, '{:.4f}')} | {fmt(None if a is None or b is None else b - a, '{:+.4f}')} |")

with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
print(f"\nFull results: {out} (summary.json, *.log, runs/*/log.jsonl and profile.json)")
