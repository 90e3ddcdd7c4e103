"""Learned vs sinusoidal vs RoPE vs ALiBi positions in the baby model (4 layers, context 64).

  lm sweep --sweep_file=experiments/studies/positions/positions.py --workdir=runs/positions
  lm compare runs/positions

4 arms x 3 seeds = 12 runs of 2000 steps. After training each run also scores the val loss in windows of
128 tokens, twice the training context (results.json: val_cross_entropy_ctx128, a column of the
lm compare table). Learned positions have no table rows past 64, so they have no such score.
sinusoidal_scaled.py adds sinusoidal positions with the token embeddings scaled by sqrt(D).
"""

CONFIG = "configs/gpt_shakespeare.py:baby"
AXES = {
    "model.position": ["learned", "sinusoidal", "rope", "alibi"],
    "seed": [0, 1, 2],
}
OVERRIDES = {"eval.context_lengths": (128,)}
