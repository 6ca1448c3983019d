"""Every TCPStore op of PyTorch 2.x against the store at MASTER_ADDR:MASTER_PORT, as a worker started by
fsdp-launch (or torchrun) finds it. Writes a JSON report to argv[1]: each check's name and whether it
held, plus timings; exits 1 when a check failed. With --refused it only checks that the store drops a
PyTorch client (fsdp-launch --no_torch_store)."""
import datetime
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

T = datetime.timedelta(seconds=30)


def client():
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=T)


def expect_raise(fn, exc=Exception):
    try:
        fn()
    except exc:
        return True
    return False


def later(seconds, fn):
    t = threading.Thread(target=lambda: (time.sleep(seconds), fn()))
    t.start()
    return t


def run(report):
    checks = report["checks"]

    def check(name, cond):
        checks[name] = bool(cond)

    s = client()
    s.set("k", "v")
    check("set_get", s.get("k") == b"v")
    s.set("k", b"\x00\xff binary")
    check("set_overwrite_binary", s.get("k") == b"\x00\xff binary")
    big = os.urandom(4 << 20)
    s.set("big", big)
    check("set_get_4mib", s.get("big") == big)
    check("add", s.add("n", 5) == 5 and s.add("n", -2) == 3 and s.get("n") == b"3")
    check("check", s.check(["k", "n"]) and not s.check(["k", "absent"]))
    t0 = time.monotonic()
    raised = expect_raise(lambda: s.wait(["never"], datetime.timedelta(seconds=0.5)))
    report["wait_timeout_s"] = time.monotonic() - t0
    check("wait_timeout", raised and 0.4 <= report["wait_timeout_s"] < 10)
    s.set("after-timeout", "1")
    check("usable_after_wait_timeout", s.get("after-timeout") == b"1")
    s.wait(["k", "n"])
    check("wait_existing", True)
    t = later(0.3, lambda: client().set("late", "here"))
    t0 = time.monotonic()
    s.wait(["late"], datetime.timedelta(seconds=20))
    report["wait_late_s"] = time.monotonic() - t0
    t.join()
    check("wait_blocks_until_set", s.get("late") == b"here" and report["wait_late_s"] >= 0.2)
    s.set_timeout(datetime.timedelta(seconds=0.5))
    check("get_missing_times_out", expect_raise(lambda: s.get("missing")))
    s.set_timeout(T)
    check("compare_set_missing", s.compare_set("cas", "", "first") == b"first")
    check("compare_set_swap", s.compare_set("cas", "first", "second") == b"second")
    check("compare_set_mismatch", s.compare_set("cas", "nope", "third") == b"second")
    check("compare_set_missing_expected", s.compare_set("cas2", "x", "y") == b"x" and not s.check(["cas2"]))
    check("delete_key", s.delete_key("cas") is True and s.delete_key("cas") is False and not s.check(["cas"]))
    s.multi_set(["m1", "m2"], ["one", "two"])
    check("multi_set_get", s.multi_get(["m2", "m1"]) == [b"two", b"one"])
    s.append("ap", "x")
    s.append("ap", "yz")
    check("append", s.get("ap") == b"xyz")
    check("has_extended_api", s.has_extended_api())
    s.queue_push("q", "1")
    s.queue_push("q", "2")
    check("queue_len", s.queue_len("q") == 2)
    check("queue_pop", s.queue_pop("q", block=False) == b"1" and s.queue_pop("q") == b"2")
    check("queue_pop_empty", expect_raise(lambda: s.queue_pop("q", block=False)))
    t = later(0.3, lambda: client().queue_push("q", "3"))
    check("queue_pop_blocks", s.queue_pop("q", block=True) == b"3")
    t.join()
    keys = set(s.list_keys())
    report["list_keys"] = sorted(keys)
    check("list_keys", {"k", "n", "big", "m1", "m2", "ap", "late"} <= keys)
    n = s.num_keys()
    report["num_keys"] = n
    check("num_keys", n >= len(keys))
    other = client()
    t = threading.Thread(target=lambda: other.barrier("bar", 2))
    t.start()
    time.sleep(0.2)
    released_early = not t.is_alive()
    s.barrier("bar", 2, datetime.timedelta(seconds=20))
    t.join(20)
    check("barrier", not released_early and not t.is_alive())
    t0 = time.monotonic()
    raised = expect_raise(lambda: s.barrier("lonely", 2, datetime.timedelta(seconds=0.5)))
    check("barrier_timeout", raised and time.monotonic() - t0 < 10)
    s.set("still", "ok")
    check("usable_after_barrier_timeout", s.get("still") == b"ok")
    # fsdpc's own keys (rdzv/..., worker/...) are not in a PyTorch client's key space
    check("fsdpc_keys_hidden", not any(k.startswith(("rdzv", "worker", "__barrier")) for k in s.list_keys()))


def refused(report):
    ok = False
    try:
        s = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=5))
        s.set("k", "v")
        s.get("k")
    except Exception as e:  # the store dropped us
        report["error"] = str(e)[:300]
        ok = True
    report["checks"]["refused"] = ok


def main():
    out = sys.argv[1]
    report = {"torch": torch.__version__, "checks": {}}
    try:
        (refused if "--refused" in sys.argv else run)(report)
    except Exception as e:
        report["exception"] = repr(e)[:500]
    with open(out + ".tmp", "w") as f:
        json.dump(report, f, indent=1)
    os.replace(out + ".tmp", out)
    bad = [k for k, v in report["checks"].items() if not v]
    if bad or "exception" in report:
        print("failed:", bad, report.get("exception", ""), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
