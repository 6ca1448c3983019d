"""PyTorch peer of bench_llama: transformers' own model of a family (LlamaForCausalLM, Qwen2ForCausalLM,
Qwen3ForCausalLM, MistralForCausalLM) trained a step at a time on one CPU process, the step bench_llama times in fsdpc:
forward, cross-entropy over every position, backward, clip_grad_norm_(1.0), torch.optim.AdamW (weight decay
on 2-D tensors only), on random tokens; in fp32, or with --bf16 under torch.autocast("cpu", bfloat16)
around the forward (parameters, gradients and AdamW stay fp32; the loss is computed in fp32 from the
logits), PyTorch's usual bf16 training on a CPU.

--steps counts every step, the --warmup ones included (as ../shared/anchors/torch2/fsdp2_gpt.py), so a run
of the warm-up steps alone measures start-up and warm-up for the runner's CPU-time difference.
Prints `peer=torch-VER transformers=VER family=F precision=fp32|bf16_autocast threads=T params=P steps_timed=N
step_ms_median=M tokens_per_s=X` (median over the steps after --warmup; nan without any). Threads:
OMP_NUM_THREADS, as for fsdpc."""
import argparse
import contextlib
import math
import os
import statistics
import time

import torch
import torch.nn.functional as F
import transformers

import hf_family  # beside this script

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--family", choices=["llama", "qwen2", "qwen3", "mistral"], default="llama")
p.add_argument("--n_layer", type=int, required=True)
p.add_argument("--n_head", type=int, required=True)
p.add_argument("--n_kv_head", type=int, required=True)
p.add_argument("--n_embd", type=int, required=True)
p.add_argument("--head_dim", type=int, default=0, help="0 = n_embd / n_head")
p.add_argument("--intermediate_size", type=int, required=True)
p.add_argument("--vocab", type=int, required=True)
p.add_argument("--seq", type=int, required=True)
p.add_argument("--batch", type=int, required=True)
p.add_argument("--tie", action="store_true")
p.add_argument("--rope_llama3", action="store_true",
               help="Llama 3.1's rope scaling: factor 8, low 1, high 4, original context 64 (bench_runner.c's)")
p.add_argument("--sliding_window", type=int, default=0, help="mistral: the window; 0 = none (full causal)")
p.add_argument("--warmup", type=int, default=2)
p.add_argument("--steps", type=int, default=12, help="optimizer steps in all (warm-up included)")
p.add_argument("--bf16", action="store_true", help="torch.autocast('cpu', bfloat16) around the forward")
a = p.parse_args()

threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
torch.set_num_threads(threads)
torch.manual_seed(1234)
model = hf_family.build(transformers, a.family, vocab=a.vocab, n_embd=a.n_embd,
                        intermediate_size=a.intermediate_size, n_layer=a.n_layer, n_head=a.n_head,
                        n_kv_head=a.n_kv_head, seq=a.seq, tie=a.tie, head_dim=a.head_dim,
                        rope_llama3=a.rope_llama3, sliding_window=a.sliding_window)
model.train()
decay = [q for q in model.parameters() if q.dim() == 2]
no_decay = [q for q in model.parameters() if q.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
gen = torch.Generator().manual_seed(1)
amp = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.bf16 else contextlib.nullcontext
times = []
for step in range(a.steps):
    x = torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen)
    y = torch.roll(x, -1, dims=1)
    t0 = time.perf_counter()
    with amp():
        logits = model(input_ids=x).logits
    loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    dt = time.perf_counter() - t0
    if step >= a.warmup:
        times.append(dt)
    if not torch.isfinite(loss):
        raise SystemExit("non-finite loss")
med = statistics.median(times) if times else math.nan
params = sum(q.numel() for q in model.parameters())
print(f"peer=torch-{torch.__version__} transformers={transformers.__version__} family={a.family} "
      f"precision={'bf16_autocast' if a.bf16 else 'fp32'} threads={threads} params={params} "
      f"steps_timed={len(times)} step_ms_median={med * 1e3:.1f} tokens_per_s={a.batch * a.seq / med:.1f}", flush=True)
