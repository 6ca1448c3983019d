"""A 2-rank job as a PyTorch user writes it: init_process_group("gloo", init_method="env://") against
the store of the launcher (TORCHELASTIC_USE_AGENT_STORE=True), an all_reduce and a barrier. Each rank
writes argv[1]/rank<R>.json. With --fail-first-attempt, rank 1 exits 1 after the all_reduce of attempt 0
(TORCHELASTIC_RESTART_COUNT=0), so a restart must rendezvous again; each rank also reports whether a key
it set in an earlier attempt is still there (a restart must start from an empty key space)."""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist


def main():
    out = sys.argv[1]
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    marker = "attempt-marker/" + os.environ["RANK"]
    stale = store.check([marker])
    store.set(marker, str(attempt))
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    if "--fail-first-attempt" in sys.argv and attempt == 0 and rank == 1:
        sys.exit(1)
    dist.barrier()
    with open(os.path.join(out, "rank%d.json" % rank), "w") as f:
        json.dump({"rank": rank, "world": world, "sum": t.item(), "attempt": attempt, "stale_key": stale,
                   "use_agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE"),
                   "master_port": int(os.environ["MASTER_PORT"])}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
