"""BERT-Mini fine-tuned on SST-2 (dev accuracy) from the pretrained encoder and from random initialisation, 3
seeds each, the same budget (configs/bert_finetune.py:sst2); docs/bert.md#pretrained-vs-scratch.

  lm train --config=configs/bert.py:mini --workdir=runs/bert_mini   # the pretrained encoder, first
  lm sweep --sweep_file=experiments/studies/bert_sst2/bert_sst2.py --workdir=runs/bert_sst2
  lm compare runs/bert_sst2 --group_by=init_from

2 arms x 3 seeds = 6 runs; init_from="" is the from-scratch arm. Run from the repository root (init_from
is a relative path). On an accelerator add --config.model.compute_dtype=bfloat16.
"""

from experiments.studies import bert_budget as budget

CONFIG = budget.config("sst2")
AXES = budget.pretrained_vs_scratch(budget.PRETRAINED)
