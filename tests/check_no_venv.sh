#!/usr/bin/env bash
# The suite passes on a machine without the PyPI venv: every test binary whose source names tu_venv (the
# helpers of tests/util/tu_venv.h) runs with FSDP_TORCH_VENV pointing to a directory that does not exist,
# and must exit 0 with no failed or crashed test and at least one skipped one (what needs the venv says so
# as a skip; a warning would make Criterion 2.4 exit 1, and a silent pass would hide that it never ran).
# A test that also finds what it needs outside the venv (the `elsewhere` table below) may pass unskipped.
# Results are read from each binary's Criterion JSON report (--json), never from its log lines.
#
# usage: check_no_venv.sh SOURCE_ROOT BUILD_ROOT   (meson test runs it: the 'check_no_venv' test, suite
# 'hygiene'). The binaries, their environment and timeouts come from BUILD_ROOT/meson-info (the meson tests
# that run them), so a new test that uses the venv is checked without being listed here.
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 SOURCE_ROOT BUILD_ROOT" >&2
    exit 2
fi
src=$1
build=$2
for f in intro-tests.json intro-targets.json; do
    if [ ! -f "$build/meson-info/$f" ]; then
        echo "check_no_venv: $build/meson-info/$f is missing: give a meson build directory as BUILD_ROOT" >&2
        exit 2
    fi
done

# Test sources only: tests/util/ holds the helpers themselves, tests/bench/ benchmarks (not meson tests).
mapfile -t sources < <(cd "$src" && grep -rl --include='*.c' tu_venv tests | grep -v -e '^tests/util/' -e '^tests/bench/' | sort)
if [ ${#sources[@]} -eq 0 ]; then
    echo "check_no_venv: no test source under $src/tests names tu_venv: nothing to check (wrong SOURCE_ROOT?)" >&2
    exit 2
fi

work=$(mktemp -d /tmp/fsdp-check-no-venv-XXXXXX)
trap 'rm -rf "$work"' EXIT

python3 - "$src" "$build" "$work" "${sources[@]}" <<'EOF'
import json, os, subprocess, sys

src, build, work, sources = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
info = os.path.join(build, "meson-info")
tests = json.load(open(os.path.join(info, "intro-tests.json")))
targets = json.load(open(os.path.join(info, "intro-targets.json")))

# source -> the executable built from it -> the meson test that runs that executable
exe_of = {}
for t in targets:
    if t["type"] != "executable":
        continue
    for group in t.get("target_sources", []):
        for s in group.get("sources", []):
            exe_of.setdefault(os.path.realpath(s), []).append(t)
runs = []
problems = []
for rel in sources:
    exes = exe_of.get(os.path.realpath(os.path.join(src, rel)), [])
    if not exes:
        # not built in this configuration (e.g. the emulator's tests without -Dgpu_emu=true): nothing to run
        print(f"check_no_venv: {rel} is not built here; not checked")
        continue
    found = [(t, e) for e in exes for t in tests if t["cmd"][0] in e["filename"]]
    if not found:
        problems.append(f"{rel} uses the PyPI venv, but no meson test runs a binary built from it")
    runs += found

# Bring the binaries up to date: `meson test check_no_venv` alone builds only this test's own dependencies.
files = sorted({os.path.relpath(f, build) for _, e in runs for f in e["filename"]})
if files and subprocess.run(["ninja", "-C", build] + files, stdout=subprocess.DEVNULL).returncode != 0:
    print(f"check_no_venv: ninja -C {build} could not build {' '.join(files)}", file=sys.stderr)
    sys.exit(1)

venv = "/nonexistent"
# Tests that also find what they need outside the venv, so they may pass without a skip where it is there.
elsewhere = {"train_torchrun": "torchrun from FSDP_TORCHRUN or PATH before the venv's"}
for t, e in runs:
    name = t["name"]
    report = os.path.join(work, name + ".json")
    env = dict(os.environ)
    env.update(t.get("env") or {})
    env["FSDP_TORCH_VENV"] = venv
    timeout = t.get("timeout") or 600
    cmd = t["cmd"] + [f"--json={report}"]
    try:
        p = subprocess.run(cmd, env=env, cwd=t.get("workdir") or build, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout)
        out, code = p.stdout.decode(errors="replace"), p.returncode
    except subprocess.TimeoutExpired as x:
        out, code = (x.stdout or b"").decode(errors="replace"), "timeout"
    try:
        r = json.load(open(report))
    except (OSError, ValueError):
        r = None
    if r is None:
        problems.append(f"{name}: exit {code} and no Criterion JSON report; its output ends:\n{out[-3000:]}")
        continue
    skipped = [f"{s['name']}::{x['name']}" for s in r["test_suites"] for x in s["tests"]
               if x["status"] == "SKIPPED"]
    bad = [f"{s['name']}::{x['name']} {x['status']}" for s in r["test_suites"] for x in s["tests"]
           if x["status"] not in ("PASSED", "SKIPPED")]
    if code != 0 or r["failed"] or r["errored"] or bad:
        problems.append(f"{name}: exit {code}, {r['failed']} failed, {r['errored']} crashed without the venv "
                        f"({'; '.join(bad) or 'no failed test: a warning or an error outside the tests'}); "
                        f"its output ends:\n{out[-3000:]}")
    elif not skipped and name in elsewhere:
        print(f"ok {name}: {r['passed']} passed, none skipped (it also takes {elsewhere[name]})")
    elif not skipped:
        problems.append(f"{name}: {r['passed']} passed and none skipped with FSDP_TORCH_VENV={venv}: what needs "
                        "the venv must cr_skip_test() when tu_venv_* says it is missing")
    else:
        print(f"ok {name}: {r['passed']} passed, skipped {', '.join(skipped)}")

for p in problems:
    print(f"FAIL {p}")
print(f"check_no_venv: {len(runs)} venv-dependent test binaries, {len(problems)} problems")
sys.exit(1 if problems else 0)
EOF
