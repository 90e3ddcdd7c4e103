"""The Transformer encoder-decoder on Multi30k de -> en, built from the shared blocks.

Variants (pick one after the colon):

  base  3 + 3 layers, 8 heads, 256 wide, post-norm as in Vaswani et al. (every block switch applies:
        --config.model.norm=rms, --config.model.norm_position=pre, --config.model.position=rope, ...).
        lm train --config=configs/translate_transformer.py:base --workdir=runs/mt_transformer
  test  A tiny model and few steps, for tests.

Measured on test_2016_flickr: 36.6 sacreBLEU, 37.0 lowercased tokenised BLEU (beam 4) after 2000
steps (--config.train.num_steps=2000), at about 1.05-1.24 steps/s on a 2-core CPU (~30 min).
"""

import ml_collections

from configs import base
from lm.models.config import transformer_options


def get_config(variant: str = "base") -> ml_collections.ConfigDict:
    config = base.translation()
    config.model = transformer_options(
        num_layers=3, num_heads=8, num_kv_heads=8, embed_dim=256, norm_position="post", position="sinusoidal",
        init="xavier", dropout=0.1,
    )
    config.model.architecture = "transformer"
    config.model.vocab_multiple = 64
    config.model.scale_embeddings = True  # token embeddings times sqrt(D), as in the paper
    config.optimizer.update(learning_rate=5e-4, warmup_steps=200)

    if variant == "base":
        pass
    elif variant == "test":
        config.model.update(num_layers=1, num_heads=2, num_kv_heads=2, embed_dim=32, dropout=0.0)
        base.translation_test_sizes(config)
    else:
        raise ValueError(f"unknown variant {variant!r} of translate_transformer: use base or test")
    return config
