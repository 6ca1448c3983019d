#!/usr/bin/env bash
# Two-node job without a scheduler: run this script on every node with its node rank.
#   node A (hosts the store):  NODE_RANK=0 MASTER_ADDR=nodeA bash examples/multinode.sh
#   node B:                    NODE_RANK=1 MASTER_ADDR=nodeA bash examples/multinode.sh
# Every node must use the same --nnodes, --nproc_per_node, --master_addr/--master_port, --rdzv_id and
# FSDP_RDZV_TOKEN (the store refuses a node whose run id or token differ).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
: "${NODE_RANK:?set NODE_RANK (0 on the node that hosts the store)}"
: "${MASTER_ADDR:?set MASTER_ADDR to node 0s address}"
export FSDP_RDZV_TOKEN=${FSDP_RDZV_TOKEN:-change-me-shared-secret}

exec "$BUILD/launcher/fsdp-launch" \
  --nnodes "${NNODES:-2}" --node_rank "$NODE_RANK" --nproc_per_node "${NPROC:-4}" \
  --master_addr "$MASTER_ADDR" --master_port "${MASTER_PORT:-29500}" \
  --rdzv_id "${RUN_ID:-demo-multinode}" --rdzv_timeout 300 --max_restarts 1 \
  --log_dir "${LOG_DIR:-logs}" --tee 3 \
  fsdp-rdzv-demo
