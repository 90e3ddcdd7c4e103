"""The CPU budget of bert_sst2.py: BERT-Mini fine-tuned on SST-2 (dev accuracy) from the pretrained
encoder halfway (step 1000) and finished (step 2000) and from random initialisation, 3 seeds each, 400 steps of 32
rows of 64 pieces, so the nine runs fit a 2-core machine; docs/bert.md#pretrained-vs-scratch has the figures.

  lm train --config=configs/bert.py:mini --workdir=runs/bert_mini   # the encoder first (it keeps
  # its checkpoints of steps 500-2000: the pretrained arms start from step 1000, halfway, and 2000, finished)
  lm sweep --sweep_file=experiments/studies/bert_sst2/bert_sst2_cpu.py --workdir=runs/bert_sst2_cpu
  lm compare runs/bert_sst2_cpu --group_by=init_from
"""

from experiments.studies import bert_budget as budget

CONFIG = budget.config("sst2")
AXES = budget.pretrained_vs_scratch(budget.HALFWAY, budget.FINISHED)
OVERRIDES = budget.cpu_budget(400)
