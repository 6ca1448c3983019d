"""The Hugging Face side of tests/train/test_train_hf.c, run with the PyPI venv's python (torch 2.x and
transformers).

  hf_check.py make OUT_DIR DATA.bin BATCH BLOCK STEPS
      Saves one random GPT2LMHeadModel with save_pretrained as OUT_DIR/f32, OUT_DIR/bf16, OUT_DIR/f16 and
      OUT_DIR/sharded (fp32, max_shard_size 40KB: an index and several shards), and writes OUT_DIR/ref.json:
      for each, transformers' mean loss (fp32 compute) over the first STEPS batches of BATCH consecutive
      windows of BLOCK tokens of DATA.bin (nanoGPT uint16), the windows `fsdp-ckpt eval` reads.

  hf_check.py make_llama OUT_DIR DATA.bin BATCH BLOCK STEPS
      The same for LlamaForCausalLM (grouped-query attention, rope_theta 500000, rms_norm_eps 1e-5): OUT_DIR/untied
      and OUT_DIR/tied (tie_word_embeddings), OUT_DIR/llama3 (Llama 3.1's rope scaling, as this transformers
      saves it) and OUT_DIR/llama3_v4 (the same in transformers 4.x's spelling), all sharded (max_shard_size
      60KB), and OUT_DIR/ref.json.

  hf_check.py make_qwen2 OUT_DIR DATA.bin BATCH BLOCK STEPS
      A tied Qwen2ForCausalLM with random q/k/v biases as OUT_DIR/model (sharded) and OUT_DIR/ref.json.

  hf_check.py make_window OUT_DIR DATA.bin BATCH BLOCK STEPS
      Sliding-window attention: a MistralForCausalLM with sliding_window 7 as OUT_DIR/mistral and a
      Qwen2ForCausalLM with use_sliding_window, sliding_window 5 and max_window_layers 1 as OUT_DIR/qwen2w
      (windows below BLOCK, so they change the loss), and OUT_DIR/ref.json with transformers' loss of each
      ("mistral", "qwen2w") and of the same weights without the window ("mistral_full").
  hf_check.py make_qwen3 OUT_DIR DATA.bin BATCH BLOCK STEPS
      An untied Qwen3ForCausalLM with head_dim 16 where hidden_size / num_attention_heads is 12, its q/k norm
      gains given random values, as OUT_DIR/model (sharded) and OUT_DIR/ref.json.

  hf_check.py tokenizer OUT.json
      A byte-level tokenizer.json for fsdp-prepare-data's byte tokens (token id = byte value): ByteLevel's
      character of byte b has id b, no merges, so transformers decodes a run's ids back to its text.

  hf_check.py loss MODEL_DIR DATA.bin BATCH BLOCK STEPS OUT.json
      transformers' mean loss of from_pretrained(MODEL_DIR) on those windows, as {"architecture", "loss"}.

  hf_check.py logits MODEL_DIR BATCH.safetensors OUT.json
      from_pretrained(MODEL_DIR) unchanged (AutoModelForCausalLM, and AutoTokenizer when the directory
      holds tokenizer.json), then its logits on BATCH's "tokens" against BATCH's "logits" (fsdpc's own):
      writes {"architecture", "max_abs_diff", "max_abs_logit", "rel", "tokenizer", "tokenizer_round_trip"}
      to OUT.json.
"""
import json
import os
import shutil
import sys
import warnings

import numpy as np
import torch

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)

from safetensors.torch import load_file  # noqa: E402
from transformers import (AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel,  # noqa: E402
                          LlamaConfig, LlamaForCausalLM)


def windows(path, batch, block, steps):
    tok = np.fromfile(path, dtype=np.uint16).astype(np.int64)
    for s in range(steps):
        rows = [tok[(s * batch + r) * block:(s * batch + r) * block + block + 1] for r in range(batch)]
        yield torch.tensor(np.stack(rows))


