#!/usr/bin/env python3
"""The Hugging Face check of tests/gpu/acceptance.sh's train stage: a `fsdp-ckpt export` directory opens with
transformers' from_pretrained, unchanged, and gives fsdpc's own eval loss on the same windows.

  hf_loss.py HF_DIR TOKENS.bin BATCH BLOCK STEPS --fsdpc-json EVAL.json --bound REL [--name N]

TOKENS.bin is nanoGPT's format; the windows are tests/train/hf_check.py's (those `fsdp-ckpt eval` reads),
EVAL.json is `fsdp-ckpt eval --json` of the checkpoint that was exported. Prints one `compare=` line and
exits 1 when the relative difference is over REL. Runs on the CPU in fp32: the export is what is checked,
not the GPU.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory only: never the network

from hf_check import mean_loss  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("hf_dir")
    ap.add_argument("tokens")
    ap.add_argument("batch", type=int)
    ap.add_argument("block", type=int)
    ap.add_argument("steps", type=int)
    ap.add_argument("--fsdpc-json", required=True)
    ap.add_argument("--bound", type=float, required=True)
    ap.add_argument("--name", default="hf")
    a = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(a.hf_dir).float().eval()
    theirs = mean_loss(model, a.tokens, a.batch, a.block, a.steps)
    ours = json.load(open(a.fsdpc_json))["loss"]
    rel = abs(theirs - ours) / abs(ours)
    ok = rel <= a.bound
    print(f"compare={a.name} architecture={type(model).__name__} transformers_loss={theirs:.6f} fsdpc_loss={ours:.6f} "
          f"rel_diff={rel:.3g} bound={a.bound:g} result={'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
