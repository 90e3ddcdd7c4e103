"""A learning-rate ablation of the SST-2 CPU study (bert_sst2_cpu.py, the same config and budget,
which runs 1e-4): the finished encoder (step 2000) and random initialisation, each at 3e-5, 3e-4 and 1e-3, seed 0,
to see whether the pretrained arm's deficit is one of learning rate (BERT-Mini's published SST-2 figure is the best
of a search over 3e-5 to 3e-4); bert_sst2_cpu_lr_best.py runs the best with 3 seeds. The figures are in
docs/bert.md#pretrained-vs-scratch.

  lm sweep --sweep_file=experiments/studies/bert_sst2/bert_sst2_cpu_lr.py --workdir=runs/bert_sst2_cpu_lr
  lm compare runs/bert_sst2_cpu runs/bert_sst2_cpu_lr --group_by=init_from,optimizer.learning_rate
"""

from experiments.studies import bert_budget as budget
from experiments.studies.bert_sst2 import bert_sst2_cpu

CONFIG = bert_sst2_cpu.CONFIG
AXES = {
    "init_from": [budget.FINISHED, budget.SCRATCH],
    "optimizer.learning_rate": [1e-3, 3e-4, 3e-5],
    "seed": [0],
}
OVERRIDES = bert_sst2_cpu.OVERRIDES
