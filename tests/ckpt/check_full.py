"""Opens a full checkpoint's model file the way a user of another framework would: the safetensors format
read by hand (u64 header length, JSON header, raw little-endian data) into PyTorch tensors, checked
against GPT-2's Hugging Face names and shapes. Prints one line per tensor, `name d0xd1 sum`, for the C
test to compare with the values it saved, then `OK n`.

usage: /usr/bin/python3 check_full.py MODEL.safetensors N_LAYER N_EMBD VOCAB BLOCK
"""
import json
import struct
import sys

import torch


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    tensors = {}
    end = 0
    for name, e in header.items():
        b, e_ = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + b : base + e_]), dtype=dtypes[e["dtype"]])
        tensors[name] = t.reshape(e["shape"])
        end = max(end, e_)
    assert base + end == len(data), "file length does not match the header"
    return tensors, meta


def main():
    path = sys.argv[1]
    L, C, V, T = (int(x) for x in sys.argv[2:6])
    tensors, meta = read_safetensors(path)
    assert meta.get("format") == "pt", meta
    # GPT2LMHeadModel's names (a full checkpoint's model.safetensors) carry "transformer."; a GPT2Model's
    # (fsdp-ckpt export to a single file) do not.
    tensors = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in tensors.items()}
    want = {"wte.weight": (V, C), "wpe.weight": (T, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(L):
        h = f"h.{i}."
        want.update({h + "ln_1.weight": (C,), h + "ln_1.bias": (C,), h + "ln_2.weight": (C,),
                     h + "ln_2.bias": (C,), h + "attn.c_attn.weight": (C, 3 * C), h + "attn.c_attn.bias": (3 * C,),
                     h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
                     h + "mlp.c_fc.weight": (C, 4 * C), h + "mlp.c_fc.bias": (4 * C,),
                     h + "mlp.c_proj.weight": (4 * C, C), h + "mlp.c_proj.bias": (C,)})
    assert set(tensors) == set(want), sorted(set(tensors) ^ set(want))
    for name, t in tensors.items():
        assert tuple(t.shape) == want[name], (name, tuple(t.shape), want[name])
        print(f"{name} {'x'.join(str(d) for d in t.shape)} {t.double().sum().item():.17g}")
    print(f"OK {len(tensors)}")


if __name__ == "__main__":
    main()
