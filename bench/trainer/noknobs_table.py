#!/usr/bin/env python3
"""The plan's own choice against hand settings, from a plan_noknobs.sh output folder.

    python3 bench/trainer/noknobs_table.py OUT_DIR

For each case (<case>.profile.json, the run with no option set) and each of its hand settings
(<case>.hand<i>.setting, .log, .profile.json), prints one markdown row: the setting, the median
step after the first (forward, backward, exposed update), tokens/s, strict MFU, and the step time
relative to the plan's choice (below 1.00: the hand setting was faster). A hand setting that the
plan refused, or whose run failed, is listed with the log's reason.
"""
import json
import pathlib
import re
import sys


def median_row(profile_path):
    try:
        d = json.loads(profile_path.read_text())
    except (OSError, ValueError):
        return None
    m = d.get("median_excluding_first_step")
    if not m or not m.get("wall_ms"):
        return None
    return m


def failure_reason(log_path):
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return "no log"
    for pattern in (r"no plan within[^\n]*", r"plan infeasible[^\n]*", r"out of memory[^\n]*", r"error:[^\n]*"):
        hit = re.search(pattern, text)
        if hit:
            return "refused: " + hit.group(0)[:160] if "plan" in pattern else "failed: " + hit.group(0)[:160]
    return "failed (see the log)"


def fmt(m, base_ms):
    ratio = f"{m['wall_ms'] / base_ms:.3f}" if base_ms else "n/a"
    return (f"{m['wall_ms'] / 1e3:.3f} s | {m['forward_ms'] / 1e3:.3f} | {m['backward_ms'] / 1e3:.3f} | "
            f"{m['opt_exposed_ms'] / 1e3:.3f} | {m['tokens_per_s']:,.0f} | {100 * m['mfu']:.1f}% | {ratio}")


def case_table(out, case):
    base = median_row(out / f"{case}.profile.json")
    base_ms = base["wall_ms"] if base else None
    rows = ["| setting | step | forward | backward | exposed update | tokens/s | strict MFU | step ÷ plan's |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    if base:
        rows.append("| **no option set (the plan's choice)** | " + fmt(base, base_ms) + " |")
    else:
        rows.append("| **no option set (the plan's choice)** | " + failure_reason(out / f"{case}.log") + " |||||||")
    hands = sorted(out.glob(f"{case}.hand*.setting"), key=lambda p: int(re.search(r"hand(\d+)", p.name).group(1)))
    best = None
    for s in hands:
        stem = s.name[: -len(".setting")]
        setting = "`" + s.read_text().strip().replace(",", " ") + "`"
        m = median_row(out / f"{stem}.profile.json")
        if m is None:
            rows.append(f"| {setting} | {failure_reason(out / f'{stem}.log')} |||||||")
            continue
        rows.append(f"| {setting} | " + fmt(m, base_ms) + " |")
        if best is None or m["wall_ms"] < best[1]:
            best = (setting, m["wall_ms"])
    lines = [f"### {case}", ""] + rows
    if base and best:
        lines += ["", f"Fastest hand setting: {best[0]} at {best[1] / 1e3:.3f} s; the plan's choice is "
                      f"{100 * (base_ms / best[1] - 1):+.1f}% against it."]
    return "\n".join(lines) + "\n"


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: noknobs_table.py OUT_DIR")
    out = pathlib.Path(sys.argv[1])
    if not out.is_dir():
        sys.exit(f"noknobs_table.py: {out} is not a folder")
    cases = sorted({p.name.split(".")[0] for p in out.glob("*.plan.txt")})
    if not cases:
        sys.exit(f"noknobs_table.py: no <case>.plan.txt in {out}")
    print("\n".join(case_table(out, c) for c in cases))


if __name__ == "__main__":
    main()
