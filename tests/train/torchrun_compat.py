"""Runs PyTorch's torchrun (torch.distributed.run) with the interpreter that has torch: what the `torchrun`
console script does, so `PYTHON torchrun_compat.py ARGS` is `torchrun ARGS`.

One repair, applied only where it is needed: Debian's torch 1.13 parses --redirects/--tee values by
iterating the Std IntFlag, and Python 3.11 no longer yields a flag's zero member (NONE) or its composite
ones (ALL) that way, so every value parses to None and torchrun dies before starting a worker. Here a value
is read as the integer flag it names, as torch 2.x does.
"""
import re
import sys

from torch.distributed.elastic.multiprocessing import api


def _std_from_str(cls, text):
    if re.fullmatch(r"[0123]", text):
        return cls(int(text))
    if re.fullmatch(r"(\d+:[0123],)*\d+:[0123]", text):
        return {int(rank): cls(int(flag)) for rank, flag in (item.split(":") for item in text.split(","))}
    raise ValueError(f"{text} is not 0-3 or a mapping LOCAL_RANK:0-3,...")


if api.Std.from_str("3") is None:
    api.Std.from_str = classmethod(_std_from_str)

from torch.distributed.run import main  # noqa: E402 (after the repair, which it must see)

if __name__ == "__main__":
    sys.exit(main())
