#!/usr/bin/env python3
"""Adds up the Criterion syntheses of one or more `meson test` runs into one closing line.

CI recognises Criterion's `Synthesis: Tested: N | Passing: N | Failing: N | Crashing: N`; meson's own
summary is not such a line, and each test binary prints its own synthesis. A meson test that printed no
synthesis (a crash before Criterion's report, a timeout, a non-Criterion test) counts as one test,
passing or failing by meson's verdict, so nothing can vanish from the total.
A skipped test is neither passing nor failing, and Criterion leaves it out of its synthesis: the skips
(Criterion's `[SKIP] suite::test: why` lines, which tests/meson.build's verbosity makes it print, and meson
tests that exited 77) are listed before the synthesis, one `SKIPPED` line each and a `Skipped: N` line.
Usage: summarize.py BUILD_DIR|TESTLOG.json [...]; exits 1 if anything failed.
"""
import json
import re
import sys

SYN = re.compile(r"Synthesis: Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+) \| Crashing: (\d+)")
SKIP = re.compile(r"^\[SKIP\] (\S+?)(?:: (.*))?$", re.M)


def main(dirs):
    tested = passing = failing = crashing = 0
    bad = []
    skipped = []
    for d in dirs:
        # a build directory (its latest meson test run) or a saved testlog.json of an earlier run
        with open(d if d.endswith(".json") else f"{d}/meson-logs/testlog.json") as f:
            for line in f:
                rec = json.loads(line)
                text = (rec.get("stdout") or "") + (rec.get("stderr") or "")
                m = SYN.findall(text)
                for name, why in SKIP.findall(text):
                    skipped.append((f"{d}: {name}", f"{rec['name']}: {why}" if why else rec["name"]))
                if rec["result"] == "SKIP" and not m:
                    skipped.append((f"{d}: {rec['name']}", "meson: exit code 77"))
                ok = rec["result"] in ("OK", "EXPECTEDFAIL", "SKIP")
                if rec["result"] == "SKIP" and not m:
                    continue  # listed as skipped, neither passing nor failing
                if m and ok:
                    t, p, fl, c = map(int, m[-1])
                elif m:
                    t, p, fl, c = map(int, m[-1])
                    if fl + c == 0:  # meson failed it (leak report, timeout after synthesis): count it
                        fl = 1
                        t += 1
                else:
                    t, p, fl, c = 1, int(ok), int(not ok), 0
                tested, passing, failing, crashing = tested + t, passing + p, failing + fl, crashing + c
                if not ok:
                    bad.append(f"{d}: {rec['name']} ({rec['result']})")
    for b in bad:
        print(f"FAILED {b}")
    for name, why in skipped:
        print(f"SKIPPED {name} ({why})")
    print(f"Skipped: {len(skipped)}" + (": " + ", ".join(n for n, _ in skipped) if skipped else ""))
    print(f"Synthesis: Tested: {tested} | Passing: {passing} | Failing: {failing} | Crashing: {crashing}")
    return 1 if (failing or crashing or bad) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
