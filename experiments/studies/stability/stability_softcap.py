"""Stability over learning rates, part 2 of 3: soft-capped attention scores and output logits (Gemma 2's caps,
50 and 30), the arms of stability_qk_norm.py otherwise.

  lm sweep --sweep_file=experiments/studies/stability/stability_softcap.py --workdir=runs/stability_softcap --parallel=2

3 learning rates x 3 seeds = 9 runs of 400 steps; compared with the baseline as stability_qk_norm.py says.
"""

from experiments.studies.stability.stability_qk_norm import CONFIG
from experiments.studies.stability.stability_qk_norm import OVERRIDES as BASE

AXES = {
    "optimizer.learning_rate": [1e-2, 3e-2],
    "seed": [0, 1, 2],
}
OVERRIDES = {**BASE, "model.attention_softcap": 50.0, "model.logit_softcap": 30.0}
__all__ = ["AXES", "CONFIG", "OVERRIDES"]
