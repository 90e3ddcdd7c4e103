"""The scratch arm of the CoNLL-2003 learning curve (bert_conll2003_curve_cpu.py, the same label
counts, seeds and budget): the tiny encoder from random initialisation with the in-domain run's vocabulary, at its
best learning rate of bert_conll2003_curve_cpu_lr.py (3e-3); docs/bert.md#learning-curves-and-in-domain-pretraining.

  lm sweep --sweep_file=experiments/studies/bert_conll2003_curve/bert_conll2003_curve_cpu_scratch.py \\
      --workdir=runs/bert_conll2003_curve --parallel=1
  lm compare runs/bert_conll2003_curve --group_by=init_from --against=data.max_train_examples --plot=dev_f1
"""

from experiments.studies import bert_curve as curve
from experiments.studies.bert_conll2003_curve import bert_conll2003_curve_cpu

CONFIG = bert_conll2003_curve_cpu.CONFIG
AXES = {**bert_conll2003_curve_cpu.AXES, "init_from": [curve.SCRATCH]}
OVERRIDES = {**bert_conll2003_curve_cpu.OVERRIDES, "optimizer.learning_rate": 3e-3}
