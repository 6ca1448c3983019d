"""PyTorch FSDP2 peer of bench_train's Llama-style configs: transformers' own model of the family
(LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM: --family) trained under torchrun with fully_shard on
every decoder layer and then on the root (FULL_SHARD-like, gloo), the step fsdpc's
fsdp-worker runs: forward, cross-entropy over every position in fp32, backward, clip_grad_norm_(1.0),
torch.optim.AdamW (weight decay 0.1 on 2-D tensors), on random tokens, the same per-rank batch on each rank.

Precision: --param_dtype bf16 = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), the analogue of
fsdpc's mixed_precision = bf16 (fp32 sharded parameters and optimizer, bf16 gathered parameters and compute,
fp32 gradient reduction); fp32 otherwise.

Rank 0 prints `peer=torch-VER transformers=VER mode=fsdp2 world=W precision=P params=N threads=T
batch_per_rank=B seq=S steps_timed=K step_ms_median=M tokens_per_s=X` (X over all ranks, median step after
--warmup; the step ends with an all-reduce of the loss, so every rank has finished it). Threads:
OMP_NUM_THREADS, as for fsdpc."""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import transformers

# the model a row names, built as bench_llama's peer builds it (tests/bench/model/hf_family.py)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model"))
import hf_family  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--family", choices=["llama", "qwen2", "qwen3"], default="llama")
p.add_argument("--head_dim", type=int, default=0, help="0 = n_embd / n_head")
p.add_argument("--rope_llama3", action="store_true",
               help="Llama 3.1's rope scaling: factor 8, low 1, high 4, original context 64 (bench_train.c's)")
p.add_argument("--n_layer", type=int, required=True)
p.add_argument("--n_head", type=int, required=True)
p.add_argument("--n_kv_head", type=int, required=True)
p.add_argument("--n_embd", type=int, required=True)
p.add_argument("--intermediate_size", type=int, required=True)
p.add_argument("--vocab", type=int, required=True)
p.add_argument("--seq", type=int, required=True)
p.add_argument("--batch_per_rank", type=int, required=True)
p.add_argument("--warmup", type=int, default=1, help="steps left out of the timing median")
p.add_argument("--steps", type=int, default=4, help="timed steps")
p.add_argument("--param_dtype", default="fp32", choices=["fp32", "bf16"])
a = p.parse_args()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.manual_seed(1234)
    model = hf_family.build(transformers, a.family, vocab=a.vocab, n_embd=a.n_embd,
                            intermediate_size=a.intermediate_size, n_layer=a.n_layer, n_head=a.n_head,
                            n_kv_head=a.n_kv_head, seq=a.seq, head_dim=a.head_dim, rope_llama3=a.rope_llama3)
    model.train()
    nparams = sum(q.numel() for q in model.parameters())

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh("cpu", (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if a.param_dtype == "bf16" else None,
                              reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)

    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(1 + rank)
    times = []
    for step in range(a.warmup + a.steps):
        x = torch.randint(0, a.vocab, (a.batch_per_rank, a.seq), generator=gen)
        y = torch.roll(x, -1, dims=1)
        t0 = time.perf_counter()
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), y.reshape(-1))
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if hasattr(gn, "full_tensor"):
            gn = gn.full_tensor()
        opt.step()
        opt.zero_grad(set_to_none=True)
        local = loss.detach().clone()
        dist.all_reduce(local)
        dt = time.perf_counter() - t0
        if not torch.isfinite(local):
            raise SystemExit("non-finite loss")
        if step >= a.warmup:
            times.append(dt)
        if rank == 0:
            print(f"step={step} loss={local.item() / world:.6f} grad_norm={gn.item():.6f} step_ms={dt * 1e3:.1f}",
                  flush=True)
    if rank == 0:
        med = statistics.median(times)
        prec = "fsdp2-param-bf16" if a.param_dtype == "bf16" else "fp32"
        print(f"peer=torch-{torch.__version__} transformers={transformers.__version__} family={a.family} "
              f"mode=fsdp2 world={world} "
              f"precision={prec} params={nparams} threads={torch.get_num_threads()} batch_per_rank={a.batch_per_rank} "
              f"seq={a.seq} steps_timed={len(times)} step_ms_median={med * 1e3:.1f} "
              f"tokens_per_s={world * a.batch_per_rank * a.seq / med:.0f}", flush=True)
    dist.barrier()  # every rank done before gloo is torn down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
