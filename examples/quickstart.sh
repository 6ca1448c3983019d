#!/usr/bin/env bash
# Quickstart: install the Debian packages, build with meson, make byte-level token files from the project's
# own docs and sources (no download), train a small GPT-2 with FULL_SHARD on 2 CPU ranks for a couple of
# minutes (examples/quickstart.ini), and print a sample from the final checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS="meson ninja-build pkg-config gcc libevent-dev libinih-dev libcriterion-dev libopenblas-dev
      libopenblas0-openmp libcjson-dev libdnnl-dev"
if ! dpkg-query -W $PKGS >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PKGS >/dev/null
  else
    echo "quickstart: missing packages; run: sudo apt-get install $PKGS" >&2
    exit 1
  fi
fi

# CUDA is built when the toolkit is under /usr/local/cuda; this job runs on the CPU either way.
export PATH="$PATH:/usr/local/cuda/bin"
BUILD=${BUILD:-build}
[ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" >/dev/null
ninja -C "$BUILD" launcher/fsdp-launch worker/fsdp-worker worker/fsdp-prepare-data worker/fsdp-ckpt

# Training data: every text file of docs/ and the C sources, one byte = one token (vocab 256), 10% for val.
mkdir -p runs
"$BUILD/worker/fsdp-prepare-data" -o runs/quickstart-data docs common rendezvous launcher comm kernels worker \
    README.md

# Two ranks with one OpenMP thread each (2 cores). Progress, val loss, the plan and the memory report go
# to the terminal; metrics.jsonl and a TensorBoard event file to runs/quickstart/.
rm -rf runs/quickstart
OMP_NUM_THREADS=1 "$BUILD/launcher/fsdp-launch" --standalone --nproc_per_node 2 --tee 3 \
    "$BUILD/worker/fsdp-worker" examples/quickstart.ini

echo
echo "== what the model learned (fsdp-ckpt sample from the last checkpoint) =="
"$BUILD/worker/fsdp-ckpt" sample runs/quickstart/checkpoints --prompt "The launcher" --length 300 --temperature 0.8
