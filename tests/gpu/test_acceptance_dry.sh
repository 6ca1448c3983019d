#!/usr/bin/env bash
# tests/gpu/acceptance.sh counts its failures: a dry run of two stages whose second is made to fail
# (--fail) exits 1 with one PASS and one FAIL line in its summary; the same stages without --fail exit 0.
set -u
script=$1
build=$2
out=$(mktemp -d /tmp/fsdp-accept-XXXXXX)
trap 'rm -rf "$out"' EXIT
bad=0
check() { if ! eval "$1"; then echo "FAILED: $2"; bad=1; fi; }

"$script" --dry-run --build "$build" --out "$out/a" --stages env,nccl --fail nccl > "$out/a.txt" 2>&1
code=$?
cat "$out/a.txt"
check '[ "$code" = 1 ]' "exit code $code with one failing stage, expected 1"
check 'grep -q "^PASS env: " "$out/a/summary.txt"' "no PASS line for env"
check 'grep -q "^FAIL nccl: failed on request" "$out/a/summary.txt"' "no FAIL line for nccl"
check '[ "$(grep -c . "$out/a/summary.txt")" = 2 ]' "the summary has other lines than the two stages asked for"
check '[ -s "$out/a/env.log" ] && [ -f "$out/a/nccl.log" ] && [ -s "$out/a/acceptance.json" ]' "no log per stage"

"$script" --dry-run --build "$build" --out "$out/b" --stages env,nccl > "$out/b.txt" 2>&1
code=$?
cat "$out/b.txt"
check '[ "$code" = 0 ]' "exit code $code with no failing stage, expected 0"
check '[ "$(grep -c "^PASS " "$out/b/summary.txt")" = 2 ]' "expected two PASS lines"
check 'python3 -c "import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r[\"stages\"][\"nccl\"][\"result\"] == \"PASS\" and r[\"dry_run\"] else 1)" "$out/b/acceptance.json"' \
  "acceptance.json does not record the nccl stage's PASS"
check 'python3 -c "import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r[\"stages\"][\"nccl\"][\"result\"] == \"FAIL\" else 1)" "$out/a/acceptance.json"' \
  "acceptance.json does not record the nccl stage's FAIL"

"$script" --stages env,build > "$out/d.txt" 2>&1
code=$?
check '[ "$code" = 2 ] && grep -q "unknown stage .build." "$out/d.txt"' "an unknown stage is not refused with exit 2"

"$script" --bogus > "$out/c.txt" 2>&1
code=$?
check '[ "$code" = 2 ] && grep -q "unknown argument" "$out/c.txt"' "a bad argument is not refused with exit 2"
exit $bad
