#!/usr/bin/env bash
# Quickstart: install the Debian packages, build with meson, make byte-level token files from the project's
# own docs and sources (no download), train a small GPT-2 with FULL_SHARD on 2 CPU ranks for a couple of
# minutes (examples/quickstart.ini), and print a sample from the final checkpoint.
#
#   examples/quickstart.sh [--bpe]
#
# --bpe: BPE tokens instead of bytes, with examples/tokenizer.json (a 2,048-token GPT-2 style byte-level BPE
# trained with Hugging Face tokenizers on this repository's docs and sources); the model's vocab_size
# follows the tokenizer, and the sample is decoded with it. The run goes to runs/quickstart-bpe/.
set -euo pipefail
cd "$(dirname "$0")/.."

BPE=0
for arg in "$@"; do
  case "$arg" in
    --bpe) BPE=1 ;;
    -h|--help) sed -n '2,10s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "quickstart: unknown argument $arg (use --bpe, or nothing)" >&2; exit 2 ;;
  esac
done

PKGS="meson ninja-build pkg-config gcc libevent-dev nettle-dev libinih-dev libcriterion-dev libopenblas-dev
      libopenblas0-openmp libcjson-dev libyaml-dev libpcre2-dev libdnnl-dev zlib1g-dev libzstd-dev"
if ! dpkg-query -W $PKGS >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PKGS >/dev/null
  else
    echo "quickstart: missing packages; install them as root (or with sudo): apt-get install $PKGS" >&2
    exit 1
  fi
fi

# CUDA is built when the toolkit is under /usr/local/cuda; this job runs on the CPU either way.
export PATH="$PATH:/usr/local/cuda/bin"
BUILD=${BUILD:-build}
[ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" >/dev/null
ninja -C "$BUILD" launcher/fsdp-launch worker/fsdp-worker worker/fsdp-prepare-data worker/fsdp-ckpt

# Training data: every text file of docs/ and the C sources, one byte = one token (vocab 256), 10% for val.
# With --bpe: the tokenizer's ids, each file followed by <|endoftext|>; tokenizer.json and meta.json are
# written beside the token files, where fsdp-ckpt sample finds them.
mkdir -p runs
SOURCES="docs common rendezvous launcher comm kernels worker README.md"
if [ "$BPE" = 0 ]; then
  RUN=runs/quickstart
  "$BUILD/worker/fsdp-prepare-data" -o runs/quickstart-data $SOURCES
  OVERRIDES=()
else
  RUN=runs/quickstart-bpe
  DATA=runs/quickstart-bpe-data
  "$BUILD/worker/fsdp-prepare-data" --tokenizer examples/tokenizer.json -o "$DATA" $SOURCES
  VOCAB=$(sed -n 's/.*"vocab_size":[[:space:]]*\([0-9]*\).*/\1/p' "$DATA/meta.json")
  OVERRIDES=(--model.vocab_size="$VOCAB" --data.train_file="$DATA/train.bin" --data.val_file="$DATA/val.bin"
             --log.dir="$RUN" --checkpoint.dir="$RUN/checkpoints")
fi

# Two ranks with one OpenMP thread each (2 cores). Progress, val loss, the plan and the memory report go
# to the terminal; metrics.jsonl and a TensorBoard event file to runs/quickstart/ (runs/quickstart-bpe/).
rm -rf "$RUN"
OMP_NUM_THREADS=1 "$BUILD/launcher/fsdp-launch" --standalone --nproc_per_node 2 --tee 3 \
    "$BUILD/worker/fsdp-worker" examples/quickstart.ini ${OVERRIDES[@]+"${OVERRIDES[@]}"}

echo
echo "== what the model learned (fsdp-ckpt sample from the last checkpoint) =="
"$BUILD/worker/fsdp-ckpt" sample "$RUN/checkpoints" --prompt "The launcher" --length 300 --temperature 0.8
