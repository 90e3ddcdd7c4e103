#!/usr/bin/env bash
# The GRPO study (README.md): every run, one at a time, then the figures and tables. From the repository root:
#   bash experiments/studies/grpo_reverse/run.sh            # everything (about 40 minutes on a 2-core CPU)
#   bash experiments/studies/grpo_reverse/run.sh grpo       # one stage: base, grpo, sft, dr_grpo, sft_lr, collect
# The runs go to $RUNS (default runs/grpo_reverse); each run's wall time, in seconds, is appended to $RUNS/walls.txt.
set -euo pipefail
RUNS=${RUNS:-runs/grpo_reverse}
SEEDS=(0 1 2)
SFT_STEPS=400  # SFT continued: more steps than fit the GRPO runs' wall time; collect.py compares at equal time
SFT_LR=1e-4          # SFT continued's constant learning rate (the base run's last), 3 seeds
SFT_OTHER_LRS=(3e-4)  # other rates tried on seed 0
mkdir -p "$RUNS"

timed() {  # timed NAME COMMAND...: runs the command, its output in $RUNS/NAME.log, its wall time in walls.txt
    local name=$1 start
    shift
    start=$(date +%s.%N)
    "$@" >"$RUNS/$name.log" 2>&1
    echo "$name $(echo "$(date +%s.%N) - $start" | bc)" >>"$RUNS/walls.txt"
}

heldout() {  # heldout RUN: each checkpoint's held-out greedy accuracy, as GRPO measures it (a GRPO run of 0 steps)
    local step
    for step in $(ls "$1/checkpoints" | grep -E '^[0-9]+$' | sort -n); do
        timed "$(basename "$1")_heldout_$step" lm train --config=configs/grpo.py:reverse \
            --workdir="$1/heldout/$step" --config.init_from="$1/checkpoints/$step" --config.train.num_steps=0
    done
}

sft_continued() {  # sft_continued NAME SEED LR: from the SFT base on its 300 examples at a constant rate
    timed "$1" lm train --config=configs/sft.py:reverse --workdir="$RUNS/$1" --config.init_from="$RUNS/sft_reverse" \
        --config.seed="$2" --config.optimizer.schedule=constant --config.optimizer.learning_rate="$3" \
        --config.optimizer.min_learning_rate="$3" --config.optimizer.warmup_steps=0 \
        --config.train.num_steps=$SFT_STEPS --config.train.checkpoint_every=50 \
        --config.train.keep_checkpoints=100 --config.eval.every=50
    heldout "$RUNS/$1"
}

base() {
    timed sft_reverse lm train --config=configs/sft.py:reverse --workdir="$RUNS/sft_reverse"
    timed sft_reverse_heldout lm train --config=configs/grpo.py:reverse --workdir="$RUNS/sft_reverse_heldout" \
        --config.init_from="$RUNS/sft_reverse" --config.train.num_steps=0
}

grpo() {
    for seed in "${SEEDS[@]}"; do
        timed "grpo_s$seed" lm train --config=configs/grpo.py:reverse --workdir="$RUNS/grpo_s$seed" \
            --config.init_from="$RUNS/sft_reverse" --config.seed="$seed"
    done
}

dr_grpo() {
    for seed in "${SEEDS[@]}"; do
        timed "dr_grpo_s$seed" lm train --config=configs/grpo.py:reverse --workdir="$RUNS/dr_grpo_s$seed" \
            --config.init_from="$RUNS/sft_reverse" --config.seed="$seed" --config.rl.loss=dr_grpo
    done
}

sft() {
    for seed in "${SEEDS[@]}"; do
        sft_continued "sft_lr${SFT_LR}_s$seed" "$seed" $SFT_LR
    done
}

sft_lr() {
    for lr in "${SFT_OTHER_LRS[@]}"; do
        sft_continued "sft_lr${lr}_s0" 0 "$lr"
    done
}

collect() {
    python experiments/studies/grpo_reverse/collect.py --runs="$RUNS" --out=experiments/studies/grpo_reverse
}

for stage in "${@:-base grpo sft dr_grpo sft_lr collect}"; do
    for name in $stage; do
        "$name"
    done
done
