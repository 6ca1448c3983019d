#!/usr/bin/python3
"""What a worker fsdp-launch started sees: writes OUT/rank<RANK>.json with its argv, __name__, interpreter
flags and the launcher's environment. Standard library only. Usage: env_probe.py OUT [ARGS...]"""
import json
import os
import sys

KEYS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
        "CUDA_VISIBLE_DEVICES", "FSDP_LAUNCH_CONFIG", "TORCHELASTIC_RUN_ID", "ROLE_NAME"]
out = sys.argv[1]
with open(os.path.join(out, f"rank{os.environ.get('RANK', 'x')}.json"), "w") as f:
    json.dump({"argv": sys.argv, "name": __name__, "unbuffered": int("-u" in getattr(sys, "orig_argv", [])),
               "executable": sys.executable, "env": {k: os.environ.get(k) for k in KEYS}}, f)
