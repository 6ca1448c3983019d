"""PyTorch reference for the GPT-2 parity test (tests/model/test_model_torch.c).

Builds GPT-2 from a safetensors file with Hugging Face names, runs one batch and writes the loss, the
logits and the gradient of every parameter to a safetensors file:
    /usr/bin/python3 torch_ref.py --weights W --batch B --n_head H --out O [--fp64]
B holds "tokens" and "targets" (I32, (b, t); target -1 = ignored). O holds "loss" (F32, [1]),
"logits" (F32, (b*t, vocab)) and "grad.<name>" (F32, the parameter's file shape) for every parameter.
Attention is written out (torch 1.13 has no fused attention); --fp64 computes in double so the oracle's
own rounding is far below the tolerance the test applies to the C model.
The safetensors format is parsed here with struct + json (the safetensors package is not installed).
"""
import argparse
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

DTYPES = {"F32": (torch.float32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2),
          "I32": (torch.int32, 4), "F64": (torch.float64, 8), "I64": (torch.int64, 8)}
NAMES = {v[0]: k for k, v in DTYPES.items()}


def st_read(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        dt, _ = DTYPES[e["dtype"]]
        b, en = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:en]), dtype=dt) if en > b else torch.empty(0, dtype=dt)
        out[name] = t.reshape(e["shape"]).clone()
    return out


def st_write(path, tensors):
    header, blobs, pos = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        b = t.numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [pos, pos + len(b)]}
        blobs.append(b)
        pos += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def gpt2_loss(p, tokens, targets, n_layer, n_head):
    B, T = tokens.shape
    C = p["wte.weight"].shape[1]
    hs = C // n_head
    x = p["wte.weight"][tokens] + p["wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(n_layer):
        g = lambda s: p[f"h.{i}.{s}"]  # noqa: E731
        h = F.layer_norm(x, (C,), g("ln_1.weight"), g("ln_1.bias"), 1e-5)
        qkv = h @ g("attn.c_attn.weight") + g("attn.c_attn.bias")  # Conv1D: weight is (in, out)
        q, k, v = qkv.split(C, dim=2)
        q, k, v = [t.view(B, T, n_head, hs).transpose(1, 2) for t in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ g("attn.c_proj.weight") + g("attn.c_proj.bias")
        h = F.layer_norm(x, (C,), g("ln_2.weight"), g("ln_2.bias"), 1e-5)
        h = F.gelu(h @ g("mlp.c_fc.weight") + g("mlp.c_fc.bias"), approximate="tanh")
        x = x + h @ g("mlp.c_proj.weight") + g("mlp.c_proj.bias")
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    logits = x @ p["wte.weight"].t()  # LM head tied to wte
    V = logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1).long(), ignore_index=-1)
    return loss, logits.reshape(-1, V)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--batch", required=True)
    ap.add_argument("--n_head", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--fp64", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dt = torch.float64 if a.fp64 else torch.float32
    w = st_read(a.weights)
    w = {(k[len("transformer."):] if k.startswith("transformer.") else k): v for k, v in w.items()}
    params = {k: v.to(dt).requires_grad_(True) for k, v in w.items()}
    n_layer = len({k.split(".")[1] for k in params if k.startswith("h.")})
    b = st_read(a.batch)
    loss, logits = gpt2_loss(params, b["tokens"].long(), b["targets"], n_layer, a.n_head)
    loss.backward()
    out = {"loss": loss.detach().reshape(1).float(), "logits": logits.detach().float()}
    for k, v in params.items():
        out["grad." + k] = v.grad.float()
    st_write(a.out, out)
    print(f"torch_ref: loss={loss.item():.6f} params={sum(v.numel() for v in params.values())}")


if __name__ == "__main__":
    sys.exit(main())
