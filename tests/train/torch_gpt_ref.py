"""PyTorch 2.x reference run for tests/train/test_train_bf16.c: fsdpc's GPT-2 trained the way fsdp-worker
trains it, so the two runs can be compared step by step.

  python torch_gpt_ref.py init  --out W.safetensors --n_layer L --n_head H --n_embd C --vocab V --block_size T
  python torch_gpt_ref.py train --init W.safetensors --data train.bin --n_head H --steps S --batch G
                                [--lr --min_lr --warmup_steps --weight_decay --grad_clip] [--bf16]

init writes a GPT-2 initialisation (normal(0, 0.02); c_proj weights 0.02 / sqrt(2 L); LayerNorm gains 1,
biases 0; seed 1234) with Hugging Face GPT-2 names and Conv1D layouts (weights (in, out), c_attn = [q|k|v]),
which fsdp-worker loads with model.init_from.
train runs S optimizer steps on G rows of T tokens each (train.bin: fsdp-prepare-data's headerless uint16
tokens; data.order = sequential: row i of step s starts at ((s G + i) T) mod (N - T)), with fsdp-worker's
optimizer: AdamW (betas 0.9 / 0.95, eps 1e-8, decoupled weight decay on 2-D tensors only), the global
gradient norm clipped to grad_clip, and the warmup + cosine schedule of docs/data.md. The loss is the mean
cross-entropy over every token of the step, computed in fp32. --bf16 runs the forward (and so the backward)
under torch.autocast("cpu", torch.bfloat16): matmuls and attention on bf16 operands, parameters, gradients
and optimizer state fp32, as fsdpc's mixed_precision = bf16 keeps them.
Prints one JSON object: {"torch": version, "losses": [...], "grad_norms": [...]}.
"""
import argparse
import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file


def names(n_layer):
    out = ["wte.weight", "wpe.weight"]
    for i in range(n_layer):
        out += [f"h.{i}.{p}" for p in ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                                       "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                                       "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")]
    return out + ["ln_f.weight", "ln_f.bias"]


def make_init(a):
    g = torch.Generator().manual_seed(1234)
    C, L = a.n_embd, a.n_layer
    shapes = {"wte.weight": (a.vocab, C), "wpe.weight": (a.block_size, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(L):
        p = f"h.{i}."
        shapes.update({p + "ln_1.weight": (C,), p + "ln_1.bias": (C,), p + "attn.c_attn.weight": (C, 3 * C),
                       p + "attn.c_attn.bias": (3 * C,), p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
                       p + "ln_2.weight": (C,), p + "ln_2.bias": (C,), p + "mlp.c_fc.weight": (C, 4 * C),
                       p + "mlp.c_fc.bias": (4 * C,), p + "mlp.c_proj.weight": (4 * C, C), p + "mlp.c_proj.bias": (C,)})
    w = {}
    for n in names(L):
        s = shapes[n]
        if len(s) == 2:
            std = 0.02 / math.sqrt(2 * L) if n.endswith("c_proj.weight") else 0.02
            w[n] = torch.randn(s, generator=g) * std
        elif n.endswith("ln_1.weight") or n.endswith("ln_2.weight") or n == "ln_f.weight":
            w[n] = torch.ones(s)
        else:
            w[n] = torch.zeros(s)
    save_file({k: v.contiguous() for k, v in w.items()}, a.out)


def forward(p, x, y, n_layer, n_head):
    B, T = x.shape
    C = p["wte.weight"].shape[1]
    h = p["wte.weight"][x] + p["wpe.weight"][:T]
    for i in range(n_layer):
        q = lambda s: p[f"h.{i}.{s}"]
        a = F.layer_norm(h, (C,), q("ln_1.weight"), q("ln_1.bias"), 1e-5)
        qkv = torch.matmul(a, q("attn.c_attn.weight")) + q("attn.c_attn.bias")
        heads = [t.reshape(B, T, n_head, C // n_head).transpose(1, 2) for t in qkv.split(C, dim=2)]
        att = F.scaled_dot_product_attention(*heads, is_causal=True)
        att = att.transpose(1, 2).reshape(B, T, C)
        h = h + torch.matmul(att, q("attn.c_proj.weight")) + q("attn.c_proj.bias")
        m = F.layer_norm(h, (C,), q("ln_2.weight"), q("ln_2.bias"), 1e-5)
        m = F.gelu(torch.matmul(m, q("mlp.c_fc.weight")) + q("mlp.c_fc.bias"), approximate="tanh")
        h = h + torch.matmul(m, q("mlp.c_proj.weight")) + q("mlp.c_proj.bias")
    h = F.layer_norm(h, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    logits = torch.matmul(h, p["wte.weight"].t())  # the LM head is tied to wte
    return F.cross_entropy(logits.float().reshape(B * T, -1), y.reshape(-1))


def lr_at(a, s):
    W, D = a.warmup_steps, a.steps
    if s < W:
        return a.lr * (s + 1) / (W + 1)
    if s >= D:
        return a.min_lr
    r = (s - W) / (D - W)
    return a.min_lr + 0.5 * (1 + math.cos(math.pi * r)) * (a.lr - a.min_lr)


def train(a):
    torch.manual_seed(0)
    w = load_file(a.init)
    n_layer = sum(1 for k in w if k.endswith(".ln_1.weight"))
    p = {k: v.float().clone().requires_grad_(True) for k, v in w.items()}
    decay = [v for v in p.values() if v.dim() == 2]
    other = [v for v in p.values() if v.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay}, {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    tokens = np.fromfile(a.data, dtype="<u2").astype(np.int64)
    T, G, N = p["wpe.weight"].shape[0], a.batch, len(tokens)
    losses, norms = [], []
    for s in range(a.steps):
        for grp in opt.param_groups:
            grp["lr"] = lr_at(a, s)
        offs = [((s * G + i) * T) % (N - T) for i in range(G)]
        rows = torch.from_numpy(np.stack([tokens[o:o + T + 1] for o in offs]))
        x, y = rows[:, :-1], rows[:, 1:]
        opt.zero_grad(set_to_none=True)
        if a.bf16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = forward(p, x, y, n_layer, a.n_head)
        else:
            loss = forward(p, x, y, n_layer, a.n_head)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(p.values()), a.grad_clip)
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
    print(json.dumps({"torch": torch.__version__, "losses": losses, "grad_norms": norms}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["init", "train"])
    ap.add_argument("--out")
    ap.add_argument("--init")
    ap.add_argument("--data")
    ap.add_argument("--n_layer", type=int, default=2)
    ap.add_argument("--n_head", type=int, default=2)
    ap.add_argument("--n_embd", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--block_size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--min_lr", type=float, default=6e-5)
    ap.add_argument("--warmup_steps", type=int, default=10)
    ap.add_argument("--weight_decay", type=float, default=0.1)
    ap.add_argument("--grad_clip", type=float, default=1.0)
    ap.add_argument("--bf16", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.mode == "init":
        if not a.out:
            sys.exit("init needs --out")
        make_init(a)
    else:
        if not a.init or not a.data:
            sys.exit("train needs --init and --data")
        train(a)


if __name__ == "__main__":
    main()
