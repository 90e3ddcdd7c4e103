"""AdamW against Muon (Muon on the blocks' matrices at 0.02, AdamW at 1e-3 on embeddings, norms and biases), the
baby model at 1000 steps (the CPU budget), cosine decay, 3 seeds.

  lm sweep --sweep_file=experiments/studies/optimizer/optimizer.py --workdir=runs/optimizer
  lm compare runs/optimizer

Muon's learning rate was chosen by a check at seed 0 (docs/ablations.md): 0.01, 0.02 and 0.05.
"""

CONFIG = "configs/gpt_shakespeare.py:baby"
AXES = {
    "optimizer.name": ["adamw", "muon"],
    "seed": [0, 1, 2],
}
OVERRIDES = {"train.num_steps": 1000}
