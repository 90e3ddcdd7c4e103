"""General against in-domain pretraining on the SST-2 learning curve (experiments/studies/bert_curve.py), beside
bert_sst2_curve_cpu.py's in-domain arm and bert_sst2_curve_cpu_scratch.py: the tiny encoder pretrained on the shared
corpus (GENERAL) and on the corpus and then SST-2's sentences (AFTER: 2000 + 2000 steps, the in-domain arm's 4000 in
all), each with its run's own vocabulary (trained on the corpus), at the in-domain arm's learning rate (1e-3), on the
same label counts and seeds; docs/bert.md#learning-curves-and-in-domain-pretraining.

  lm sweep --sweep_file=experiments/studies/bert_sst2_curve/bert_sst2_curve_cpu_general.py \\
      --workdir=runs/bert_sst2_curve --parallel=2
  lm compare runs/bert_sst2_curve --group_by=init_from --against=data.max_train_examples --plot=dev_accuracy
"""

from experiments.studies import bert_curve as curve
from experiments.studies.bert_sst2_curve import bert_sst2_curve_cpu

CONFIG = bert_sst2_curve_cpu.CONFIG
AXES = {**bert_sst2_curve_cpu.AXES, "init_from": [curve.GENERAL, curve.AFTER]}
OVERRIDES = {**bert_sst2_curve_cpu.OVERRIDES, "data.vocab": ""}  # each run's own tokenizer
