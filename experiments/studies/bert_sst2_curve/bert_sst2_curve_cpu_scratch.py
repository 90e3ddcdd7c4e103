"""The scratch arm of the SST-2 learning curve (bert_sst2_curve_cpu.py, the same label counts, seeds
and budget): the tiny encoder from random initialisation with the in-domain run's vocabulary, at its best learning
rate of bert_sst2_curve_cpu_lr.py (3e-4); docs/bert.md#learning-curves-and-in-domain-pretraining.

  lm sweep --sweep_file=experiments/studies/bert_sst2_curve/bert_sst2_curve_cpu_scratch.py \\
      --workdir=runs/bert_sst2_curve --parallel=2
  lm compare runs/bert_sst2_curve --group_by=init_from --against=data.max_train_examples --plot=dev_accuracy
"""

from experiments.studies import bert_curve as curve
from experiments.studies.bert_sst2_curve import bert_sst2_curve_cpu

CONFIG = bert_sst2_curve_cpu.CONFIG
AXES = {**bert_sst2_curve_cpu.AXES, "init_from": [curve.SCRATCH]}
OVERRIDES = {**bert_sst2_curve_cpu.OVERRIDES, "optimizer.learning_rate": 3e-4}
