r"""Stability over learning rates, at 1e-1: the baseline, QK-norm, the soft-caps and both (the baby GPT, 400 steps).

  lm sweep --sweep_file=experiments/studies/stability/stability_high_lr.py --workdir=runs/stability_high_lr --parallel=2
  lm compare runs/stability_high_lr --group_by=model.qk_norm,model.attention_softcap \
      --plot=logsumexp,eval_cross_entropy --out=runs/stability_high_lr_report

The rate past stability_qk_norm.py's and stability_softcap.py's (1e-2, 3e-2, where the baseline stalls but does
not fail): 2 x 2 x 3 seeds = 12 runs of 400 steps (warmup 20, cosine decay).
"""

from experiments.studies.stability.stability_qk_norm import CONFIG, OVERRIDES

AXES = {
    "model.qk_norm": [False, True],
    "model.attention_softcap": [0.0, 50.0],
    "seed": [0, 1, 2],
}
OVERRIDES = {**OVERRIDES, "optimizer.learning_rate": 1e-1}
__all__ = ["AXES", "CONFIG", "OVERRIDES"]
