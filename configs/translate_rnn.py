"""Recurrent translation models on Multi30k de -> en (bidirectional GRU encoder, GRU decoder).

Variants (pick one after the colon):

  attention    Bahdanau attention (e = v^T tanh(W s + U h), context fed to the decoder).
               lm train --config=configs/translate_rnn.py:attention --workdir=runs/mt_attention
  noattention  The same network with the encoder's final state as the only context (the bottleneck).
               lm train --config=configs/translate_rnn.py:noattention --workdir=runs/mt_noattention
  test         A tiny model and few steps, for tests.

Switches: --config.model.cell=lstm, --config.model.attention=luong_dot|luong_general,
--config.data.tokenizer=word (lowercased words, as the PyTorch tutorials), --config.data.source_lang=en
--config.data.target_lang=de.

Measured on test_2016_flickr (sacreBLEU, beam 4; docs/translation.md has the rest), 2-core CPU at
about 1.0-1.1 steps/s (2,000 steps: ~33 min):
  attention    36.4 after 2100 steps (--config.train.num_steps=2100), 33.0 after 1000
  noattention  21.2 after 1000 steps (--config.train.num_steps=1000)
"""

import ml_collections

from configs import base


def get_config(variant: str = "attention") -> ml_collections.ConfigDict:
    config = base.translation()
    config.model = ml_collections.ConfigDict()
    config.model.architecture = "rnn"
    config.model.cell = "gru"  # gru | lstm
    config.model.attention = "bahdanau"  # none | bahdanau | luong_dot | luong_general
    config.model.embed_dim = 256
    config.model.hidden_dim = 512
    config.model.num_layers = 1
    config.model.dropout = 0.3
    config.model.compute_dtype = "float32"

    if variant == "attention":
        pass
    elif variant == "noattention":
        config.model.attention = "none"
    elif variant == "test":
        config.model.update(embed_dim=16, hidden_dim=32, dropout=0.0)
        base.translation_test_sizes(config)
    else:
        raise ValueError(f"unknown variant {variant!r} of translate_rnn: use attention, noattention or test")
    return config
