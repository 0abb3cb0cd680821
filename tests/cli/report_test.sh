#!/usr/bin/env bash
# `ght report`: two tiny CPU runs and a synthetic GPU-style run (profile records, profile.json,
# per-tier bytes, a resumed step, a torn last line) into one HTML page. Checks that the page is
# self-contained (no network references, no scripts), has one SVG per chart with a title, one
# polyline per run that has the data, a legend naming the runs, the step breakdown medians, and
# that a missing run is an error.
source "$(dirname "$0")/train_common.sh"
prep_corpus "$work/data"
# CPU runs (no profile, no MFU) on every machine: the GPU-style run below is synthetic.
args=(--backend cpu --model tiny -o model.micro_batch=2 -o model.seq_len=32 -o train.eval_every=5 -o train.eval_batches=1
      -o train.log_every=5 -o train.threads=1 -o schedule.warmup_steps=2 --data "$work/data" --steps 10)
"$ght" train "${args[@]}" --out "$work/runs/a" >/dev/null || fail "training run a failed"
"$ght" train "${args[@]}" -o schedule.lr=1e-3 --out "$work/runs/b" >/dev/null || fail "training run b failed"

# What the CUDA trainer writes, plus the per-tier memory fields step records may carry.
mkdir -p "$work/runs/gpu"
python3 - "$work/runs/gpu" <<'PY'
import json, sys
d = sys.argv[1]
with open(d + "/log.jsonl", "w") as f:
    w = lambda r: f.write(json.dumps(r) + "\n")
    w({"type": "config", "step": 0, "config": {"model": {"name": "bench-h200"}, "train": {"backend": "cuda"}}})
    w({"type": "mfu_formula", "formula": "6*N + 12*L*H*d*T over 989.4 TFLOP/s",
       "seed_formula": "MFU (seed's count) = 6*N_active + 12*L*T*d_model over 989.4 TFLOP/s"})
    for s in range(1, 10):
        w({"type": "step", "step": s, "loss": 5.0 - 0.1 * s, "grad_norm": 1.0, "lr": 1e-4 * s,
           "tokens_per_s": 40000 + 100 * s, "mfu": 0.40 + 0.01 * s, "mfu_seed": 0.45 + 0.01 * s,
           "elapsed_s": s,
           "hbm_bytes": (60 + s) * 2**30, "host_bytes": 200 * 2**30,
           "mem": {"pinned": 3 * 2**30, "device_pool": {"current": 5 * 2**30, "peak": 6 * 2**30}},
           # the statistics adaptor's JSON: "all" and each tier chart, classes do not
           "memory": {"all": {"current": 9 * 2**30, "peak": 9 * 2**30},
                      "tiers": {"managed": {"current": 2**30, "peak": 2**30}},
                      "classes": {"weight": {"current": 2**30}}}})
        w({"type": "profile", "step": s, "wall_ms": 100.0 if s == 1 else 40.0,
           "forward_ms": 90.0 if s == 1 else 10.0, "backward_ms": 20.0, "opt_exposed_ms": 5.0,
           "opt_stall_ms": 3.0, "step_gap_ms": 2.0,
           "predicted": {"forward_ms": 12.0, "backward_ms": 24.0, "opt_exposed_ms": 0.0, "wall_ms": 36.0}})
        if s == 3:  # a resume re-logs step 3: the later record wins
            w({"type": "step", "step": 3, "loss": 4.0, "tokens_per_s": 41000, "mfu": 0.45,
               "mfu_seed": 0.50, "elapsed_s": 3})
        if s % 3 == 0:
            w({"type": "eval", "step": s, "eval_loss": 4.5 - 0.1 * s, "elapsed_s": s})
    f.write('{"type": "step", "step": 10, "lo')  # torn by a kill
# profile.json covers steps the log's profile records already have: the log's win.
json.dump({"steps": [{"step": 1, "wall_ms": 999.0, "forward_ms": 999.0}]}, open(d + "/profile.json", "w"))
PY

out="$work/out/report.html"
"$ght" report "$work/runs/a" "$work/runs/b" "$work/runs/gpu/log.jsonl" --out "$out" > "$work/report.log" \
  || { cat "$work/report.log"; fail "ght report failed"; }
