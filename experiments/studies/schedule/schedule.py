"""Cosine decay against warmup-stable-decay (WSD: constant, then a linear decay over the last 20%), AdamW on the
baby model at 1000 steps (the CPU budget), 3 seeds.

  lm sweep --sweep_file=experiments/studies/schedule/schedule.py --workdir=runs/schedule
  lm compare runs/schedule

The WSD run extended from a checkpoint (docs/ablations.md): the same sweep at 500 steps, then again at 1000 in
the same folders; each goes on from its step-400 checkpoint, the last of its stable phase.
"""

CONFIG = "configs/gpt_shakespeare.py:baby"
AXES = {
    "optimizer.schedule": ["cosine", "wsd"],
    "seed": [0, 1, 2],
}
OVERRIDES = {"train.num_steps": 1000}
