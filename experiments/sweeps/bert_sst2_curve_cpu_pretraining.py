"""The other pretraining arms of the SST-2 learning curve (experiments/sweeps/bert_curve.py), beside
bert_sst2_curve_cpu.py's in-domain and scratch arms: the tiny encoder pretrained on the shared corpus (GENERAL), on
the corpus and then SST-2's sentences (AFTER, the same 4000 steps in all), and on SST-2's sentences with
bert-base-uncased's vocabulary instead of its own (BERT_VOCAB); each with its own run's vocabulary, at the in-domain
arm's learning rate, on the same label counts and seeds; docs/bert.md#learning-curves-and-in-domain-pretraining.

  lm sweep --sweep_file=experiments/sweeps/bert_sst2_curve_cpu_pretraining.py --workdir=runs/bert_sst2_curve \
      --parallel=2
  lm compare runs/bert_sst2_curve --group_by=init_from --against=data.max_train_examples --plot=dev_accuracy
"""

from experiments.sweeps import bert_curve as curve
from experiments.sweeps import bert_sst2_curve_cpu

CONFIG = bert_sst2_curve_cpu.CONFIG
AXES = {**bert_sst2_curve_cpu.AXES, "init_from": [curve.GENERAL, curve.AFTER, curve.BERT_VOCAB]}
OVERRIDES = {**bert_sst2_curve_cpu.OVERRIDES, "data.vocab": ""}
