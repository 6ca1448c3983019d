"""Writes accelerate config files with accelerate's own code (its ClusterConfig dataclass, as `accelerate
config` saves them, and `accelerate config default`'s JSON), for fsdp-launch's tests. The committed copies
in this folder were made with accelerate 1.15.0; test_launch_accel runs this again with the PyPI venv's
accelerate, when there is one, so a newer accelerate's files are read too. Usage: make_configs.py OUTDIR"""
import os
import subprocess
import sys

from accelerate.commands.config.config_args import ClusterConfig
from accelerate.utils import ComputeEnvironment, DistributedType

out = sys.argv[1]
os.makedirs(out, exist_ok=True)


def cluster(name, **kw):
    base = dict(compute_environment=ComputeEnvironment.LOCAL_MACHINE, mixed_precision="no", use_cpu=False,
                debug=False)
    base.update(kw)
    ClusterConfig(**base).to_yaml_file(os.path.join(out, name))


# FSDP2, two machines of two processes each, what `accelerate config` writes for this machine 1.
cluster("fsdp2.yaml", distributed_type=DistributedType.FSDP, mixed_precision="bf16", use_cpu=True,
        num_processes=4, num_machines=2, machine_rank=1, main_process_ip="10.0.0.7", main_process_port=29511,
        fsdp_config={"fsdp_version": 2, "fsdp_reshard_after_forward": False, "fsdp_offload_params": False,
                     "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                     "fsdp_transformer_layer_cls_to_wrap": "GPT2Block",
                     "fsdp_state_dict_type": "FULL_STATE_DICT", "fsdp_cpu_ram_efficient_loading": True,
                     "fsdp_activation_checkpointing": True})
# FSDP1 as accelerate's questions store it: the sharding strategy under fsdp_reshard_after_forward.
cluster("fsdp1.yaml", distributed_type=DistributedType.FSDP, num_processes=2,
        fsdp_config={"fsdp_version": 1, "fsdp_reshard_after_forward": "SHARD_GRAD_OP",
                     "fsdp_offload_params": True, "fsdp_auto_wrap_policy": "SIZE_BASED_WRAP",
                     "fsdp_min_num_params": 100000, "fsdp_backward_prefetch": "BACKWARD_POST",
                     "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_forward_prefetch": True,
                     "fsdp_use_orig_params": True, "fsdp_cpu_ram_efficient_loading": False,
                     "fsdp_sync_module_states": True, "fsdp_activation_checkpointing": False})
# Replicated data parallel on CPUs.
cluster("multi_cpu.yaml", distributed_type=DistributedType.MULTI_CPU, num_processes=2, use_cpu=True)
# DeepSpeed: refused.
cluster("deepspeed.yaml", distributed_type=DistributedType.DEEPSPEED, num_processes=2,
        deepspeed_config={"zero_stage": 3})
# `accelerate config default` (JSON).
subprocess.run([sys.executable, "-m", "accelerate.commands.accelerate_cli", "config", "default", "--config_file",
                os.path.join(out, "default.json")], check=True, stdout=subprocess.DEVNULL)
