"""Pre-norm vs post-norm across model sizes, part 2: the grid of norm_position_scaling.py at a quarter of its
learning rate, 2^-10 (9.8e-4, about the 1e-3 at which the norm_position study's post-norm trained with warmup).

  lm sweep --sweep_file=experiments/studies/norm_position_scaling/norm_position_scaling_lr10.py \
      --workdir=runs/norm_position_scaling_lr10
  lm scaling runs/norm_position_scaling_lr10 --out=experiments/studies/norm_position_scaling/lr10

2 placements x 5 sizes x 3 seeds = 30 runs.
"""

from experiments.studies.norm_position_scaling.norm_position_scaling import AXES, CONFIG
from experiments.studies.norm_position_scaling.norm_position_scaling import OVERRIDES as RATE_8

OVERRIDES = {**RATE_8, "optimizer.learning_rate": 2.0**-10}
__all__ = ["AXES", "CONFIG", "OVERRIDES"]