def mean_loss(model, data, batch, block, steps):
    total, n = 0.0, 0
    with torch.no_grad():
        for x in windows(data, batch, block, steps):
            logits = model(x[:, :-1]).logits.float()
            total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                                       reduction="sum").item()
            n += x[:, 1:].numel()
    return total / n


def make(out, data, batch, block, steps):
    torch.manual_seed(1234)
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=256, n_positions=48, bos_token_id=255,
                     eos_token_id=255)
    model = GPT2LMHeadModel(cfg).eval()
    # Norm gains and biases start at 1 and 0: move them so a mix-up of tensors would show.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    ref = {}
    for name, dtype, shard in (("f32", torch.float32, None), ("bf16", torch.bfloat16, None),
                               ("f16", torch.float16, None), ("sharded", torch.float32, "40KB")):
        d = os.path.join(out, name)
        m = GPT2LMHeadModel(cfg)
        m.load_state_dict(model.state_dict())
        m = m.to(dtype)
        if shard:
            m.save_pretrained(d, max_shard_size=shard)
        else:
            m.save_pretrained(d)
        # The reference computes in fp32 from the weights as stored (rounded to the file's dtype).
        ref[name] = mean_loss(m.float().eval(), data, batch, block, steps)
    ref["shards"] = len([f for f in os.listdir(os.path.join(out, "sharded")) if f.startswith("model-")])
    with open(os.path.join(out, "ref.json"), "w") as f:
        json.dump(ref, f)


# Llama 3.1's rotary scaling at a small size: with head size 16 and an original context of 16, the 8
# frequencies fall in all three bands (kept, blended, divided by factor).
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}


def make_llama(out, data, batch, block, steps):
    torch.manual_seed(4321)
    ref = {}
    for name, tie in (("untied", False), ("tied", True), ("llama3", False)):
        extra = {}
        if name == "llama3":
            extra = {"rope_parameters": dict(LLAMA3_ROPE, rope_theta=500000.0)} \
                if "rope_parameters" in LlamaConfig.__init__.__code__.co_varnames else {"rope_scaling": LLAMA3_ROPE}
        cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=256, max_position_embeddings=48, rope_theta=500000.0,
                          rms_norm_eps=1e-5, tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2, **extra)
        model = LlamaForCausalLM(cfg).eval()
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if p.dim() == 1:
                    p.add_(0.1 * torch.randn_like(p))
                # sharp attention, so that the rotary frequencies (the scaling) move the loss well beyond
                # the test's 1e-5 bound
                if name == "llama3" and (".q_proj." in pname or ".k_proj." in pname):
                    p.mul_(12.0)
        d = os.path.join(out, name)
        model.save_pretrained(d, max_shard_size="60KB")
        ref[name] = mean_loss(model, data, batch, block, steps)
        if name == "llama3":
            # the same model as transformers 4.x writes it: top-level rope_theta and a rope_scaling dict
            d4 = os.path.join(out, "llama3_v4")
            shutil.copytree(d, d4)
            with open(os.path.join(d4, "config.json")) as f:
                c = json.load(f)
            c.pop("rope_parameters", None)
            c["rope_theta"] = 500000.0
            c["rope_scaling"] = dict(LLAMA3_ROPE)
            with open(os.path.join(d4, "config.json"), "w") as f:
                json.dump(c, f)
            ref["llama3_v4"] = ref[name]
    with open(os.path.join(out, "ref.json"), "w") as f:
        json.dump(ref, f)


