"""Sinusoidal positions with the token embeddings scaled by sqrt(D), next to the positions sweep.

  lm sweep --sweep_file=experiments/studies/positions/sinusoidal_scaled.py --workdir=runs/sinusoidal_scaled
  lm compare runs/positions runs/sinusoidal_scaled

The baby GPT's token embeddings start at N(0, 0.02) while the sinusoidal table has amplitude 1, so
unscaled, the position signal swamps the tokens. Vaswani et al. (3.4) multiply the embeddings by
sqrt(D) (x11.3 at D = 128). 1 arm x 3 seeds, scored at 2x the training context as in positions.py.
"""

CONFIG = "configs/gpt_shakespeare.py:baby"
AXES = {
    "model.position": ["sinusoidal"],
    "model.scale_embeddings": [True],
    "seed": [0, 1, 2],
}
OVERRIDES = {"eval.context_lengths": (128,)}
