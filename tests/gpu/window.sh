#!/usr/bin/env bash
# One command of a GPU window (tests/gpu/README.md): unpacks the kit that travelled with the checkout (once per
# machine) and runs one of acceptance.sh's two commands, or both, leaving a few files in RESULTS (a GPU
# machine lends back at most 8 files per command):
#
#   tests/gpu/window.sh KIT.tar.xz 1|2|both RESULTS_DIR
#
#   1     env, kernels, nccl, train   (about 3 minutes on an H200; limit 5)
#   2     env, bench, llama           (about 4 minutes; limit 5)
# RESULTS_DIR gets acceptance.json (both commands' stages once the second has run), summary.txt and
# logs.tar.xz (every stage's log and report, without checkpoints and token files).
set -u
kit_file=$1 part=$2 results=$3 extra=${4:-}  # extra: --dry-run, to try it without a GPU
root=/tmp/fsdpc-window
case "$part" in 1) stages=env,kernels,nccl,train ;; 2) stages=env,bench,llama ;; both) stages=env,kernels,nccl,train,bench,llama ;;
  *) echo "window: the part must be 1, 2 or both, not '$part'" >&2; exit 2 ;; esac
acc=$root/acceptance
mkdir -p "$root" "$results"
sum=$(sha256sum "$kit_file" | cut -c1-16)
if [ "$(cat "$root/kit.sha" 2>/dev/null)" != "$sum" ]; then
  rm -rf "$root/fsdpc-gpu-kit" "$acc"
  # xz where installed, else Python's lzma (the GPU machine's image is not ours)
  if command -v xz >/dev/null; then xz -dc "$kit_file" | tar -C "$root" -xf -
  else python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="fully_trusted")' "$kit_file" "$root"
  fi || { echo "window: cannot unpack $kit_file" >&2; exit 1; }
  echo "$sum" > "$root/kit.sha"
fi
# the second command on the machine that ran the first needs no second env stage
[ "$part" = 2 ] && [ -f "$acc/env.json" ] && grep -q '^PASS env' "$acc/summary.txt" 2>/dev/null && stages=bench,llama
"$root/fsdpc-gpu-kit/src/tests/gpu/acceptance.sh" --stages "$stages" --out "$acc" $extra
code=$?
cp "$acc/acceptance.json" "$acc/summary.txt" "$results/" 2>/dev/null
tar -C "$root" --exclude='*/ckpt' --exclude='*.bin' --exclude='*/hf_*/model.safetensors' --exclude='*/llmc-build' \
  -cf "$root/logs.tar" acceptance
if command -v xz >/dev/null; then xz -T4 -6 -c "$root/logs.tar" > "$results/logs.tar.xz"
else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(open(sys.argv[1], "rb"), lzma.open(sys.argv[2], "wb"))' "$root/logs.tar" "$results/logs.tar.xz"
fi
exit $code
