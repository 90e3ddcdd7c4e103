"""Pre-norm vs post-norm, with and without learning-rate warmup, 8 layers deep (the baby model otherwise).

  lm sweep --sweep_file=experiments/studies/norm_position/norm_position.py --workdir=runs/norm_position
  lm compare runs/norm_position

The literature says post-norm needs warmup and pre-norm trains without it: 2 x 2 arms x 3 seeds = 12
runs of 2000 steps (warmup 100 steps, or none: the learning rate starts at its 1e-3 peak).
"""

CONFIG = "configs/gpt_shakespeare.py:baby"
AXES = {
    "model.norm_position": ["pre", "post"],
    "optimizer.warmup_steps": [100, 0],
    "seed": [0, 1, 2],
}
OVERRIDES = {"model.num_layers": 8}
