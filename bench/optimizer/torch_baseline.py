#!/usr/bin/env python3
"""torch.optim.AdamW baselines for bench_optimizer, in Gparam/s.

  torch_fused_cuda   fused=True on CUDA, parameters, gradients and state in HBM (fp32)
  torch_foreach_cpu  foreach=True on the CPU, fp32, torch's default intra-op threads

Same sizes as bench_optimizer (256Mi and 2B parameters by default), split into tensors of
--tensor-params parameters as a model's layers would be. One warm-up step, then --runs timed
steps; median and spread ((max-min)/median). Prints JSON (also written to --json). When the
bench_optimizer JSON is given (--ght, or bench_optimizer.json beside --json), also prints
ght/torch ratios as a markdown table.
"""
import argparse
import json
import os
import statistics
import sys
import time


def timed(runs, fn, sync):
    fn()
    sync()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return out


def summary(path, params, seconds, extra):
    med = statistics.median(seconds)
    return dict(path=path, params=params, gparams_median=params / med / 1e9,
                seconds=dict(median_s=med, min_s=min(seconds), max_s=max(seconds),
                             spread=(max(seconds) - min(seconds)) / med, samples_s=seconds),
                **extra)


def make_params(torch, n, per, device):
    ps = []
    left = n
    while left > 0:
        k = min(per, left)
        p = torch.nn.Parameter(torch.empty(k, dtype=torch.float32, device=device).uniform_(-1, 1))
        p.grad = torch.empty_like(p).normal_(0, 1e-2)
        ps.append(p)
        left -= k
    return ps


def bench(torch, n, per, device, runs, **opt_kwargs):
    ps = make_params(torch, n, per, device)
    opt = torch.optim.AdamW(ps, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            **opt_kwargs)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    secs = timed(runs, opt.step, sync)
    del opt, ps
    if device == "cuda":
        torch.cuda.empty_cache()
    return secs


def ratios(ght_json, results):
    with open(ght_json) as f:
        ght = json.load(f)
    by = {(r["path"], r["params"]): r["gparams_median"] for r in results}
    lines = ["| ght path | params | ght Gparam/s | torch baseline | torch Gparam/s | ratio |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in ght.get("rows", []):
        key = r.get("torch_baseline")
        if not key or (key, r["params"]) not in by:
            continue
        t = by[(key, r["params"])]
        lines.append(f"| {r['path']} | {r['params']} | {r['gparams_median']:.3f} | {key} | "
                     f"{t:.3f} | {r['gparams_median'] / t:.2f}x |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[256 << 20, 2_000_000_000])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--tensor-params", type=int, default=32 << 20,
                    help="parameters per tensor (default 32Mi)")
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--ght", help="bench_optimizer JSON to compare with")
    ap.add_argument("--skip-cpu", action="store_true")
    ap.add_argument("--skip-cuda", action="store_true")
    args = ap.parse_args()

    import torch

    results = []
    info = dict(torch_version=torch.__version__, cpu_threads=torch.get_num_threads())
    for n in args.sizes:
        if torch.cuda.is_available() and not args.skip_cuda:
            secs = bench(torch, n, args.tensor_params, "cuda", args.runs, fused=True)
            results.append(summary("torch_fused_cuda", n, secs,
                                   dict(device=torch.cuda.get_device_name(0))))
            print(f"torch fused CUDA {n}: {results[-1]['gparams_median']:.3f} Gparam/s",
                  file=sys.stderr)
        if not args.skip_cpu:
            secs = bench(torch, n, args.tensor_params, "cpu", args.runs, foreach=True)
            results.append(summary("torch_foreach_cpu", n, secs,
                                   dict(threads=torch.get_num_threads())))
            print(f"torch foreach CPU {n}: {results[-1]['gparams_median']:.3f} Gparam/s",
                  file=sys.stderr)
    out = dict(info, results=results)
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    ght = args.ght
    if ght is None and args.json:
        cand = os.path.join(os.path.dirname(os.path.abspath(args.json)), "bench_optimizer.json")
        ght = cand if os.path.exists(cand) else None
    if ght:
        print("\n" + ratios(ght, results))


if __name__ == "__main__":
    main()
