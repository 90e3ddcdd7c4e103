"""GELU MLP vs SwiGLU at equal parameter count in the baby model (4 layers, 128 wide).

  lm sweep --sweep_file=experiments/studies/mlp_kind/mlp_kind.py --workdir=runs/mlp_kind
  lm compare runs/mlp_kind

Equal parameters come from lm/layers/mlp.py mlp_hidden_dim: at model.mlp_ratio=4 the GELU MLP is
128 -> 512 -> 128 (two matrices) and SwiGLU, with three matrices, gets 2/3 of that width rounded to
model.mlp_multiple=8: 128 -> 344 -> 128 (132,096 vs 131,072 weights a block, +0.8%). The parameter
column of lm compare shows the totals. 2 arms x 3 seeds = 6 runs of 2000 steps.
"""

CONFIG = "configs/gpt_shakespeare.py:baby"
AXES = {
    "model.mlp": ["gelu", "swiglu"],
    "seed": [0, 1, 2],
}
OVERRIDES = {}
