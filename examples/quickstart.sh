#!/usr/bin/env bash
# Quickstart: install the Debian packages, build with meson, and run a real 4-rank job with fsdp-launch.
# The job is fsdp-rdzv-demo (each rank joins the launcher's store, meets the others at a barrier and
# prints one line); it finishes in well under a second once built. When fsdp-worker exists, swap the
# last command for `fsdp-launch --standalone --nproc_per_node 4 fsdp-worker CONFIG.ini`.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS="meson ninja-build pkg-config gcc libevent-dev libinih-dev libcriterion-dev libopenblas-dev
      libopenblas0-openmp libcjson-dev"
if ! dpkg-query -W $PKGS >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PKGS >/dev/null
  else
    echo "quickstart: missing packages; run: sudo apt-get install $PKGS" >&2
    exit 1
  fi
fi

# CUDA is built when the toolkit is under /usr/local/cuda; the demo itself never needs a GPU.
export PATH="$PATH:/usr/local/cuda/bin"
BUILD=${BUILD:-build}
[ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" >/dev/null
ninja -C "$BUILD" launcher/fsdp-launch launcher/fsdp-rdzv-demo

# --standalone: one node, the store on a free local port (printed). The program is found next to
# fsdp-launch, so no PATH setup is needed.
"$BUILD/launcher/fsdp-launch" --standalone --nproc_per_node 4 --tee 3 fsdp-rdzv-demo
