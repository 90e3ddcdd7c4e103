r"""BERT pretraining: masked LM (15% of tokens: 80% [MASK], 10% random, 10% kept) plus next-sentence
prediction, on sentence pairs packed to data.max_seq_len from the English corpus in $LM_DATA_DIR/corpus
(experiments/masked_lm.py, lm/data/masked_lm.py, lm/models/bert.py; docs/bert.md).

Variants (pick one after the colon); sizes from lm/models/bert.py BERT_SIZES (layers / width / heads):

  tiny   2 / 64 / 2, a 1000-piece WordPiece vocabulary trained on the fly on 20 speeches, sequences of
         64, 30 steps: for tests.
         lm train --config=configs/bert.py:tiny --workdir=/tmp/bert_tiny
         Measured on the 2-core CPU: 8.7 s wall (compilation cache warm; 35 s loaded and cold); eval loss
         7.63 -> 6.66.
  mini   4 / 256 / 4 (BERT-Mini), bert-base-uncased's vocabulary, sequences of 128, batch 32: the CPU model.
         lm train --config=configs/bert.py:mini --workdir=runs/bert_mini
         Measured only for 150 of its 2000 steps (--config.train.num_steps=150 --config.optimizer.decay_steps=150
         --config.optimizer.warmup_steps=30) on a loaded 2-core CPU: 14.6 min, 626-1,072 tokens/s, held-out
         masked-LM loss 10.36 -> 6.80, accuracy 6.6%, NSP accuracy 51% (docs/bert.md).
         As it is, on one core of the CPU: 1,560-1,790 tokens/s, 2000 steps (8.2M tokens) in ~83 min; held-out
         masked-LM loss 10.36 -> 6.22 (step 1000) -> 6.11 (step 2000), accuracy 13.7%, NSP accuracy 91.0%
         (docs/bert.md). It keeps its 4 checkpoints (500-2000): the pretrained-vs-scratch study's sweeps
         (experiments/studies/bert_*/bert_*_cpu.py) start from steps 1000 and 2000.
  small  4 / 512 / 8 (BERT-Small), batch 128; not yet run.
         lm train --config=configs/bert.py:small --workdir=runs/bert_small
  base   12 / 768 / 12 (BERT-Base, 110M parameters), batch 256, for an accelerator; not yet run.
         lm train --config=configs/bert.py:base --workdir=runs/bert_base
  large  24 / 1024 / 16 (BERT-Large, 340M parameters), batch 256, for an accelerator; not yet run.
         lm train --config=configs/bert.py:large --workdir=runs/bert_large

Other documents: --config.data.source=files:GLOB|tfds:...|hf:... instead of data.corpus, each record's
data.text_field one document, one paragraph a line (docs/bert.md). The corpus as jsonl (made as in docs/data.md)
gives the very run the corpus file gives:
  lm train --config=configs/bert.py:tiny --workdir=/tmp/bert_tiny_jsonl \
      --config.data.source=files:/tmp/corpus_jsonl/us_presidential_speeches.jsonl
  Measured: the same 3,243 training and 335 held-out pairs, eval loss 7.63 -> 6.66 and results.json as :tiny
  on the corpus file (19 s on a loaded 2-core CPU).

Tokenizer: data.vocab names a vocab.txt ("bert-base-uncased": $LM_DATA_DIR/vocab/bert-base-uncased-vocab.txt,
or a path), or data.vocab="" with data.vocab_size=N trains an N-piece WordPiece vocabulary on the training
documents; either way the run saves it as <workdir>/tokenizer/tokenizer.json.
Every shared block option can be switched, e.g. --config.model.position=rope --config.model.norm_position=pre.
"""

import ml_collections

from configs import base

VARIANTS = ("tiny", "mini", "small", "base", "large")


def get_config(variant: str = "mini") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r} of configs/bert.py: use one of {', '.join(VARIANTS)}")
    config = base.masked_lm(variant)

    if variant == "tiny":
        config.model.update(dropout=0.0, attention_dropout=0.0, max_positions=64)
        config.data.update(corpus=("us_presidential_speeches",), max_documents=20, eval_documents=2, vocab="",
                           vocab_size=1000, max_seq_len=64, max_predictions=10)
        config.train.update(batch_size=16, num_steps=30, log_every=10, checkpoint_every=30)
        config.optimizer.update(learning_rate=3e-3, min_learning_rate=3e-4, warmup_fraction=0.1,
                                weight_decay=0.0)
        config.eval.update(every=15, batch_size=16, num_batches=2)
    elif variant == "mini":
        config.train.update(batch_size=32, num_steps=2000, log_every=50, checkpoint_every=500, keep_checkpoints=4)
        config.optimizer.update(learning_rate=5e-4, min_learning_rate=5e-5, warmup_fraction=0.05)
        config.eval.update(every=250, batch_size=32, num_batches=8)
    elif variant == "small":
        config.train.update(batch_size=128, num_steps=20_000, log_every=100, checkpoint_every=2000)
        config.optimizer.update(learning_rate=3e-4, warmup_fraction=0.025)
    return config
