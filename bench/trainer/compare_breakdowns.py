#!/usr/bin/env python3
"""Two kernel breakdowns side by side, per op: where one traced step gains or loses GPU time
against another (the JSON that `ght train --trace-kernels` writes as kernel_breakdown.json).

    python3 bench/trainer/compare_breakdowns.py A.json B.json [--min-ms 6] [--names A B]

Prints a markdown table: each op's busy milliseconds and TFLOP/s in A and in B and the change,
largest change first; ops that moved by less than --min-ms are summed in one row; then the
traced windows. Exit status 2 when a file is missing or not a breakdown."""
import argparse
import json
import sys


def load(path):
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        print(f"compare_breakdowns: {path}: {e}", file=sys.stderr)
        sys.exit(2)
    if not isinstance(d, dict) or "ops" not in d or "window_ms" not in d:
        print(f"compare_breakdowns: {path}: not a kernel breakdown (no 'ops' or 'window_ms')", file=sys.stderr)
        sys.exit(2)
    return d


def rate(op):
    return f"{op['tflops']:.0f}" if op.get("tflops") else "–"


def table(a, b, names, min_ms):
    ops_a = {o["op"]: o for o in a["ops"]}
    ops_b = {o["op"]: o for o in b["ops"]}
    empty = {"busy_ms": 0.0}

    def change(name):
        return ops_b.get(name, empty)["busy_ms"] - ops_a.get(name, empty)["busy_ms"]

    order = sorted(set(ops_a) | set(ops_b), key=lambda n: -abs(change(n)))
    lines = [f"| op | {names[0]}: ms | TFLOP/s | {names[1]}: ms | TFLOP/s | change ms |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    rest, rest_n = 0.0, 0
    for name in order:
        if abs(change(name)) < min_ms:
            rest += change(name)
            rest_n += 1
            continue
        x, y = ops_a.get(name, empty), ops_b.get(name, empty)
        lines.append(f"| {name} | {x['busy_ms']:.1f} | {rate(x)} | {y['busy_ms']:.1f} | {rate(y)} | {change(name):+.1f} |")
    if rest_n:
        lines.append(f"| the other {rest_n} ops | | | | | {rest:+.1f} |")
    lines.append(f"| **traced window** | {a['window_ms']:.1f} | | {b['window_ms']:.1f} | | "
                 f"{b['window_ms'] - a['window_ms']:+.1f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--min-ms", type=float, default=6.0, help="ops that moved less are summed in one row")
    ap.add_argument("--names", nargs=2, default=None, help="column names (default: the files' names)")
    args = ap.parse_args()
    a, b = load(args.a), load(args.b)
    print(table(a, b, args.names or [args.a, args.b], args.min_ms))


if __name__ == "__main__":
    main()
