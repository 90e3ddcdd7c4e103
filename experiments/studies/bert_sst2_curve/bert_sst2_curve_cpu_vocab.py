"""The vocabulary on the SST-2 learning curve (experiments/studies/bert_curve.py): the tiny encoder pretrained on
SST-2's sentences with bert-base-uncased's 30,522 pieces (BERT_VOCAB) instead of the 8000 trained on those sentences
(bert_sst2_curve_cpu.py's in-domain arm), at that arm's learning rate (1e-3), on the same label counts and seeds;
docs/bert.md#learning-curves-and-in-domain-pretraining.

  lm sweep --sweep_file=experiments/studies/bert_sst2_curve/bert_sst2_curve_cpu_vocab.py \\
      --workdir=runs/bert_sst2_curve --parallel=2
  lm compare runs/bert_sst2_curve --group_by=init_from --against=data.max_train_examples --plot=dev_accuracy
"""

from experiments.studies import bert_curve as curve
from experiments.studies.bert_sst2_curve import bert_sst2_curve_cpu

CONFIG = bert_sst2_curve_cpu.CONFIG
AXES = {**bert_sst2_curve_cpu.AXES, "init_from": [curve.BERT_VOCAB]}
OVERRIDES = {**bert_sst2_curve_cpu.OVERRIDES, "data.vocab": ""}  # the run's own tokenizer: bert-base-uncased's
