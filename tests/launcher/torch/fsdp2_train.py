"""A small PyTorch FSDP2 training job for fsdp-launch's tests: a residual MLP language model (embedding,
blocks of LayerNorm + Linear + GELU + Linear, a head), each block and then the root wrapped with
torch.distributed.fsdp.fully_shard over a CPU device mesh (gloo), AdamW, a fixed global batch per step drawn
from a generator seeded by the step, each rank taking its rows. Started by a launcher (fsdp-launch or
torchrun) with the torchrun environment; init_process_group uses env://.

Writes OUT/losses.json (rank 0: the global mean loss of each step) and OUT/rank<R>.json (what the rank saw:
world, restart count, store address). --fail_at STEP:RANK makes that rank raise at that step on the first
attempt only (TORCHELASTIC_RESTART_COUNT 0), as a crashing job would.
Usage: fsdp2_train.py OUT [--steps N] [--fail_at S:R]"""
import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--steps", type=int, default=6)
p.add_argument("--fail_at", default="")
args = p.parse_args()

VOCAB, DIM, LAYERS, SEQ, BATCH = 64, 32, 3, 16, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(DIM)
        self.fc = nn.Linear(DIM, 4 * DIM)
        self.proj = nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        return x + self.proj(torch.nn.functional.gelu(self.fc(self.ln(x))))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, x):
        h = self.emb(x)
        for b in self.blocks:
            h = b(h)
        return self.head(self.ln(h))


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
torch.manual_seed(1234)
model = Model()
mesh = init_device_mesh("cpu", (world,))
for b in model.blocks:
    fully_shard(b, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
fail_step, fail_rank = (int(v) for v in args.fail_at.split(":")) if args.fail_at else (-1, -1)
rows = BATCH // world
losses = []
for step in range(args.steps):
    if step == fail_step and rank == fail_rank and restart == 0:
        raise RuntimeError(f"injected failure at step {step} on rank {rank}")
    g = torch.Generator().manual_seed(1000 + step)
    data = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    x, y = data[rank * rows:(rank + 1) * rows, :-1], data[rank * rows:(rank + 1) * rows, 1:]
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    losses.append((total / world).item())
with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
    json.dump({"world": world, "restart": restart, "master": [os.environ.get("MASTER_ADDR"),
               os.environ.get("MASTER_PORT")], "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE"),
               "torch": torch.__version__}, f)
if rank == 0:
    with open(os.path.join(args.out, "losses.json"), "w") as f:
        json.dump(losses, f)
dist.barrier()
dist.destroy_process_group()
