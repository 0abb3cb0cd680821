#!/usr/bin/env bash
# bench/trainer/sweep.py on the CPU (no GPU, no PyTorch needed):
#  1. its shapes cover the issue's ranges and fit the size limit;
#  2. `--list --ght`: every shape's parameter count and FLOPs per token equal ght's own (`ght plan
#     --json`: bf16 weight bytes / 2, step_flops / tokens), ght resolves the same model fields,
#     and ght's plan keeps everything in HBM of an H200;
#  3. the run pipeline on the `smoke` shape with a stand-in ght whose `train --backend cuda` runs the
#     CPU backend with the sweep's exact command line and writes a profile.json: data shards, the
#     ght command, profile parsing, sweep.json and the table;
#  4. where PyTorch imports (SWEEP_TEST_PYTHON, default python3), the peer through the sweep on the
#     CPU (eager), the peer alone learning a fixed batch, the peer's fp32 logits against `ght
#     logits` on an exported model, and its CE, aux, grad norm and one AdamW update against ght's
#     CPU backend (the same model and step); else "skipped" for that part.
# Usage: bash sweep_shapes_test.sh <path-to-ght> <project-root>
set -u
GHT=$(realpath "$1")
ROOT=$2
SWEEP=$ROOT/bench/trainer/sweep.py
command -v python3 >/dev/null || { echo "sweep_shapes_test: skipped: no python3"; exit 0; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# 1. The default shapes span the issue's ranges.
python3 - "$ROOT" <<'EOF' || fail "the default shapes do not cover the issue's ranges"
import sys
sys.path.insert(0, sys.argv[1] + "/bench/trainer")
import sweep, torch_peer as tp
ms = [sweep.full_model(s) for s in sweep.SHAPES if s.get("default", True)]
def span(key, lo, hi):
    v = [m[key] for m in ms]
    assert min(v) == lo and max(v) == hi, (key, sorted(v))
assert len(ms) >= 6, len(ms)
span("d_model", 1024, 4096)
span("experts", 16, 128)
span("expert_ffn", 512, 2048)
assert {m["top_k"] for m in ms} >= {1, 2, 4, 8}
gqa = [m["heads"] // m["kv_heads"] for m in ms]
assert min(gqa) == 1 and max(gqa) == 8, gqa
assert {m["head_dim"] for m in ms} == {64, 128}
micro = [m["seq_len"] * m["micro_batch"] for m in ms]
assert min(micro) == 4096 and max(micro) == 16384, micro
assert {m["tied_embeddings"] for m in ms} == {True, False}
vocab = [m["vocab"] for m in ms]
assert 32000 <= min(vocab) <= 32768 and max(vocab) == 151936, vocab
big = [(m["d_model"], tp.total_params(m)) for m in ms if tp.total_params(m) > 4e9]
assert not big, big
# The seed's count of seed-21b, by hand (as tests/trainer/model_test.cpp counts it for ght):
# 6 * 3,320,049,152 active parameters with the tied embedding + 12 * 30 * 4096 * 4096.
s21 = dict(next(s for s in sweep.SHAPES if s["name"] == "seed21b-4l")["model"], layers=30)
assert tp.active_params(s21) == 3320049152, tp.active_params(s21)
assert tp.seed_flops_per_token(s21) == 6 * 3320049152 + 12 * 30 * 4096 * 4096, tp.seed_flops_per_token(s21)
EOF

# 2. The sweep's counts against ght's.
if python3 "$SWEEP" --list --ght "$GHT" --shapes all >"$TMP/list.txt" 2>&1; then
  grep -q "shapes agree with" "$TMP/list.txt" || fail "--list did not report agreement"
  [ "$(grep -c '| agree, all HBM' "$TMP/list.txt")" -ge 7 ] || { fail "--list rows"; cat "$TMP/list.txt" >&2; }
else
  fail "sweep.py --list --ght disagrees with ght:"; cat "$TMP/list.txt" >&2
fi
python3 "$SWEEP" --list --shapes nosuch >/dev/null 2>"$TMP/err.txt" && fail "an unknown shape was accepted"
grep -q "unknown shape" "$TMP/err.txt" || fail "no message for an unknown shape"

# 3. The pipeline with a stand-in for the CUDA backend.
cat >"$TMP/ght" <<EOF
#!/usr/bin/env bash
# ght, except that 'train --backend cuda' trains on the CPU backend and writes a profile.json
# (tokens/s from log.jsonl), so that the sweep's command line and parsing run without a GPU.
if [ "\$1" = train ] && [[ " \$* " == *" --backend cuda "* ]]; then
  args=(); out=
  while [ \$# -gt 0 ]; do
    case "\$1" in
      --backend) args+=(--backend cpu); shift 2 ;;
      --profile-steps) shift 2 ;;
      --out) out=\$2; args+=("\$1" "\$2"); shift 2 ;;
      *) args+=("\$1"); shift ;;
    esac
  done
  "$GHT" "\${args[@]}" || exit \$?
  python3 - "\$out" <<'PY'
