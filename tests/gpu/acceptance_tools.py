#!/usr/bin/env python3
"""Helpers of tests/gpu/acceptance.sh (Python's standard library only).

  acceptance_tools.py compare A/metrics.jsonl B/metrics.jsonl --bound REL [--exact] [--from-step S] [--name N]
      per-step losses of run A against run B (rows matched by "step"): exit 0 when every step both have,
      from S on, differs by at most REL relative (--exact: bit for bit, as printed), printing the largest
      difference as a `compare=` line.
  acceptance_tools.py tokens FILE --count N --vocab V [--seed S]
      N random tokens below V as little-endian uint16 (nanoGPT's format), reproducibly.
  acceptance_tools.py bench LOGDIR --name N --dtype D --peak-tflops P [--mem-bytes B] [--skip K]
      one `bench=` line from a run's metrics.jsonl and run summary: tokens/s and ms/step (mean over the steps
      after the first K), MFU by llm.c's formula (flops per token 6 N + 6 L C T, N the parameter count; llm.c,
      train_gpt2.cu, gpt2_estimate_mfu) against P TFLOP/s, and the peak device memory B when given.
"""
import argparse
import json
import math
import os
import random
import struct
import sys


def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            row = json.loads(line)
            if "loss" in row and "step" in row:
                out[int(row["step"])] = (float(row["loss"]), line)
    return out


def raw_loss(line):
    """The loss exactly as the worker printed it."""
    start = line.index('"loss":') + len('"loss":')
    end = start
    while end < len(line) and line[end] not in ",}":
        end += 1
    return line[start:end]


def cmd_compare(a):
    x, y = losses(a.a), losses(a.b)
    steps = sorted(s for s in x if s in y and s >= a.from_step)
    if not steps:
        print(f"compare={a.name} result=FAIL why=no common steps from {a.from_step} ({a.a}: {len(x)} rows, "
              f"{a.b}: {len(y)} rows)")
        return 1
    worst, at = 0.0, steps[0]
    for s in steps:
        if a.exact:
            d = 0.0 if raw_loss(x[s][1]) == raw_loss(y[s][1]) else math.inf
        else:
            va, vb = x[s][0], y[s][0]
            d = abs(va - vb) / abs(vb) if math.isfinite(va) and math.isfinite(vb) and vb != 0 else math.inf
        if d > worst or (d == worst and s == steps[0]):
            worst, at = d, s
    ok = worst == 0.0 if a.exact else worst <= a.bound
    bound = "exact" if a.exact else f"{a.bound:g}"
    print(f"compare={a.name} steps={steps[0]}..{steps[-1]} max_rel_diff={worst:.3g} at_step={at} "
          f"a={x[at][0]!r} b={y[at][0]!r} bound={bound} result={'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def cmd_tokens(a):
    rng = random.Random(a.seed)
    with open(a.file, "wb") as f:
        left = a.count
        while left > 0:
            n = min(left, 1 << 16)
            f.write(struct.pack(f"<{n}H", *(rng.randrange(a.vocab) for _ in range(n))))
            left -= n
    return 0


def cmd_bench(a):
    rows = []
    with open(os.path.join(a.logdir, "metrics.jsonl")) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    with open(os.path.join(a.logdir, "run_summary.rank0.json")) as f:
        summary = json.load(f)
    m = summary["model"]
    n_params, L, C, T = m["parameters"], m["n_layer"], m["n_embd"], m["block_size"]
    tokens_per_step = summary["batch"]["tokens_per_step"] if "tokens_per_step" in summary.get("batch", {}) \
        else None
    timed = [r["tokens_per_s"] for r in rows if r.get("step", 0) >= a.skip and r.get("tokens_per_s")]
    if not timed:
        print(f"bench={a.name} dtype={a.dtype} result=FAIL why=no timed steps after the first {a.skip}")
        return 1
    tps = sum(timed) / len(timed)
    if tokens_per_step is None:
        b = summary.get("batch", {})
        tokens_per_step = b.get("train_batch", 0) * T
    flops_per_token = 6 * n_params + 6 * L * C * T
    mfu = flops_per_token * tps / (a.peak_tflops * 1e12) if a.peak_tflops > 0 else float("nan")
    mem = f" peak_mem_gib={a.mem_bytes / 2**30:.2f}" if a.mem_bytes > 0 else ""
    loss = rows[-1].get("loss", float("nan"))
    print(f"bench={a.name} dtype={a.dtype} params={n_params} layers={L} n_embd={C} T={T} "
          f"tokens_per_step={tokens_per_step} steps_timed={len(timed)} tokens_per_s={tps:.0f} "
          f"ms_per_step={1000.0 * tokens_per_step / tps:.1f} mfu={mfu:.3f} peak_tflops={a.peak_tflops:g}{mem} "
          f"final_loss={loss:.4f}")
    return 0 if math.isfinite(loss) else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--bound", type=float, default=0.0)
    c.add_argument("--exact", action="store_true")
    c.add_argument("--from-step", type=int, default=0)
    c.add_argument("--name", default="losses")
    t = sub.add_parser("tokens")
    t.add_argument("file")
    t.add_argument("--count", type=int, required=True)
    t.add_argument("--vocab", type=int, required=True)
    t.add_argument("--seed", type=int, default=1234)
    b = sub.add_parser("bench")
    b.add_argument("logdir")
    b.add_argument("--name", required=True)
    b.add_argument("--dtype", required=True)
    b.add_argument("--peak-tflops", type=float, default=0.0)
    b.add_argument("--mem-bytes", type=float, default=0.0)
    b.add_argument("--skip", type=int, default=5)
    a = ap.parse_args()
    return {"compare": cmd_compare, "tokens": cmd_tokens, "bench": cmd_bench}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
