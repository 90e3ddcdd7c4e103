"""BERT-Mini fine-tuned on SQuAD v1.1 (dev EM and F1; trained on the 44-article subset of the training set)
from the pretrained encoder and from random initialisation, 3 seeds each, the same budget
(configs/bert_finetune.py:squad); docs/bert.md#pretrained-vs-scratch.

  lm train --config=configs/bert.py:mini --workdir=runs/bert_mini   # the pretrained encoder, first
  lm sweep --sweep_file=experiments/studies/bert_squad/bert_squad.py --workdir=runs/bert_squad
  lm compare runs/bert_squad --group_by=init_from

2 arms x 3 seeds = 6 runs; init_from="" is the from-scratch arm. Run from the repository root (init_from
is a relative path). On an accelerator add --config.model.compute_dtype=bfloat16.
"""

from experiments.studies import bert_budget as budget

CONFIG = budget.config("squad")
AXES = budget.pretrained_vs_scratch(budget.PRETRAINED)
