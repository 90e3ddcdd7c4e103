"""μTransfer, part 1 of 2: the standard parametrization. The baby GPT made 2 blocks deep (head dimension 32),
character-level Tiny Shakespeare, at widths 32 to 256, each trained at 7 learning rates in powers of 2.

  lm sweep --sweep_file=experiments/studies/mutransfer/mutransfer_standard.py \
      --workdir=runs/mutransfer_standard

4 widths x 7 learning rates = 28 runs of 200 steps of 12 x 64 characters (warmup 20 steps, cosine to 0).
mutransfer_mup.py is the same grid under μP (base width 32).
"""

CONFIG = "configs/gpt_shakespeare.py:baby"
AXES = {
    "size": ["32x2", "64x2", "128x2", "256x2"],
    "optimizer.learning_rate": [2.0**-k for k in range(12, 5, -1)],  # 2^-12 (2.4e-4) .. 2^-6 (1.6e-2)
}
OVERRIDES = {
    "train.num_steps": 200,
    "train.log_every": 25,
    "train.checkpoint_every": 200,
    "optimizer.warmup_steps": 20,
    "optimizer.min_learning_rate": 0.0,
    "eval.every": 200,
    "sample.max_new_tokens": 0,
}
