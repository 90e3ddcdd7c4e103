r"""The Transformer encoder-decoder on Multi30k de -> en, built from the shared blocks.

Variants (pick one after the colon):

  base  3 + 3 layers, 8 heads, 256 wide, post-norm as in Vaswani et al. (every block switch applies:
        --config.model.norm=rms, --config.model.norm_position=pre, --config.model.position=rope, ...).
        lm train --config=configs/translate_transformer.py:base --workdir=runs/mt_transformer
  test  A tiny model and few steps, for tests.

Measured on test_2016_flickr: 36.6 sacreBLEU, 37.0 lowercased tokenised BLEU (beam 4) after 2000
steps of the full run's 2500-step schedule (--config.train.num_steps=2000 --config.optimizer.decay_steps=2500:
without the pin a shorter run's schedule ends with the run), at about 1.05-1.24 steps/s on a 2-core CPU
(~30 min).

Other sentence pairs: --config.data.source (records with data.source_field and data.target_field; val and
test from data.val_source and data.test_source, else held out: docs/translation.md), e.g. WMT14 de-en as
tensorflow-datasets prepares it (not run here: no copy of it on these machines):
  lm train --config=configs/translate_transformer.py:base --workdir=runs/mt_wmt14 \
      --config.data.source=tfds:wmt14_translate/de-en --config.data.val_source=tfds:wmt14_translate/de-en:validation \
      --config.data.test_source=tfds:wmt14_translate/de-en:test --config.data.buckets='(16, 32, 64, 128)'
Run with Multi30k as jsonl instead (docs/translation.md), as :test only: the same losses, results.json and
translations as :test on the files.
"""

import ml_collections

from configs import base
from lm.layers.options import at_least, declare, option
from lm.models.config import transformer_options


def get_config(variant: str = "base") -> ml_collections.ConfigDict:
    config = base.translation()
    config.model = transformer_options(
        num_layers=3, num_heads=8, num_kv_heads=8, embed_dim=256, norm_position="post", position="sinusoidal",
        init="xavier", dropout=0.1,
    )
    declare(
        config.model,
        architecture=option("transformer", "the translation model family (experiments/translation.py)"),
        vocab_multiple=option(64, "each vocabulary padded to a multiple of this, so it divides the 'tensor' mesh axis",
                              bounds=at_least(1)),
        scale_embeddings=option(True, "token embeddings times sqrt(D), as in the paper"),
    )
    config.optimizer.learning_rate = 5e-4

    if variant == "base":
        pass
    elif variant == "test":
        config.model.update(num_layers=1, num_heads=2, num_kv_heads=2, embed_dim=32, dropout=0.0)
        base.translation_test_sizes(config)
    else:
        raise ValueError(f"unknown variant {variant!r} of configs/translate_transformer.py: use base or test")
    return config
