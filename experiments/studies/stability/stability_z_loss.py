"""Stability over learning rates, part 3 of 3: the output z-loss at PaLM's weight (train.z_loss=1e-4), the arms of
stability_qk_norm.py otherwise; every run logs logsumexp (the mean log-partition of the output logits), so the
z-loss's effect on the logits' scale compares with the baseline's.

  lm sweep --sweep_file=experiments/studies/stability/stability_z_loss.py --workdir=runs/stability_z_loss --parallel=2

3 learning rates x 3 seeds = 9 runs of 400 steps.
"""

from experiments.studies.stability.stability_qk_norm import CONFIG
from experiments.studies.stability.stability_qk_norm import OVERRIDES as BASE

AXES = {
    "optimizer.learning_rate": [1e-2, 3e-2],
    "seed": [0, 1, 2],
}
OVERRIDES = {**BASE, "train.z_loss": 1e-4}
__all__ = ["AXES", "CONFIG", "OVERRIDES"]