def make_qwen2(out, data, batch, block, steps):
    """A tied Qwen2ForCausalLM (q/k/v biases given random values) saved sharded as OUT_DIR/model, and
    OUT_DIR/ref.json with transformers' mean loss on the eval windows."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(7)
    cfg = Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256, max_position_embeddings=48, rms_norm_eps=1e-6,
                      tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_proj.bias"):
                p.normal_(0.0, 0.3)
    model.save_pretrained(os.path.join(out, "model"), max_shard_size="60KB")
    with open(os.path.join(out, "ref.json"), "w") as f:
        json.dump({"model": mean_loss(model, data, batch, block, steps)}, f)


def make_window(out, data, batch, block, steps):
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(11)
    shape = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, max_position_embeddings=48, rms_norm_eps=1e-6)
    mistral = MistralForCausalLM(MistralConfig(sliding_window=7, **shape)).eval()
    mistral.save_pretrained(os.path.join(out, "mistral"))
    full = MistralForCausalLM(MistralConfig(sliding_window=None, **shape)).eval()
    full.load_state_dict(mistral.state_dict())
    qwen = Qwen2ForCausalLM(Qwen2Config(use_sliding_window=True, sliding_window=5, max_window_layers=1,
                                        tie_word_embeddings=True, **shape)).eval()
    with torch.no_grad():
        for name, p in qwen.named_parameters():
            if name.endswith("_proj.bias"):
                p.normal_(0.0, 0.3)
    qwen.save_pretrained(os.path.join(out, "qwen2w"))
    with open(os.path.join(out, "ref.json"), "w") as f:
        json.dump({"mistral": mean_loss(mistral, data, batch, block, steps),
                   "mistral_full": mean_loss(full, data, batch, block, steps),
                   "qwen2w": mean_loss(qwen, data, batch, block, steps)}, f)


def make_qwen3(out, data, batch, block, steps):
    """An untied Qwen3ForCausalLM whose head_dim (16) is not hidden_size / num_attention_heads (48 / 4 = 12),
    every 1-D tensor (the norms, q_norm and k_norm included) moved off its init so that a mix-up shows, saved
    sharded as OUT_DIR/model, and OUT_DIR/ref.json with transformers' mean loss on the eval windows."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(11)
    cfg = Qwen3Config(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=48,
                      rms_norm_eps=1e-6, tie_word_embeddings=False)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    model.save_pretrained(os.path.join(out, "model"), max_shard_size="60KB")
    with open(os.path.join(out, "ref.json"), "w") as f:
        json.dump({"model": mean_loss(model, data, batch, block, steps)}, f)


def byte_tokenizer(out):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    # GPT-2's byte -> character table: printable bytes map to themselves, the others to U+0100 on.
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    tok = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(out)


def logits(model_dir, batch_path, out):
    b = load_file(batch_path)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    assert next(model.parameters()).dtype == torch.float32
    with torch.no_grad():
        got = model(b["tokens"].long()).logits.float()
    want = b["logits"].float()
    diff = (got - want).abs().max().item()
    scale = want.abs().max().item()
    res = {"architecture": type(model).__name__, "max_abs_diff": diff, "max_abs_logit": scale,
           "rel": diff / scale, "tokenizer": None}
    if os.path.exists(os.path.join(model_dir, "tokenizer.json")):
        tk = AutoTokenizer.from_pretrained(model_dir)
        res["tokenizer"] = type(tk).__name__
        text = "Grüße, FSDP!\n"
        res["tokenizer_round_trip"] = tk.decode(list(text.encode())) == text
    with open(out, "w") as f:
        json.dump(res, f)


def loss_of(model_dir, data, batch, block, steps, out):
    """transformers' mean loss of from_pretrained(MODEL_DIR) on the windows `fsdp-ckpt eval` reads."""
    model = AutoModelForCausalLM.from_pretrained(model_dir).float().eval()
    with open(out, "w") as f:
        json.dump({"architecture": type(model).__name__, "loss": mean_loss(model, data, batch, block, steps)}, f)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    elif sys.argv[1] == "make_llama":
        make_llama(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    elif sys.argv[1] == "make_qwen2":
        make_qwen2(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    elif sys.argv[1] == "make_window":
        make_window(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    elif sys.argv[1] == "make_qwen3":
        make_qwen3(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    elif sys.argv[1] == "tokenizer":
        byte_tokenizer(sys.argv[2])
    elif sys.argv[1] == "logits":
        logits(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "loss":
        loss_of(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7])
    else:
        sys.exit("usage: hf_check.py make|logits ...")
