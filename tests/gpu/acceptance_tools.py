#!/usr/bin/env python3
"""Helpers of tests/gpu/acceptance.sh (Python's standard library only).

  acceptance_tools.py compare A/metrics.jsonl B/metrics.jsonl --bound REL [--exact] [--from-step S] [--name N]
      per-step losses of run A against run B (rows matched by "step"): exit 0 when every step both have,
      from S on, differs by at most REL relative (--exact: bit for bit, as printed), printing the largest
      difference as a `compare=` line.
  acceptance_tools.py tokens FILE --count N --vocab V [--seed S] [--llmc FILE2] [--uint32]
      N random tokens below V as little-endian uint16 (nanoGPT's format), reproducibly; --llmc also writes
      the same tokens in llm.c's format (256 x int32 header: 20240520, 1, N; then uint16 tokens); --uint32
      writes FILE in llm.c's uint32 format instead (header 20240801, 7, N; then uint32 tokens), for
      vocabularies above 65,536 ids.
  acceptance_tools.py criterion REPORT.json --name N --exit-code C [--allow-skips FILE] [--skips-ok]
      a Criterion binary's --json report (its messages are not JSON-escaped: read line by line): counts,
      every failure and every skip not matched by a line of FILE (`suite::test|message` regexes); writes
      REPORT.json.summary; exit 1 on a failure, a crash (no report, or a non-zero exit), or a skip outside
      the list (--skips-ok: skips are expected, as in a dry run)
  acceptance_tools.py envjson OUT [--dry-run]       OUT/env.txt (the env stage's facts) as OUT/env.json
  acceptance_tools.py stage OUT NAME WORD SECONDS LIMIT --detail TEXT
      records one stage in OUT/stages.json with OUT/NAME.figures and OUT/NAME.missing
  acceptance_tools.py report OUT [--manifest MANIFEST.json] [--dry-run]
      OUT/acceptance.json: the kit, the versions, every stage recorded in OUT (both commands of a window
      write to one OUT), the bench figures under "bench", every tool the run did not have, the verdict
  acceptance_tools.py llmc LOG --peak-tflops P [--skip K] [--params-of LOGDIR]
      a `bench=llmc_...` line from llm.c's per-step lines (mean tok/s after the first K steps; MFU by the
      same formula as ours, with the parameter count of fsdpc's run of the same model)
  acceptance_tools.py ratios FIGURES [--family llama]      the `ratios ...` line: fsdpc's tokens/s over each
      peer's (llama: the llama stage's figures, PyTorch + transformers eager and compiled)
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
import re
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
    toks = [rng.randrange(a.vocab) for _ in range(a.count)]
    if a.uint32:
        with open(a.file, "wb") as f:
            f.write(struct.pack("<256i", *([20240801, 7, len(toks)] + [0] * 253)))
            f.write(struct.pack(f"<{len(toks)}I", *toks))
        return 0
    if a.vocab > 65536:
        print(f"tokens: --vocab {a.vocab} does not fit uint16; use --uint32", file=sys.stderr)
        return 2
    body = struct.pack(f"<{len(toks)}H", *toks)
    with open(a.file, "wb") as f:
        f.write(body)
    if a.llmc:
        with open(a.llmc, "wb") as f:
            header = [20240520, 1, len(toks)] + [0] * 253
            f.write(struct.pack("<256i", *header))
            f.write(body)
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


def criterion_tests(text):
    """(suite, test, status, messages) of a Criterion 2.4 JSON report, read line by line: its messages are
    written unescaped, so a message with a quote in it is not valid JSON."""
    out, suite, pending = [], None, None
    lines = [ln.strip() for ln in text.splitlines()]
    for i, ln in enumerate(lines):
        m = re.match(r'"name": "(.*)",?$', ln)
        if m:
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            if nxt.startswith('"passed"'):
                suite = m.group(1)
            else:
                pending = [suite, m.group(1), None, ""]
                out.append(pending)
            continue
        m = re.match(r'"status": "(\w+)"', ln)
        if m and pending is not None:
            pending[2] = m.group(1)
            continue
        m = re.match(r'"messages": \[(.*)\]', ln)
        if m and pending is not None:
            pending[3] = m.group(1).strip('"')
    return [tuple(t) for t in out]


def cmd_criterion(a):
    why = []
    try:
        text = open(a.report, errors="replace").read()
    except OSError:
        text = ""
        why.append(f"no report ({a.report}): the binary crashed or did not start (exit {a.exit_code})")
    tests = criterion_tests(text)
    allow = []
    if a.allow_skips:
        allow = [re.compile(ln.rstrip("\n")) for ln in open(a.allow_skips) if ln.strip()]
    count = {"PASSED": 0, "FAILED": 0, "ERRORED": 0, "SKIPPED": 0}
    bad_skips, fails, ok_skips = [], [], []
    for suite, test, status, msg in tests:
        count[status] = count.get(status, 0) + 1
        key = f"{suite}::{test}|{msg}"
        if status == "SKIPPED":
            if a.skips_ok or any(r.search(key) for r in allow):
                ok_skips.append(key)
            else:
                bad_skips.append(key)
        elif status != "PASSED":
            fails.append(f"{suite}::{test} {status}: {msg[:300]}")
    if text and not tests:
        why.append("the report lists no test")
    if a.exit_code != 0 and not fails:
        why.append(f"exit code {a.exit_code} with no failed test in the report (a crash?)")
    for f in fails:
        print(f"  failed: {f}")
    for k in bad_skips:
        print(f"  unexpected skip: {k[:300]}")
    ok = not why and not fails and not bad_skips
    print(f"criterion={a.name} passed={count['PASSED']} failed={count['FAILED']} errored={count['ERRORED']} "
          f"skipped={count['SKIPPED']} expected_skips={len(ok_skips)} unexpected_skips={len(bad_skips)} "
          f"result={'PASS' if ok else 'FAIL'}{' why=' + '; '.join(why) if why else ''}")
    with open(a.report + ".summary", "w") as f:
        json.dump({"name": a.name, "passed": count["PASSED"], "failed": count["FAILED"] + count["ERRORED"],
                   "skipped": count["SKIPPED"], "expected_skips": ok_skips, "unexpected_skips": bad_skips,
                   "failures": fails, "problems": why, "result": "PASS" if ok else "FAIL"}, f, indent=1)
    return 0 if ok else 1


def read_shell_vars(path):
    out = {}
    if not os.path.exists(path):
        return out
    for ln in open(path):
        m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)$", ln.strip())
        if m:
            v = m.group(2)
            if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
                v = v[1:-1]
            out[m.group(1)] = v
    return out


def cmd_envjson(a):
    v = read_shell_vars(os.path.join(a.out, "env.txt"))
    torch_info = v.get("torch_info", "").split()
    env = {"dry_run": a.dry_run,
           "gpu": v.get("gpu_name"), "gpu_count": int(v.get("ndev", "0") or 0), "gpu_memory": v.get("gpu_mem"),
           "compute_capability": v.get("cc"), "driver": v.get("driver"), "driver_cuda": v.get("driver_cuda"),
           "nvcc": v.get("nvcc") or None, "cublas_library": v.get("cublas_lib") or None,
           "nccl_library": v.get("nccl_lib") or None, "cudnn_library": v.get("cudnn_lib") or None,
           "torch": torch_info[0] if len(torch_info) > 0 else None,
           "torch_cuda": torch_info[1] if len(torch_info) > 1 else None,
           "torch_cudnn": torch_info[2] if len(torch_info) > 2 else None,
           "torch_nccl": torch_info[3] if len(torch_info) > 3 else None,
           "transformers": torch_info[4] if len(torch_info) > 4 else None,
           "compute_sanitizer": v.get("sanitizer") or None, "ncu": v.get("ncu") or None}
    libpath = os.path.join(a.out, "libpath.txt")
    if os.path.exists(libpath):
        env["cuda_library_dirs"] = [d for d in open(libpath).read().strip().split(":") if d]
    with open(os.path.join(a.out, "env.json"), "w") as f:
        json.dump(env, f, indent=1)
    print("env.json: " + json.dumps(env))
    return 0


def lines_of(path):
    return [ln.rstrip("\n") for ln in open(path)] if os.path.exists(path) else []


def cmd_stage(a):
    path = os.path.join(a.out, "stages.json")
    stages = json.load(open(path)) if os.path.exists(path) else {}
    rec = {"result": a.word, "seconds": a.seconds, "limit_s": a.limit, "detail": a.detail,
           "figures": lines_of(os.path.join(a.out, a.name + ".figures")),
           "missing": lines_of(os.path.join(a.out, a.name + ".missing"))}
    if a.name == "kernels":
        crit = os.path.join(a.out, "criterion")
        rec["tests"] = [json.load(open(os.path.join(crit, f))) for f in sorted(os.listdir(crit))
                        if f.endswith(".summary")] if os.path.isdir(crit) else []
        rec["tests"] = [t for t in rec["tests"] if not t["name"].startswith("comm_nccl")]
    if a.name == "nccl":
        s = os.path.join(a.out, "criterion", "comm_nccl_world1.json.summary")
        rec["tests"] = [json.load(open(s))] if os.path.exists(s) else []
    stages[a.name] = rec
    with open(path + ".part", "w") as f:
        json.dump(stages, f, indent=1)
    os.replace(path + ".part", path)
    return 0


def bench_fields(line):
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)


def bench_lines(figures):
    """The `bench=NAME ...` lines of a figures file, by name, and a reader of one number of one of them."""
    by = {}
    for ln in figures:
        if ln.startswith("bench="):
            f = bench_fields(ln)
            by[f["bench"]] = f

    def num(name, key):
        try:
            return float(by[name][key])
        except (KeyError, ValueError):
            return None
    return by, num


def with_ratios(out, peers):
    for peer in peers:
        p = out[peer + "_tok_s"]
        out[f"fsdpc_over_{peer}"] = out["fsdpc_tok_s"] / p if p and out["fsdpc_tok_s"] else None
    return out


def fsdpc_fields(num, name):
    return {"fsdpc_tok_s": num(name, "tokens_per_s"), "fsdpc_mfu": num(name, "mfu"),
            "fsdpc_ms_per_step": num(name, "ms_per_step"), "fsdpc_peak_mem_gib": num(name, "peak_mem_gib")}


def bench_summary(figures):
    by, num = bench_lines(figures)
    fs = next((k for k in by if k.startswith("fsdpc_")), None)
    out = fsdpc_fields(num, fs)
    out.update({"llmc_tok_s": num("llmc_gpt2_124m_bf16", "tokens_per_s"), "llmc_mfu": num("llmc_gpt2_124m_bf16", "mfu"),
                "torch_eager_tok_s": num("torch_gpt2_eager", "tokens_per_s"),
                "torch_compile_tok_s": num("torch_gpt2_compile", "tokens_per_s")})
    return with_ratios(out, ("llmc", "torch_eager", "torch_compile"))


def llama_summary(figures):
    """The llama stage's figures: fsdpc's tokens/s and MFU against PyTorch + transformers."""
    _, num = bench_lines(figures)
    out = fsdpc_fields(num, "fsdpc_llama_1b_bf16")
    out.update({"torch_eager_tok_s": num("torch_llama_eager", "tokens_per_s"),
                "torch_compile_tok_s": num("torch_llama_compile", "tokens_per_s"),
                "torch_compile_mfu": num("torch_llama_compile", "mfu")})
    return with_ratios(out, ("torch_eager", "torch_compile"))


def cmd_ratios(a):
    def fmt(x):
        return "none" if x is None else f"{x:.3g}"
    if a.family == "llama":
        b = llama_summary(lines_of(a.figures))
        print(f"ratios fsdpc_tok_s={fmt(b['fsdpc_tok_s'])} fsdpc_mfu={fmt(b['fsdpc_mfu'])} "
              f"torch_eager_tok_s={fmt(b['torch_eager_tok_s'])} torch_compile_tok_s={fmt(b['torch_compile_tok_s'])} "
              f"fsdpc/torch_eager={fmt(b['fsdpc_over_torch_eager'])} "
              f"fsdpc/torch_compile={fmt(b['fsdpc_over_torch_compile'])}")
        return 0
    b = bench_summary(lines_of(a.figures))
    print(f"ratios fsdpc_tok_s={fmt(b['fsdpc_tok_s'])} fsdpc_mfu={fmt(b['fsdpc_mfu'])} "
          f"llmc_tok_s={fmt(b['llmc_tok_s'])} torch_eager_tok_s={fmt(b['torch_eager_tok_s'])} "
          f"torch_compile_tok_s={fmt(b['torch_compile_tok_s'])} fsdpc/llmc={fmt(b['fsdpc_over_llmc'])} "
          f"fsdpc/torch_eager={fmt(b['fsdpc_over_torch_eager'])} fsdpc/torch_compile={fmt(b['fsdpc_over_torch_compile'])}")
    return 0


def cmd_llmc(a):
    pat = re.compile(r"step\s+(\d+)/(\d+) \| loss ([-\d.naif]+).*\| ([\d.]+) ms \| (-?[\d.]+)% bf16 MFU \| (\d+) tok/s")
    rows = []
    for ln in open(a.log, errors="replace"):
        m = pat.search(ln)
        if m:
            rows.append((int(m.group(1)), float(m.group(3)), float(m.group(4)), float(m.group(5))))
    timed = [r for r in rows if r[0] > a.skip]
    if not timed:
        print(f"bench=llmc_gpt2_124m_bf16 result=FAIL why=no timed steps in {a.log}")
        return 1
    ms = sum(r[2] for r in timed) / len(timed)
    tokens_per_step = None
    text = open(a.log, errors="replace").read()
    m = re.search(r"\| micro batch size B\s+\| (\d+)", text)
    b = int(m.group(1)) if m else None
    m = re.search(r"\| sequence length T\s+\| (\d+)", text)
    t = int(m.group(1)) if m else None
    if b and t:
        tokens_per_step = b * t
    # tokens/s from the step times (llm.c's own tok/s column is an exponential average from step 1)
    tps = tokens_per_step * 1000.0 / ms if tokens_per_step else float("nan")
    mfu = float("nan")
    if a.params_of and a.peak_tflops > 0:
        s = json.load(open(os.path.join(a.params_of, "run_summary.rank0.json")))["model"]
        fpt = 6 * s["parameters"] + 6 * s["n_layer"] * s["n_embd"] * s["block_size"]
        mfu = fpt * tps / (a.peak_tflops * 1e12)
    print(f"bench=llmc_gpt2_124m_bf16 dtype=bf16 tokens_per_step={tokens_per_step} steps_timed={len(timed)} "
          f"tokens_per_s={tps:.0f} ms_per_step={ms:.1f} mfu={mfu:.3f} "
          f"llmc_own_mfu={timed[-1][3] / 100 if timed[-1][3] >= 0 else 'unknown_gpu'} "
          f"final_loss={timed[-1][1]:.4f}")
    return 0


def cmd_report(a):
    stages = json.load(open(os.path.join(a.out, "stages.json"))) if os.path.exists(
        os.path.join(a.out, "stages.json")) else {}
    env = json.load(open(os.path.join(a.out, "env.json"))) if os.path.exists(os.path.join(a.out, "env.json")) else {}
    manifest = json.load(open(a.manifest)) if a.manifest and os.path.exists(a.manifest) else None
    missing = sorted({m for s in stages.values() for m in s.get("missing", [])})
    bench = bench_summary(stages["bench"]["figures"]) if "bench" in stages else {}
    llama = llama_summary(stages["llama"]["figures"]) if "llama" in stages else {}
    order = ["env", "kernels", "nccl", "train", "bench", "llama"]
    results = [stages[s]["result"] for s in order if s in stages]
    verdict = "FAIL" if "FAIL" in results else ("PASS" if len(results) == len(order) else "INCOMPLETE")
    rep = {"verdict": verdict, "dry_run": a.dry_run, "stages_run": [s for s in order if s in stages],
           "kit": manifest, "env": env, "stages": {s: stages[s] for s in order if s in stages},
           "bench": bench, "llama": llama, "missing_tools": missing}
    with open(os.path.join(a.out, "acceptance.json.part"), "w") as f:
        json.dump(rep, f, indent=1)
    os.replace(os.path.join(a.out, "acceptance.json.part"), os.path.join(a.out, "acceptance.json"))
    print(f"verdict={verdict} stages=" + ",".join(f"{s}:{stages[s]['result']}" for s in order if s in stages)
          + (f" missing_tools={len(missing)}" if missing else ""))
    for m in missing:
        print(f"  did not have: {m}")
    return 0


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
    t.add_argument("--llmc")
    t.add_argument("--uint32", action="store_true")
    b = sub.add_parser("bench")
    b.add_argument("logdir")
    b.add_argument("--name", required=True)
    b.add_argument("--dtype", required=True)
    b.add_argument("--peak-tflops", type=float, default=0.0)
    b.add_argument("--mem-bytes", type=float, default=0.0)
    b.add_argument("--skip", type=int, default=5)
    c = sub.add_parser("criterion")
    c.add_argument("report")
    c.add_argument("--name", required=True)
    c.add_argument("--exit-code", type=int, default=0)
    c.add_argument("--allow-skips")
    c.add_argument("--skips-ok", action="store_true")
    e = sub.add_parser("envjson")
    e.add_argument("out")
    e.add_argument("--dry-run", action="store_true")
    g = sub.add_parser("stage")
    g.add_argument("out")
    g.add_argument("name")
    g.add_argument("word")
    g.add_argument("seconds", type=int)
    g.add_argument("limit", type=int)
    g.add_argument("--detail", default="")
    r = sub.add_parser("report")
    r.add_argument("out")
    r.add_argument("--manifest")
    r.add_argument("--dry-run", action="store_true")
    m = sub.add_parser("llmc")
    m.add_argument("log")
    m.add_argument("--peak-tflops", type=float, default=0.0)
    m.add_argument("--skip", type=int, default=5)
    m.add_argument("--params-of")
    q = sub.add_parser("ratios")
    q.add_argument("figures")
    q.add_argument("--family", choices=("gpt2", "llama"), default="gpt2")
    a = ap.parse_args()
    return {"compare": cmd_compare, "tokens": cmd_tokens, "bench": cmd_bench, "criterion": cmd_criterion,
            "envjson": cmd_envjson, "stage": cmd_stage, "report": cmd_report, "llmc": cmd_llmc,
            "ratios": cmd_ratios}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
