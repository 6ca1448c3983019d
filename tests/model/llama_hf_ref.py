"""Hugging Face transformers' own LlamaForCausalLM as the reference for fsdpc's llama family.

Modes:
  grads  one forward + backward of LlamaForCausalLM on weights fsdpc wrote (--weights, Hugging Face names)
         and a batch (--batch: int32 "tokens" and "targets", target -1 = ignored); writes --out
         (safetensors): "loss" (mean over valid targets), "logits" (B*T, vocab) and "grad.<name>" for every
         parameter. --fp64 runs in double precision.
  train  builds LlamaForCausalLM (--family qwen2, qwen3, mistral: Qwen2ForCausalLM, Qwen3ForCausalLM,
         MistralForCausalLM; --qwen2 = --family qwen2) with transformers' own init (seeded by --seed), writes
         it to --init_out (safetensors, Hugging Face names; a tied lm_head.weight is left out as save_pretrained
         does) or with --save_dir as save_pretrained writes a directory, for fsdpc's model.init_from, then trains --steps steps of fp32 on --data (nanoGPT uint16 or llm.c .bin)
         reading exactly the rows fsdpc's data.order = sequential reads: row r of step s starts at token
         ((s * batch + r) * block_size) mod (N - block_size). torch.optim.AdamW (decay on 2-D tensors only),
         clip_grad_norm_, constant lr. Prints one JSON line per step: {"step": s, "loss": l}.

The model shape is given by the flags (fsdpc's [model] names). Used by tests/model/test_model_llama_hf.c
and tests/train/test_train_llama_hf.c, with the venv docs/model.md describes (torch 2.x, transformers,
safetensors)."""
import argparse
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=["grads", "train"])
    p.add_argument("--n_layer", type=int, required=True)
    p.add_argument("--n_head", type=int, required=True)
    p.add_argument("--n_kv_head", type=int, required=True)
    p.add_argument("--n_embd", type=int, required=True)
    p.add_argument("--intermediate_size", type=int, required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--block_size", type=int, required=True)
    p.add_argument("--rope_theta", type=float, default=10000.0)
    p.add_argument("--rms_norm_eps", type=float, default=1e-6)
    p.add_argument("--tie", action="store_true", help="tie_word_embeddings")
    p.add_argument("--qwen2", action="store_true",
                   help="Qwen2ForCausalLM (q/k/v biases, given random values so that they count from step 1)")
    p.add_argument("--family", choices=["llama", "qwen2", "qwen3", "mistral"], default="llama")
    p.add_argument("--head_dim", type=int, default=0, help="0: n_embd / n_head")
    p.add_argument("--sliding_window", type=int, default=0,
                   help="mistral, qwen2, qwen3: keys this many positions back or more are masked; 0: none")
    p.add_argument("--max_window_layers", type=int, default=0,
                   help="qwen2, qwen3: the first layer that attends through the window (earlier ones fully)")
    p.add_argument("--init_std", type=float, default=0.02)
    # grads
    p.add_argument("--weights")
    p.add_argument("--batch")
    p.add_argument("--out")
    p.add_argument("--fp64", action="store_true")
    # train
    p.add_argument("--init_out")
    p.add_argument("--save_dir", help="train: save_pretrained the initial model here (instead of --init_out)")
    p.add_argument("--data")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--global_batch", type=int, default=12)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--grad_clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


def build(a):
    if a.qwen2:
        a.family = "qwen2"
    common = dict(
        vocab_size=a.vocab, hidden_size=a.n_embd, intermediate_size=a.intermediate_size,
        num_hidden_layers=a.n_layer, num_attention_heads=a.n_head, num_key_value_heads=a.n_kv_head,
        head_dim=a.head_dim or a.n_embd // a.n_head, max_position_embeddings=a.block_size,
        rms_norm_eps=a.rms_norm_eps, rope_parameters={"rope_type": "default", "rope_theta": a.rope_theta},
        tie_word_embeddings=a.tie, initializer_range=a.init_std, hidden_act="silu", use_cache=False)
    window = a.sliding_window or None
    if a.family == "mistral":
        return MistralForCausalLM(MistralConfig(sliding_window=window, **common))
    if a.family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(use_sliding_window=window is not None, sliding_window=window,
                                             max_window_layers=a.max_window_layers, attention_bias=False, **common))
        with torch.no_grad():  # the q/k norm gains start at 1: move them so that they count
            for n, p in model.named_parameters():
                if n.endswith(("q_norm.weight", "k_norm.weight")):
                    p.add_(torch.randn_like(p) * 0.2)
        return model
    if a.family == "qwen2":
        cfg = Qwen2Config(use_sliding_window=window is not None, sliding_window=window,
                          max_window_layers=a.max_window_layers, **common)
        model = Qwen2ForCausalLM(cfg)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("_proj.bias"):
                    p.normal_(0.0, 0.1)
        return model
    cfg = LlamaConfig(attention_bias=False, mlp_bias=False, **common)
    return LlamaForCausalLM(cfg)


def file_state(model, tie):
    """The parameters as fsdpc's files hold them: Hugging Face names, a tied head left out."""
    return {n: t.detach().float().contiguous().clone() for n, t in model.state_dict().items()
            if not (tie and n == "lm_head.weight")}


def load_weights(model, path, tie):
    sd = load_file(path)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not (tie and m == "lm_head.weight")]
    if missing or unexpected:
        sys.exit(f"llama_hf_ref: {path}: missing {missing}, unexpected {unexpected}")
    if tie:
        model.tie_weights()


def grads(a):
    model = build(a)
    load_weights(model, a.weights, a.tie)
    if a.fp64:
        model = model.double()
    model.train()
    b = load_file(a.batch)
    tokens, targets = b["tokens"].long(), b["targets"].long()
    logits = model(input_ids=tokens).logits
    V = logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-1, reduction="mean")
    loss.backward()
    out = {"loss": loss.detach().float().reshape(1), "logits": logits.detach().float().reshape(-1, V).contiguous()}
    for n, p in model.named_parameters():
        out["grad." + n] = p.grad.detach().float().contiguous()
    save_file(out, a.out)


def read_tokens(path):
    raw = np.fromfile(path, dtype=np.uint8)
    head = raw[:1024].view(np.int32) if raw.size >= 1024 else None
    if head is not None and head[0] == 20240520:
        return raw[1024:].view(np.uint16).astype(np.int64)
    return raw.view(np.uint16).astype(np.int64)


def train(a):
    torch.manual_seed(a.seed)
    model = build(a)
    if a.save_dir:
        model.save_pretrained(a.save_dir)
    else:
        save_file(file_state(model, a.tie), a.init_out, metadata={"format": "pt"})
    tok = read_tokens(a.data)
    N, T, R = tok.size, a.block_size, a.global_batch
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps)
    model.train()
    for s in range(a.steps):
        offs = [((s * R + r) * T) % (N - T) for r in range(R)]
        x = torch.tensor(np.stack([tok[o:o + T] for o in offs]))
        y = torch.tensor(np.stack([tok[o + 1:o + T + 1] for o in offs]))
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        print(json.dumps({"step": s + 1, "loss": loss.item()}), flush=True)


def main():
    a = parse()
    torch.set_num_threads(1)
    if a.mode == "grads":
        grads(a)
    else:
        train(a)


if __name__ == "__main__":
    main()
