"""Pre-norm vs post-norm across model sizes, under μP: the mutransfer study's recipe (the baby GPT, character-level
Tiny Shakespeare, 200 steps of 12 x 64 characters, warmup 20 steps, cosine to 0, μP with base width 32) made
4 blocks deep, at the learning rate that study found best at the base width, for both placements.

  lm sweep --sweep_file=experiments/studies/norm_position_scaling/norm_position_scaling.py \
      --workdir=runs/norm_position_scaling
  lm scaling runs/norm_position_scaling --out=experiments/studies/norm_position_scaling

2 placements x 5 sizes (widths 32 to 192: 49k to 1.77M non-embedding parameters, 36x) x 3 seeds = 30 runs.
"""

from experiments.studies.mutransfer.mutransfer_mup import CONFIG
from experiments.studies.mutransfer.mutransfer_mup import OVERRIDES as MUP

AXES = {  # the size outermost: the arms run smallest first, both placements at each size
    "size": ["32x4", "64x4", "96x4", "128x4", "192x4"],
    "model.norm_position": ["pre", "post"],
    "seed": [0, 1, 2],
}
OVERRIDES = {**MUP, "optimizer.learning_rate": 2.0**-8}  # 3.9e-3: the best of mutransfer's at width 32
__all__ = ["AXES", "CONFIG", "OVERRIDES"]
