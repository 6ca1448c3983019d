#!/usr/bin/env python3
"""PyTorch peer of the GPU benchmark: GPT-2 124M trained by plain PyTorch on one device, for comparison.

  torch_gpt2_peer.py --mode eager|compile [--batch 8] [--seq 1024] [--steps 20] [--warmup 5]
                     [--tokens FILE] [--json OUT.json] [--layers 12 --heads 12 --embd 768 --vocab 50257]
                     [--peak-tflops 989] [--seed 1337] [--device cuda|cpu]
                     [--family llama --kv-heads 8 --ffn 8192 --rope-theta 500000]

--family llama trains transformers' LlamaForCausalLM instead (built from a LlamaConfig with random weights:
nothing is downloaded; tied embeddings, SDPA attention), the peer of acceptance.sh's llama stage; its line is
`bench=torch_llama_<mode>`. The token file may be nanoGPT's (headerless uint16) or llm.c's (uint16 or, for
vocabularies above 65,536, uint32 after a 256 x int32 header), as fsdpc reads them.

tests/gpu/acceptance.sh's bench stage measures fsdpc training GPT-2 124M (12 x 768, T = 1024) on the GPU,
then runs this script twice (--mode eager, --mode compile) with the same shapes, batch, peak TFLOP/s and
token file (written by acceptance_tools.py tokens), under whichever python3 imports torch (the machine's,
else FSDP_TORCH_VENV's). Each run prints one `bench=torch_gpt2_<mode>` line in the units of fsdpc's own
(tokens/s, ms/step, MFU by llm.c's formula, peak memory); the stage collects those lines into its figures
and acceptance_tools.py ratios sets fsdpc's tokens/s against them. --json also writes the fields as a JSON
object. Only torch and the standard library are used: the GPU machine has no network, so nothing is
downloaded and no name is looked up. A dry run of acceptance.sh uses --device cpu with a tiny model.

The training step: bf16 autocast over fp32 master weights, cross-entropy loss, backward, gradient-norm clip
to 1.0, AdamW (fused on CUDA; lr 6e-4 constant, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on 2-D
parameters only). TF32 is allowed for what autocast leaves in fp32. Batches are staged on the device before
the first step, so a step's time is model and optimizer work only. Each timed step is bracketed by device
synchronisations; the reported time is the mean over the timed steps, after `warmup` untimed steps (which
is where torch.compile compiles).

Exit status: 0; 1 when a loss is not finite; 2 for a bad argument, an unreadable token file, or CUDA asked
for and not available.
"""
import argparse
import array
import json
import math
import os
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # a clear line rather than a traceback when run outside the venv
    print(f"torch_gpt2_peer: cannot import torch ({e}); run it with the peers' venv python", file=sys.stderr)
    sys.exit(2)


def fail(msg, code=2):
    print(f"torch_gpt2_peer: {msg}", file=sys.stderr)
    sys.exit(code)


# ---- model ------------------------------------------------------------------------------------------------

