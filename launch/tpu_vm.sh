#!/usr/bin/env bash
# Cloud TPU VMs, one host or a multi-host pod slice: create the VM, install lm on every host, and run
# the same `lm train` command on every host (gcloud ... ssh --worker=all). On a pod slice each host's
# process finds the others through jax.distributed (from the TPU metadata, nothing to pass); process
# 0 prints the progress.
#
#   export TPU_NAME=lm-v4-32 ZONE=us-central2-b ACCELERATOR_TYPE=v4-32 RUNTIME_VERSION=tpu-ubuntu2204-base
#   export LM_REPO=https://github.com/<you>/lm.git           # where the hosts clone lm from
#   launch/tpu_vm.sh create
#   launch/tpu_vm.sh setup                                    # clone (or pull) and pip install -e ".[tpu]"
#   launch/tpu_vm.sh dryrun --config=configs/gpt_shakespeare.py:small   # compile once, print memory/FLOPs
#   launch/tpu_vm.sh start --config=configs/gpt_shakespeare.py:small --workdir=runs/small \
#       --config.train.checkpoint_dir=gs://YOUR_BUCKET/runs/small
#   launch/tpu_vm.sh logs                                     # follow worker 0's log
#   launch/tpu_vm.sh stop                                     # SIGTERM: checkpoint, then exit
#   launch/tpu_vm.sh start ...                                # the same command resumes
#   launch/tpu_vm.sh delete
#
# `run` is `start` in the foreground (the output streams here; an ssh drop stops the run). On a pod
# slice the checkpoints must go where every host writes (a gs:// bucket: checkpoint_dir above); the
# logs and TensorBoard files stay in worker 0's workdir. Set PROJECT to pass --project.
set -euo pipefail

: "${TPU_NAME:?set TPU_NAME}"
: "${ZONE:?set ZONE}"
GCLOUD=(gcloud compute tpus tpu-vm)
PROJECT_FLAG=()
if [[ -n "${PROJECT:-}" ]]; then PROJECT_FLAG=(--project="$PROJECT"); fi

on_all_hosts() {  # a shell command, run on every host of the slice
  "${GCLOUD[@]}" ssh "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" --worker=all --command="$1"
}

lm_command() {  # the `lm train` command line with this script's arguments, quoted for the remote shell
  printf 'cd ~/lm && python3 -m lm train'
  printf ' %q' "$@"
}

action="${1:-}"
shift || true
case "$action" in
  create)
    : "${ACCELERATOR_TYPE:?set ACCELERATOR_TYPE, e.g. v4-8 or v5litepod-16}"
    : "${RUNTIME_VERSION:?set RUNTIME_VERSION, e.g. tpu-ubuntu2204-base}"
    "${GCLOUD[@]}" create "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" \
        --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION" "$@" ;;
  setup)
    : "${LM_REPO:?set LM_REPO to the git URL the hosts clone lm from}"
    on_all_hosts "(git -C ~/lm pull --ff-only || git clone $(printf '%q' "$LM_REPO") ~/lm) && python3 -m pip install -q -e ~/lm[tpu]" ;;
  dryrun)
    on_all_hosts "$(lm_command "$@" --dry_run --workdir=/tmp/lm-dryrun)" ;;
  run)
    on_all_hosts "$(lm_command "$@")" ;;
  start)
    on_all_hosts "nohup $(lm_command "$@") > ~/lm.log 2>&1 < /dev/null &" ;;
  logs)
    "${GCLOUD[@]}" ssh "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" --worker=0 --command="tail -n 100 -f ~/lm.log" ;;
  stop)
    on_all_hosts "pkill -TERM -f 'python3 -m lm train' || true" ;;
  ssh)
    "${GCLOUD[@]}" ssh "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" --worker="${WORKER:-0}" "$@" ;;
  delete)
    "${GCLOUD[@]}" delete "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" --quiet ;;
  *)
    echo "usage: launch/tpu_vm.sh create|setup|dryrun|run|start|logs|stop|ssh|delete [lm train arguments]" >&2
    exit 2 ;;
esac
