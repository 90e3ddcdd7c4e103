r"""Recurrent translation models on Multi30k de -> en (bidirectional GRU encoder, GRU decoder).

Variants (pick one after the colon):

  attention    Bahdanau attention (e = v^T tanh(W s + U h), context fed to the decoder).
               lm train --config=configs/translate_rnn.py:attention --workdir=runs/mt_attention
  noattention  The same network with the encoder's final state as the only context (the bottleneck).
               lm train --config=configs/translate_rnn.py:noattention --workdir=runs/mt_noattention
  test         A tiny model and few steps, for tests.

Switches: --config.model.cell=lstm, --config.model.attention=luong_dot|luong_general,
--config.data.tokenizer=word (lowercased words, as the PyTorch tutorials), --config.data.source_lang=en
--config.data.target_lang=de.

Other sentence pairs: --config.data.source=files:GLOB|tfds:...|hf:... reads records with the fields
data.source_field and data.target_field (de, en); val and test are data.val_source and data.test_source, else
data.held_out_pairs each held out from the source's end (docs/translation.md). Multi30k as jsonl (made as in
docs/translation.md) gives the very run the files give:
  lm train --config=configs/translate_rnn.py:attention --workdir=runs/mt_attention_jsonl \
      --config.data.source=files:/tmp/multi30k_jsonl/train.jsonl \
      --config.data.val_source=files:/tmp/multi30k_jsonl/val.jsonl \
      --config.data.test_source=files:/tmp/multi30k_jsonl/test.jsonl
  Run only as :test: the same losses, results.json and translations as :test on the files (54 s on a
  loaded 2-core CPU, compiling; the files' run 14 s with the compilation cache warm).

Measured on test_2016_flickr (sacreBLEU, beam 4; docs/translation.md has the rest), 2-core CPU at
about 1.0-1.1 steps/s (2,000 steps: ~33 min), stopped early on the full run's 2500-step schedule (a
shorter run's schedule ends with the run unless --config.optimizer.decay_steps=2500 pins it, as here):
  attention    36.4 after 2100 steps (--config.train.num_steps=2100 --config.optimizer.decay_steps=2500),
               33.0 after 1000
  noattention  21.2 after 1000 steps (--config.train.num_steps=1000 --config.optimizer.decay_steps=2500)
"""

import ml_collections

from configs import base
from lm.layers.options import SHARE_BELOW_ONE, at_least, declare, option
from lm.layers.rnn import CELLS
from lm.layers.transformer import COMPUTE_DTYPES
from lm.models.seq2seq import ATTENTIONS


def get_config(variant: str = "attention") -> ml_collections.ConfigDict:
    config = base.translation()
    config.model = declare(
        ml_collections.ConfigDict(),
        architecture=option("rnn", "the translation model family (experiments/translation.py)"),
        cell=option("gru", "the recurrent cell of the encoder and the decoder", choices=CELLS),
        attention=option("bahdanau", "how the decoder reads the source (lm/models/seq2seq.py); none: the "
                                     "encoder's final state is the only context", choices=ATTENTIONS),
        embed_dim=option(256, "the token embedding width", bounds=at_least(1)),
        hidden_dim=option(512, "the cell width: per direction in the encoder, the decoder's state",
                          bounds=at_least(1)),
        num_layers=option(1, "cells stacked in the encoder (each bidirectional) and in the decoder",
                         bounds=at_least(1)),
        dropout=option(0.3, "dropout on embeddings and cell outputs", bounds=SHARE_BELOW_ONE),
        compute_dtype=option("float32", "compute dtype; parameters stay float32", choices=tuple(COMPUTE_DTYPES)),
    )

    if variant == "attention":
        pass
    elif variant == "noattention":
        config.model.attention = "none"
    elif variant == "test":
        config.model.update(embed_dim=16, hidden_dim=32, dropout=0.0)
        base.translation_test_sizes(config)
    else:
        raise ValueError(f"unknown variant {variant!r} of configs/translate_rnn.py: use attention, noattention or test")
    return config
