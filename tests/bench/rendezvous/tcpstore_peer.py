"""Peer for bench_store: PyTorch's own TCPStore server (torch.distributed.TCPStore, is_master=True, its
default libuv backend) on a free loopback port. Prints `port=N`, then serves until its stdin closes; the C
benchmark drives it with the same clients and work as fsdpc's server in the same run."""
import datetime
import resource
import sys

from torch.distributed import TCPStore


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=300), wait_for_workers=False)
    print("port=%d" % server.port, flush=True)
    sys.stdin.read()  # until the benchmark closes the pipe


if __name__ == "__main__":
    main()
