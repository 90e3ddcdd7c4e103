r"""BERT fine-tuning on SST-2, CoNLL-2003, SQuAD v1.1 and STS-B (experiments/finetune.py; docs/fine-tuning.md).

Variants: TASK or TASK_SIZE, TASK one of sst2, conll2003, squad, stsb and SIZE one of configs/bert.py's
(tiny, mini, small, base, large; mini when left out). The encoder is configs/bert.py's model section of
that size, so --config.init_from=<a configs/bert.py:SIZE run> loads its "bert" parameters by name; without
init_from the encoder trains from scratch (the pretrained-vs-scratch ablation). The tokenizer is the
init_from run's (data.vocab=""), else bert-base-uncased (mini and up pretrain with it).

  sst2       sentence classification, rows of 64, batch 32, 2000 steps (~1 epoch of 67k), lr 1e-4.
             lm train --config=configs/bert_finetune.py:sst2 --workdir=runs/sst2 \
                 --config.init_from=runs/bert_mini
             From scratch (no init_from), 300 steps (--config.train.num_steps=300
             --config.optimizer.decay_steps=300 --config.optimizer.warmup_steps=30 --config.eval.every=100):
             dev accuracy 0.551 / 0.653 / 0.714 at steps 100 / 200 / 300, 13.7 min wall on the 2-core CPU
             shared with other jobs (load average ~11; 4.6 CPU-min). Pretrained vs scratch at a CPU budget
             (experiments/studies/bert_sst2/bert_sst2_cpu.py, 400 steps, 3 seeds): docs/bert.md#pretrained-vs-scratch.
  conll2003  NER, rows of 128, batch 32, 1500 steps (~3.4 epochs), lr 1e-4; valid and test entity F1.
             lm train --config=configs/bert_finetune.py:conll2003 --workdir=runs/conll2003 \
                 --config.init_from=runs/bert_mini
             At a CPU budget, pretrained vs scratch: docs/bert.md#pretrained-vs-scratch.
  squad      rows of 384 (question <= 64 pieces, windows every 128 context pieces), batch 32, 1200 steps
             (~3 epochs of the 44-article training subset's 12k windows), lr 1e-4; dev EM and F1.
             lm train --config=configs/bert_finetune.py:squad --workdir=runs/squad \
                 --config.init_from=runs/bert_mini
             Meant for an accelerator (384-piece rows). At a CPU budget, pretrained vs scratch (rows of 128,
             400 steps; experiments/studies/bert_squad/bert_squad_cpu.py): docs/bert.md#pretrained-vs-scratch.
  stsb       sentence-pair regression, rows of 128, batch 32, 540 steps (3 epochs), lr 1e-4; Pearson and
             Spearman on dev and test.
             lm train --config=configs/bert_finetune.py:stsb --workdir=runs/stsb \
                 --config.init_from=runs/bert_mini
             At a CPU budget, pretrained vs scratch: docs/bert.md#pretrained-vs-scratch.
  TASK_tiny  the tiny encoder (2 / 64 / 2, max 64 positions), 64-piece rows, 256 training examples (drawn
             with the seed) and the first 64 dev/test examples (SQuAD: questions), 10 steps: seconds, for tests.
             sst2_tiny with 250 to all 67,349 labels, pretrained four ways against scratch, 300 steps, 3 seeds
             (experiments/studies/bert_sst2_curve/): docs/bert.md#learning-curves-and-in-domain-pretraining.
             Pretrain the tiny encoder first (its own 1000-piece vocabulary, which the fine-tune then reads from the
             run):
             lm train --config=configs/bert.py:tiny --workdir=/tmp/bert_tiny
             lm train --config=configs/bert_finetune.py:sst2_tiny --workdir=/tmp/sst2_tiny \
                 --config.init_from=/tmp/bert_tiny
             (conll2003_tiny, squad_tiny, stsb_tiny alike.) Without init_from a _tiny variant runs on
             bert-base-uncased's vocabulary.
"""

import ml_collections

from configs import base, bert
from lm.data import tasks
from lm.layers.options import SHARE_BELOW_ONE, declare, option


def get_config(variant: str = "sst2") -> ml_collections.ConfigDict:
    task, _, size = variant.partition("_")
    size = size or "mini"
    if task not in tasks.TASKS or size not in bert.VARIANTS:
        raise ValueError(f"unknown variant {variant!r} of configs/bert_finetune.py: use TASK or TASK_SIZE, TASK one of "
                         f"{', '.join(tasks.TASKS)} and SIZE one of {', '.join(bert.VARIANTS)}")
    config = base.finetune(task)  # the task's row length and steps (lm/data/tasks/__init__.py TASKS)
    # The encoder exactly as configs/bert.py pretrains it at this size (so init_from loads it).
    config.model = bert.get_config(size).model
    declare(config.model, head_dropout=option(0.1, "dropout on the encoder's outputs, before the task head (BERT's "
                                                   "classifier dropout)", bounds=SHARE_BELOW_ONE))

    if size == "tiny":
        config.model.head_dropout = 0.0
        config.data.update(max_seq_len=64, max_train_examples=256, max_eval_examples=64, doc_stride=16,
                           max_query_length=16)
        config.train.update(batch_size=8, num_steps=10, log_every=5, checkpoint_every=10)
        config.optimizer.update(learning_rate=1e-3, warmup_fraction=0.2)
        config.eval.update(every=5, batch_size=32)
    return config
