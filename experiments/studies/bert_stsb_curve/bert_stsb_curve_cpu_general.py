"""General against in-domain pretraining on the STS-B learning curve (bert_stsb_curve_cpu.py, the
same label counts, seeds and budget): the tiny encoder pretrained on the shared corpus (GENERAL) with its own
vocabulary (trained on the corpus), at the in-domain arm's learning rate (1e-3, not searched);
docs/bert.md#learning-curves-and-in-domain-pretraining.

  lm sweep --sweep_file=experiments/studies/bert_stsb_curve/bert_stsb_curve_cpu_general.py \\
      --workdir=runs/bert_stsb_curve --parallel=1
  lm compare runs/bert_stsb_curve --group_by=init_from --against=data.max_train_examples --plot=dev_pearson
"""

from experiments.studies import bert_curve as curve
from experiments.studies.bert_stsb_curve import bert_stsb_curve_cpu

CONFIG = bert_stsb_curve_cpu.CONFIG
AXES = {**bert_stsb_curve_cpu.AXES, "init_from": [curve.GENERAL]}
OVERRIDES = {**bert_stsb_curve_cpu.OVERRIDES, "data.vocab": ""}  # the run's own tokenizer