import json, sys
out = sys.argv[1]
steps = [json.loads(l) for l in open(out + "/log.jsonl") if '"type":"step"' in l]
tps = sorted(s["tokens_per_s"] for s in steps[1:])
med = tps[len(tps) // 2]
json.dump({"flops_per_token": 1.0, "tokens_per_step": 1, "placement": {"state_host_bytes": 0, "recomputed_layers": 0,
           "memory": {"hbm": {"peak": 1}}}, "steps": steps,
           "median_excluding_first_step": {"tokens_per_s": med, "mfu": 1e-9, "wall_ms": 1.0}},
          open(out + "/profile.json", "w"))
PY
  exit 0
fi
exec "$GHT" "\$@"
EOF
chmod +x "$TMP/ght"
if python3 "$SWEEP" --ght "$TMP/ght" --shapes smoke --parts ght --steps 3 --out "$TMP/res" --runs "$TMP/runs" \
    --data-dir "$TMP/data" >"$TMP/run.txt" 2>&1; then
  python3 - "$TMP/res" <<'EOF' || { fail "sweep results"; cat "$TMP/run.txt" >&2; }
import json, sys
j = json.load(open(sys.argv[1] + "/sweep.json"))
r = j["shapes"][0]
assert r["name"] == "smoke" and r["ght"]["tokens_per_s"] > 0, r
assert r["ght"]["profile_steps"] == 3, r["ght"]
assert "--steps 3" in r["ght"]["command"] and "-o model.tied_embeddings=false" in r["ght"]["command"]
md = open(sys.argv[1] + "/sweep.md").read()
assert "| smoke |" in md and "ght ÷ compile" in md and "ght MFU seed's count" in md, md
want = r["ght"]["tokens_per_s"] * r["counts"]["seed_flops_per_token"] / 989.4e12
assert abs(r["ght"]["mfu_seed"] - want) <= 1e-12 * want, (r["ght"]["mfu_seed"], want)
EOF
  [ -f "$TMP/data/sweep-rand-512/prep.json" ] || fail "no data shards"
else
  fail "the sweep's pipeline failed:"; cat "$TMP/run.txt" >&2
fi

# 4. The PyTorch peer on the CPU, where PyTorch is installed.
PY=${SWEEP_TEST_PYTHON:-python3}
if "$PY" -c "import torch" 2>/dev/null; then
  if python3 "$SWEEP" --ght "$TMP/ght" --shapes smoke --parts peer --modes eager --peer-device cpu --python "$PY" \
      --out "$TMP/res2" --runs "$TMP/runs" --data-dir "$TMP/data" >"$TMP/peer.txt" 2>&1; then
    python3 - "$TMP/res2" <<'EOF' || { fail "peer results"; cat "$TMP/peer.txt" >&2; }
import json, sys
s = json.load(open(sys.argv[1] + "/sweep.json"))["shapes"][0]
r = s["peer"]["eager"]
assert r["tokens_per_s"] > 0 and r["finite"] and r["params_total"] == s["counts"]["params_total"], r
EOF
  else
    fail "the sweep's peer on the CPU failed:"; cat "$TMP/peer.txt" >&2
  fi
  "$GHT" train --model tiny --print-config >"$TMP/tiny.json"
  "$PY" "$ROOT/bench/trainer/torch_peer.py" --config-json "$TMP/tiny.json" --device cpu --modes eager \
    --warmup 1 --steps 25 --same-batch --lr 3e-3 >"$TMP/learn.txt" 2>&1 || fail "torch_peer on the CPU failed"
  python3 - "$TMP/learn.txt" <<'EOF' || { fail "the peer does not learn a fixed batch"; cat "$TMP/learn.txt" >&2; }
import json, sys
r = [json.loads(l[10:]) for l in open(sys.argv[1]) if l.startswith("PEER_JSON ")][0]
assert r["loss_last"] < 0.5 * r["loss_first"] and r["experts"] == "grouped_mm", r
print(f"peer learns a fixed batch: {r['loss_first']:.3f} -> {r['loss_last']:.3f}")
EOF
  # The same math as ght's: fp32 CPU logits of an exported model against `ght logits`.
  "$GHT" export --hf "$TMP/hf" --init tiny --seed 7 >/dev/null || fail "ght export"
  "$PY" "$ROOT/bench/trainer/torch_peer.py" --config-json "$TMP/tiny.json" --parity-hf "$TMP/hf" --ght "$GHT" --device cpu \
    >"$TMP/parity.txt" 2>&1 || { fail "the peer's logits differ from ght's:"; cat "$TMP/parity.txt" >&2; }
  grep -h parity_max_rel_err "$TMP/parity.txt"
  # Loss terms, gradients and the AdamW update: two steps against ght's CPU backend.
  "$PY" "$ROOT/bench/trainer/torch_peer.py" --config-json "$TMP/tiny.json" --parity-train "$TMP/pt" --ght "$GHT" \
    >"$TMP/parity_train.txt" 2>&1 || { fail "the peer's training step differs from ght's:"; cat "$TMP/parity_train.txt" >&2; }
  grep -h rel_err "$TMP/parity_train.txt"
else
  echo "sweep_shapes_test: PyTorch part skipped: $PY cannot import torch"
fi

if [ "$failures" -eq 0 ]; then
  echo "sweep_shapes_test: all checks passed"
  exit 0
fi
echo "sweep_shapes_test: $failures failure(s)"
exit 1
