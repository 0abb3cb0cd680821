#!/usr/bin/env python3
"""Compare two training runs, for the CLI tests of several processes.

  compare_runs.py steps RUN_A RUN_B BOUND FIRST [NORM_BOUND]
                                                  losses, grad norms and aux losses of the steps
                                                  after FIRST within BOUND relative (grad norms
                                                  within NORM_BOUND when given)
  compare_runs.py weights FILE_A FILE_B BOUND     the same tensors in two F32 safetensors files,
                                                  within BOUND of the largest |weight|
Exits non-zero naming the first difference; prints the worst one otherwise."""
import json
import struct
import sys


def steps(run, first):
    with open(run + "/log.jsonl") as f:
        return [r for r in map(json.loads, f) if r.get("type") == "step" and r["step"] > first]


def weights(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        out[name] = struct.unpack(f"<{(e - b) // 4}f", raw[8 + n + b:8 + n + e])
    return out


def compare_steps(a, b, bound, first, norm_bound):
    sa, sb = steps(a, first), steps(b, first)
    if not (len(sa) == len(sb) > 0):
        sys.exit(f"{a}: {len(sa)} steps after {first}, {b}: {len(sb)}")
    worst = 0.0
    for x, y in zip(sa, sb):
        for k in ("loss", "grad_norm", "aux_loss"):
            rel = abs(x[k] - y[k]) / abs(x[k])
            limit = norm_bound if k == "grad_norm" else bound
            worst = max(worst, rel)
            if rel > limit:
                sys.exit(f"step {x['step']} {k}: {x[k]!r} vs {y[k]!r}, relative {rel:.2e} > {limit}")
    print(f"{len(sa)} steps within {worst:.1e} relative (bound {bound}" +
          (f", grad norms {norm_bound})" if norm_bound != bound else ")"))


def compare_weights(pa, pb, bound):
    wa, wb = weights(pa), weights(pb)
    if wa.keys() != wb.keys():
        sys.exit(f"{pa} and {pb} hold different tensors: {sorted(wa.keys() ^ wb.keys())[:5]}")
    scale = max(abs(v) for t in wb.values() for v in t)
    worst = max(abs(x - y) for k in wa for x, y in zip(wa[k], wb[k])) / scale
    if worst > bound:
        sys.exit(f"{pa} vs {pb}: weights differ by {worst:.2e} of the largest weight > {bound}")
    print(f"{len(wa)} tensors within {worst:.1e} of the largest weight (bound {bound})")


if __name__ == "__main__":
    if len(sys.argv) in (6, 7) and sys.argv[1] == "steps":
        bound = float(sys.argv[4])
        compare_steps(sys.argv[2], sys.argv[3], bound, int(sys.argv[5]), float(sys.argv[6]) if len(sys.argv) == 7 else bound)
    elif len(sys.argv) == 5 and sys.argv[1] == "weights":
        compare_weights(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        sys.exit(__doc__)