grep -q "wrote $out (3 runs" "$work/report.log" || { cat "$work/report.log"; fail "no 'wrote' line"; }

python3 - "$out" <<'PY' || fail "the report's structure is wrong (above)"
import re, sys
from html.parser import HTMLParser

text = open(sys.argv[1], encoding="utf-8").read()
errors = []
def check(cond, msg):
    if not cond:
        errors.append(msg)

check(text.startswith("<!DOCTYPE html>"), "no doctype")
for bad in ("http://", "https://", "<script", "<link", "<img", "<iframe", "url(", "@import", " src="):
    check(bad not in text.lower(), f"not self-contained: contains {bad!r}")

class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.svgs, self.stack, self.tables, self.cell = [], [], [], None
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg":
            self.svgs.append({"attrs": a, "title": None, "polylines": [], "rects": [], "legend": []})
        cur = self.svgs[-1] if self.svgs and "svg" in self.stack else None
        if cur is not None and tag == "polyline":
            cur["polylines"].append(a)
        if cur is not None and tag == "rect" and "data-run" in a:
            cur["rects"].append(a)
        if tag == "table":
            self.tables.append([])
        if tag == "tr" and self.tables:
            self.tables[-1].append([])
        if tag in ("td", "th"):
            self.cell = ""
        self.stack.append(tag)
    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.tables[-1][-1].append(self.cell.strip())
            self.cell = None
        while self.stack and self.stack.pop() != tag:
            pass
    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data
        if self.svgs and "svg" in self.stack:
            cur = self.svgs[-1]
            if self.stack[-1] == "title" and self.stack[-2] == "svg":
                cur["title"] = data
            if "g" in self.stack and self.stack[-1] == "text":
                cur["legend"].append(data)

p = Page()
p.feed(text)
charts = {s["attrs"].get("data-chart"): s for s in p.svgs}
for s in p.svgs:
    check(s["title"], f"svg {s['attrs'].get('data-chart')} has no <title>")
    check(s["attrs"].get("viewbox"), f"svg {s['attrs'].get('data-chart')} has no viewBox")

runs = ["a", "b", "gpu"]
expect = {"loss": runs, "eval_loss": runs, "grad_norm": runs, "lr": runs, "tokens_per_s": runs,
          "mfu": ["gpu"], "mem-hbm": ["gpu"], "mem-host": ["gpu"], "mem-pinned": ["gpu"],
          "mem-device_pool": ["gpu"], "mem-all": ["gpu"], "mem-managed": ["gpu"]}
for chart, want in expect.items():
    s = charts.get(chart)
    if s is None:
        errors.append(f"no chart {chart}; have {sorted(charts)}")
        continue
    got = [pl.get("data-run") for pl in s["polylines"]]
    check(sorted(got) == sorted(want), f"{chart}: polylines for {got}, want one each for {want}")
    check(s["legend"] == want, f"{chart}: legend {s['legend']}, want {want}")
    h = float(s["attrs"]["height"]); w = float(s["attrs"]["width"])
    for pl in s["polylines"]:
        for pt in pl["points"].split():
            x, y = map(float, pt.split(","))
            check(0 <= x <= w and 0 <= y <= h, f"{chart}: point {pt} outside the {w}x{h} svg")
check(len(charts) == len(expect) + 1, f"charts {sorted(charts)}: want {len(expect) + 1}")

def points(chart, run):
    pl = [x for x in charts[chart]["polylines"] if x.get("data-run") == run]
    return len(pl[0]["points"].split()) if pl else -1
check(points("loss", "a") == 10, f"run a: {points('loss', 'a')} loss points, want 10")
check(points("eval_loss", "a") == 2, f"run a: {points('eval_loss', 'a')} eval points, want 2 (steps 5, 10)")
check(points("loss", "gpu") == 9, f"gpu: {points('loss', 'gpu')} loss points, want 9 (step 3 once)")

# Step breakdown: a bar for the run that has profiles, medians without the warm-up step.
bars = charts.get("breakdown")
check(bars is not None and {r.get("data-run") for r in bars["rects"]} == {"gpu"}, "breakdown bar: want gpu only")
if bars:
    check({r.get("data-phase") for r in bars["rects"]} == {"forward", "backward", "opt exposed", "other"},
          f"breakdown phases {[r.get('data-phase') for r in bars['rects']]}")
