#!/usr/bin/env bash
# Plain multi-node launcher (no scheduler): run this on every node, with the same `lm train` arguments.
#
#   COORDINATOR=node0.example.com:8476 NUM_NODES=2 NODE_RANK=0 launch/multinode.sh \
#       --config=configs/gpt_shakespeare.py:small --workdir=/shared/runs/small    # on node0
#   COORDINATOR=node0.example.com:8476 NUM_NODES=2 NODE_RANK=1 launch/multinode.sh \
#       --config=configs/gpt_shakespeare.py:small --workdir=/shared/runs/small    # on node1
#
# One process per node drives all of the node's accelerators; jax.distributed connects them through
# the coordinator (node 0, any free port). The workdir (or --config.train.checkpoint_dir) must be a
# folder every node sees (NFS, a gs:// bucket for the checkpoints): Orbax writes checkpoints
# collectively. Under SLURM use launch/slurm.sbatch instead, on TPU VMs launch/tpu_vm.sh.
set -euo pipefail

: "${COORDINATOR:?set COORDINATOR=host:port of node 0}"
: "${NUM_NODES:?set NUM_NODES to the number of nodes}"
: "${NODE_RANK:?set NODE_RANK to the index of this node, 0 to NUM_NODES - 1}"
PYTHON="${PYTHON:-python}"

exec "$PYTHON" -m lm train "$@" \
    --coordinator_address="$COORDINATOR" --num_processes="$NUM_NODES" --process_id="$NODE_RANK"
