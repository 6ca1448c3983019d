#!/usr/bin/env bash
# Two-node training without a scheduler: fsdp-worker trains examples/quickstart.ini's GPT (FULL_SHARD over
# every rank of both nodes). Run this script on every node with its node rank:
#   node A (hosts the store):  NODE_RANK=0 MASTER_ADDR=nodeA bash examples/multinode.sh
#   node B:                    NODE_RANK=1 MASTER_ADDR=nodeA bash examples/multinode.sh
# Every node must use the same --nnodes, --nproc_per_node, --master_addr/--master_port, --rdzv_id and
# FSDP_RDZV_TOKEN (the store refuses a node whose run id or token differ).
#
# Each node makes its own copy of the training tokens (fsdp-prepare-data is deterministic). Checkpoints
# (a file per rank, checked by rank 0) need a CKPT_DIR that every node sees, such as an NFS directory;
# without one, set CKPT_INTERVAL=-1 to train without checkpoints. Metrics and TensorBoard events are
# written by rank 0 to RUN_DIR on node 0; every rank's run summary to RUN_DIR on its own node.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
: "${NODE_RANK:?set NODE_RANK (0 on the node that hosts the store)}"
: "${MASTER_ADDR:?set MASTER_ADDR to node 0s address}"
export FSDP_RDZV_TOKEN=${FSDP_RDZV_TOKEN:-change-me-shared-secret}
CONFIG=${CONFIG:-examples/quickstart.ini}
RUN_ID=${RUN_ID:-multinode}
RUN_DIR=${RUN_DIR:-runs/$RUN_ID}
DATA_DIR=${DATA_DIR:-runs/quickstart-data}
CKPT_DIR=${CKPT_DIR:-$RUN_DIR/checkpoints}

if [ ! -s "$DATA_DIR/train.bin" ]; then
  "$BUILD/worker/fsdp-prepare-data" -o "$DATA_DIR" docs common rendezvous launcher comm kernels worker README.md
fi

exec "$BUILD/launcher/fsdp-launch" \
  --nnodes "${NNODES:-2}" --node_rank "$NODE_RANK" --nproc_per_node "${NPROC:-2}" \
  --master_addr "$MASTER_ADDR" --master_port "${MASTER_PORT:-29500}" \
  --rdzv_id "$RUN_ID" --rdzv_timeout "${RDZV_TIMEOUT:-300}" --max_restarts 1 \
  --log_dir "$RUN_DIR/launcher-logs/node$NODE_RANK" --tee 3 \
  "$BUILD/worker/fsdp-worker" "$CONFIG" \
  --data.train_file="$DATA_DIR/train.bin" --data.val_file="$DATA_DIR/val.bin" \
  --log.dir="$RUN_DIR" --checkpoint.dir="$CKPT_DIR" --checkpoint.interval="${CKPT_INTERVAL:-0}" "$@"