class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)); every Linear has a bias."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.attn_out = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.mlp_out = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        h = self.n_head
        q, k, v = self.qkv(self.ln_1(x)).split(C, dim=2)
        # (B, T, C) -> (B, heads, T, head_dim), the layout scaled_dot_product_attention takes
        q, k, v = (t.view(B, T, h, C // h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_out(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_out(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, vocab, block):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        # Tied: one Parameter under two names, so model.parameters() yields it once and the
        # parameter count, optimizer state and gradient are the single shared matrix.
        self.lm_head.weight = self.wte.weight
        self._init(n_layer)

    def _init(self, n_layer):
        # GPT-2's initialisation: N(0, 0.02) weights, zero biases, LayerNorm 1/0; the two projections that
        # write into the residual stream get std 0.02/sqrt(2L) so its variance does not grow with depth.
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("attn_out.weight", "mlp_out.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)
            elif ".ln_" in name or name.startswith("ln_"):
                nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
            else:
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        # Cross-entropy in fp32 (autocast would pick it anyway): the loss reported is not rounded to bf16.
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


class Llama(nn.Module):
    """transformers' LlamaForCausalLM with the same (idx, targets) -> loss call as GPT2, the loss in fp32."""

    def __init__(self, a):
        super().__init__()
        try:
            from transformers import LlamaConfig, LlamaForCausalLM
        except ImportError as e:
            fail(f"--family llama needs transformers ({e})")
        cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.embd, intermediate_size=a.ffn,
                          num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                          max_position_embeddings=a.seq, rope_theta=a.rope_theta, rms_norm_eps=1e-5,
                          tie_word_embeddings=True, attn_implementation="sdpa")
        self.m = LlamaForCausalLM(cfg)

    def forward(self, idx, targets):
        logits = self.m(input_ids=idx, use_cache=False).logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


# ---- data -------------------------------------------------------------------------------------------------

LLMC_MAGIC16, LLMC_MAGIC32 = 20240520, 20240801


def read_tokens(path, need):
    """The first `need` tokens of a token file as an int64 tensor: nanoGPT's headerless uint16, or llm.c's
    256 x int32 header (magic 20240520: uint16 tokens; 20240801: uint32) and its tokens."""
    try:
        with open(path, "rb") as f:
            head = f.read(1024)
            hdr = array.array("i")
            hdr.frombytes(head[:1024] if len(head) == 1024 else b"")
            if sys.byteorder != "little":
                hdr.byteswap()
            width, start = 2, 0
            if len(hdr) == 256 and hdr[0] in (LLMC_MAGIC16, LLMC_MAGIC32):
                width, start = (4 if hdr[0] == LLMC_MAGIC32 else 2), 1024
            f.seek(start)
            raw = f.read(width * need)
    except OSError as e:
        fail(f"cannot read token file {path}: {e}")
    raw = raw[:len(raw) // width * width]
    toks = array.array("I" if width == 4 else "H")
    if toks.itemsize != width:
        toks = array.array("L" if width == 4 else "H")
    toks.frombytes(raw)
    if sys.byteorder != "little":
        toks.byteswap()
    return torch.tensor(toks.tolist(), dtype=torch.int64)



def token_batches(a, n_batches, device):
    """n_batches (inputs, targets) pairs of shape (B, T), already on the device.

    From a token file (nanoGPT's format: headerless little-endian uint16): consecutive windows of B*T+1
    tokens, each starting B*T after the last (so a window's last token is the next one's first input),
    back to the start when the next window would run past the end. Without one: uniform random tokens from
    a torch.Generator seeded 1234, the same on every device."""
    B, T = a.batch, a.seq
    win = B * T + 1
    if a.tokens:
        # Only the prefix the windows can reach is read: a corpus may be far larger than this run needs.
        need = (n_batches - 1) * B * T + win
        data = read_tokens(a.tokens, need)
        if len(data) < win:
            fail(f"token file {a.tokens} holds {len(data)} tokens; one batch needs B*T+1 = {win}")
        top = int(data.max())
        if top >= a.vocab:
            fail(f"token file {a.tokens} has token {top}, not below --vocab {a.vocab}")
        out, pos = [], 0
        for _ in range(n_batches):
            if pos + win > len(data):
                pos = 0
            w = data[pos:pos + win]
            out.append((w[:-1].view(B, T).to(device), w[1:].view(B, T).to(device)))
            pos += B * T
        return out
    g = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(n_batches):
        w = torch.randint(0, a.vocab, (B, T + 1), generator=g)
        out.append((w[:, :-1].contiguous().to(device), w[:, 1:].contiguous().to(device)))
    return out


# ---- run --------------------------------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("eager", "compile"), required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024, help="T, also the model's block size")
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (torch.compile compiles here)")
    ap.add_argument("--tokens", help="nanoGPT token file (little-endian uint16); random tokens without it")
    ap.add_argument("--json", help="also write the result fields to this file as a JSON object")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--peak-tflops", type=float, default=989.0,
                    help="device peak for MFU, TFLOP/s (989: H100/H200 SXM dense bf16); 0 prints mfu=nan")
    ap.add_argument("--seed", type=int, default=1337, help="seed of the weight initialisation")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--family", choices=("gpt2", "llama"), default="gpt2")
    ap.add_argument("--kv-heads", type=int, default=8, help="llama: key/value heads (grouped-query attention)")
    ap.add_argument("--ffn", type=int, default=8192, help="llama: the SwiGLU MLP's intermediate size")
    ap.add_argument("--rope-theta", type=float, default=500000.0, help="llama: the rotary base")
    a = ap.parse_args(argv)
    for name in ("batch", "seq", "steps", "layers", "heads", "embd", "vocab"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be at least 1")
    if a.warmup < 0:
        ap.error("--warmup must not be negative")
    if a.embd % a.heads:
        ap.error(f"--embd {a.embd} is not a multiple of --heads {a.heads}")
    if a.family == "llama" and (a.kv_heads < 1 or a.heads % a.kv_heads or a.ffn < 1):
        ap.error(f"--kv-heads {a.kv_heads} must divide --heads {a.heads}, and --ffn must be at least 1")
    return a


def main(argv=None):
    a = parse_args(argv)
    if a.device == "cuda":
        if not torch.cuda.is_available():
            fail("--device cuda asked for, but torch.cuda.is_available() is false "
                 f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}); --device cpu for a smoke test")
        dev = torch.device("cuda")
        # TF32 for the fp32 matmuls and convolutions autocast leaves in fp32 (as fsdpc's TF32 setting does)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        dev = torch.device("cpu")

    # Initialise on the CPU from the seed, then move: the same weights whichever device trains them.
    torch.manual_seed(a.seed)
    if a.family == "llama":
        with torch.device(dev):  # a 1B model is made where it trains: initialising it on the CPU takes long
            model = Llama(a)
    else:
        model = GPT2(a.layers, a.heads, a.embd, a.vocab, a.seq).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    params = list(model.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=dev.type == "cuda")
    fwd = torch.compile(model) if a.mode == "compile" else model

    batches = token_batches(a, a.warmup + a.steps, dev)

    def step(x, y):
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def check(i, loss):
        v = loss.item()
        if not math.isfinite(v):
            fail(f"loss is {v} at step {i} (mode {a.mode}, batch {a.batch}, T {a.seq})", code=1)
        return v

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sync()
    t0 = time.perf_counter()
    for i in range(a.warmup):
        check(i, step(*batches[i]))
    sync()
    warmup_s = time.perf_counter() - t0

    times, loss_v = [], float("nan")
    for i in range(a.warmup, a.warmup + a.steps):
        sync()
        t = time.perf_counter()
        loss = step(*batches[i])
        sync()
        times.append(time.perf_counter() - t)
        loss_v = check(i, loss)  # read after the clock stops: .item() would otherwise add a sync to the step

    mean_s = sum(times) / len(times)
    tokens_per_s = a.batch * a.seq / mean_s
    # llm.c's estimate (train_gpt2.cu, gpt2_estimate_mfu): 6N for the weights' forward and backward matmuls,
    # 6 L C T for attention's, per token. acceptance_tools.py bench uses the same, so the MFUs compare.
    flops_per_token = 6 * n_params + 6 * a.layers * a.embd * a.seq
    mfu = flops_per_token * tokens_per_s / (a.peak_tflops * 1e12) if a.peak_tflops > 0 else float("nan")
    peak_mem = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None

    fields = {
        "bench": f"torch_{a.family}_{a.mode}", "batch": a.batch, "T": a.seq, "params": n_params,
        "steps_timed": len(times), "tokens_per_s": round(tokens_per_s), "ms_per_step": round(1000 * mean_s, 1),
        "mfu": round(mfu, 3) if math.isfinite(mfu) else None,
        "peak_mem_gib": round(peak_mem, 2) if peak_mem is not None else None,
        "warmup_s": round(warmup_s, 1), "final_loss": round(loss_v, 4),
    }
    print(f"bench={fields['bench']} batch={a.batch} T={a.seq} params={n_params} steps_timed={len(times)} "
          f"tokens_per_s={tokens_per_s:.0f} ms_per_step={1000 * mean_s:.1f} mfu={mfu:.3f} "
          f"peak_mem_gib={'nan' if peak_mem is None else f'{peak_mem:.2f}'} warmup_s={warmup_s:.1f} "
          f"final_loss={loss_v:.4f}", flush=True)
    if a.json:
        # Extra context beside the line's fields, for whoever reads the file later.
        fields.update(device=torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
                      torch=torch.__version__, peak_tflops=a.peak_tflops,
                      layers=a.layers, heads=a.heads, embd=a.embd, vocab=a.vocab,
                      tokens=os.path.abspath(a.tokens) if a.tokens else None)
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(fields, f, indent=1)
            f.write("\n")
        os.replace(tmp, a.json)  # never leave a half-written file for a reader to trip on
    return 0


if __name__ == "__main__":
    sys.exit(main())
