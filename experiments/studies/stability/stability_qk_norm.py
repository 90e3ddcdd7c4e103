r"""Stability over learning rates, part 1 of 3: the baseline and QK-norm (the baby GPT, 400 steps).

  lm sweep --sweep_file=experiments/studies/stability/stability_qk_norm.py --workdir=runs/stability_qk_norm --parallel=2
  lm compare runs/stability_qk_norm runs/stability_softcap runs/stability_z_loss \
      --group_by=optimizer.learning_rate,model.qk_norm,model.attention_softcap,train.z_loss \
      --plot=logsumexp,eval_cross_entropy --out=runs/stability

At 1e-2 the baseline trains worse than at 3e-3, at 3e-2 it stalls near 3.0 nats, at 1e-1 it learns little more
than character frequencies (3.28; stability_high_lr.py):
does RMSNorm on each head's queries and keys (model.qk_norm) keep it training? 2 x 3 x 3 seeds = 18 runs of
400 steps (warmup 20, cosine decay); stability_softcap.py and stability_z_loss.py are the other arms.
"""

CONFIG = "configs/gpt_shakespeare.py:baby"
AXES = {
    "optimizer.learning_rate": [1e-2, 3e-2],
    "model.qk_norm": [False, True],
    "seed": [0, 1, 2],
}
OVERRIDES = {"train.num_steps": 400, "train.log_every": 20, "train.checkpoint_every": 400, "eval.every": 100,
             "sample.max_new_tokens": 0}
