"""The best learning rate of bert_sst2_cpu_lr.py (3e-4 for both arms, of 3e-5, 1e-4, 3e-4 and
1e-3 on seed 0) with 3 seeds: the SST-2 CPU study (bert_sst2_cpu.py, the same config and budget)
at each arm's best learning rate. Run into the same folder as the search, whose seed-0 arms it reuses; the figures
are in docs/bert.md#pretrained-vs-scratch.

  lm sweep --sweep_file=experiments/studies/bert_sst2/bert_sst2_cpu_lr_best.py --workdir=runs/bert_sst2_cpu_lr
  lm compare runs/bert_sst2_cpu runs/bert_sst2_cpu_lr --group_by=init_from,optimizer.learning_rate
"""

from experiments.studies import bert_budget as budget
from experiments.studies.bert_sst2 import bert_sst2_cpu_lr

CONFIG = bert_sst2_cpu_lr.CONFIG
AXES = {**bert_sst2_cpu_lr.AXES, "optimizer.learning_rate": [3e-4], "seed": list(budget.SEEDS)}
OVERRIDES = bert_sst2_cpu_lr.OVERRIDES