table = next((t for t in p.tables if t and "forward_ms" in t[0]), None)
check(table is not None, "no breakdown table")
if table:
    head = table[0]
    row = {r[0]: dict(zip(head, r)) for r in table[1:]}
    check(row["gpu"]["forward_ms"] == "10.00", f"median forward_ms {row['gpu']['forward_ms']}, want 10.00")
    check(row["gpu"]["wall_ms"] == "40.00", f"median wall_ms {row['gpu']['wall_ms']}, want 40.00")
    check(row["a"]["forward_ms"] == "–", f"run a has no profile: {row['a']['forward_ms']}")
    check(row["gpu"].get("predicted backward_ms") == "24.00",
          f"the plan's predicted backward beside the measured one: {row['gpu'].get('predicted backward_ms')}")
# The runs table: strict MFU and the seed's count side by side (medians over steps 1-9, step 3's
# later record winning: strict 41,42,45,44..49 -> 45%; the seed's 46,47,50,49..54 -> 50%).
summary = next((t for t in p.tables if t and "median MFU" in t[0]), None)
check(summary is not None, "no runs table")
if summary:
    row = {r[0].split()[-1]: dict(zip(summary[0], r)) for r in summary[1:]}
    check(row["gpu"]["median MFU"] == "45%", f"median strict MFU {row['gpu']['median MFU']}, want 45%")
    check(row["gpu"].get("median MFU (seed's count)") == "50%",
          f"median MFU under the seed's count {row['gpu'].get('median MFU (seed' + chr(39) + 's count)')}, want 50%")
    check(row["a"].get("median MFU (seed's count)") == "–", "run a has no MFU: want a dash")
check("MFU (seed&#x27;s count) = 6*N_active" in text or "MFU (seed&#39;s count) = 6*N_active" in text
      or "MFU (seed's count) = 6*N_active" in text, "the seed's formula is not printed")
check("1 line(s) that are not JSON objects were skipped" in text, "the torn line is not reported")
check("bench-h200 (cuda)" in text, "the model from the config record is missing")

if errors:
    print("\n".join(errors))
    sys.exit(1)
print(f"report ok: {len(charts)} charts, {sum(len(s['polylines']) for s in p.svgs)} polylines")
PY

# A run that does not exist is an error, and nothing is written.
if "$ght" report "$work/runs/a" "$work/runs/nope" --out "$work/out/bad.html" 2> "$work/err.log"; then
  fail "a missing run was accepted"
fi
grep -q "nope" "$work/err.log" || { cat "$work/err.log"; fail "the error does not name the missing run"; }
[ ! -e "$work/out/bad.html" ] || fail "a report was written despite the error"
# A benchmark run directory that kept only profile.json (no log.jsonl): throughput, MFU, the
# breakdown and the per-tier bytes of its steps still make a report.
mkdir -p "$work/runs/bench"
python3 - "$work/runs/bench" <<'PY'
import json, sys
steps = [{"step": s, "wall_ms": 500.0, "forward_ms": 200.0, "backward_ms": 250.0, "opt_exposed_ms": 50.0,
          "tokens_per_s": 30000 + s, "mfu": 0.2 + 0.01 * s,
          "memory": {"hbm": {"current": 100 * 2**30, "peak": 101 * 2**30, "classes": {}}}} for s in range(1, 5)]
json.dump({"formula": "strict MFU", "steps": steps}, open(sys.argv[1] + "/profile.json", "w"))
PY
"$ght" report "$work/runs/bench" --out "$work/out/bench.html" > "$work/bench.log" \
  || { cat "$work/bench.log"; fail "a profile.json-only run directory was refused"; }
python3 - "$work/out/bench.html" <<'PY' || fail "the profile.json-only report lacks its charts (above)"
import sys
t = open(sys.argv[1], encoding="utf-8").read()
for want in ("tokens/s", "MFU", "hbm"):
    if want not in t:
        print(f"missing {want!r}")
        sys.exit(1)
if t.count("<polyline") < 3:
    print("fewer than 3 polylines")
    sys.exit(1)
PY
echo "ght report: ok"
