"""Character-level GPT pretraining on Tiny Shakespeare.

Variants (pick one after the colon):

  baby   4 layers, 4 heads, 128 wide, context 64, batch 12, 2000 steps: the CPU model.
         lm train --config=configs/gpt_shakespeare.py:baby --workdir=runs/baby
         Reaches val loss 1.88 in 50-115 s on a 2-core CPU, before nanoGPT's same run side by side
         (docs/results.md; docs/performance.md).
  small  6 layers, 6 heads, 384 wide, context 256, batch 64, 5000 steps: nanoGPT's "shakespeare_char"
         recipe (dropout 0.2 on embeddings, sub-layer outputs and attention weights; no biases;
         AdamW 1e-3 to 1e-4, b2 0.99, weight decay 0.1, 100 warmup steps; eval every 250 steps).
         lm train --config=configs/gpt_shakespeare.py:small --workdir=runs/small
         Meant for an accelerator; it overfits after its best val loss, as nanoGPT's does (nanoGPT:
         best 1.47-1.48, 1.72 at step 5000). Measured on an H100 before this recipe: attention
         dropout 0 gave best 1.51 (step 1000); attention dropout 0.2 (biases still on) 1.4685 at step
         2000. This exact config (no biases too) is not yet measured.
  test   A tiny model that trains in seconds, for tests.
         lm train --config=configs/gpt_shakespeare.py:test --workdir=/tmp/lm_test

Any field can be overridden on the command line, e.g.
  --config.model.norm=rms --config.model.norm_position=post --config.model.mlp=swiglu
  --config.model.position=rope --config.model.moe.num_experts=4 --config.mesh.fsdp=2
"""

import ml_collections

from configs import base


def get_config(variant: str = "baby") -> ml_collections.ConfigDict:
    config = base.language_model("tinyshakespeare")  # the baby model

    if variant == "baby":
        pass
    elif variant == "small":
        config.model.update(num_layers=6, num_heads=6, num_kv_heads=6, embed_dim=384, dropout=0.2,
                            attention_dropout=0.2, use_bias=False)
        config.data.context_length = 256
        config.train.update(batch_size=64, num_steps=5000, checkpoint_every=1000)
        config.optimizer.warmup_steps = 100  # nanoGPT's, whatever the run's length
        config.eval.update(every=250, batch_size=64, num_batches=50)
    elif variant == "test":
        config.model.update(num_layers=2, num_heads=2, num_kv_heads=2, embed_dim=32)
        config.data.context_length = 16
        config.train.update(batch_size=8, num_steps=20, log_every=5, checkpoint_every=10)
        config.optimizer.update(learning_rate=3e-3, min_learning_rate=3e-4, warmup_fraction=0.1)
        config.eval.update(every=10, batch_size=8, num_batches=2)
        config.sample.max_new_tokens = 20
    else:
        raise ValueError(f"unknown variant {variant!r} of configs/gpt_shakespeare.py: use baby, small or test")
    return config
