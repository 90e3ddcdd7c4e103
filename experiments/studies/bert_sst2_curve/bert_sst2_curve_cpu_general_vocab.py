"""The vocabulary on general text, on the SST-2 learning curve (experiments/studies/bert_curve.py): the tiny encoder
pretrained on the shared corpus with bert-base-uncased's 30,522 pieces (GENERAL_BERT_VOCAB) instead of the 8000
trained on the corpus (bert_sst2_curve_cpu_general.py's GENERAL arm), at that arm's learning rate (1e-3), on the same
label counts and seeds; docs/bert.md#learning-curves-and-in-domain-pretraining.

  lm sweep --sweep_file=experiments/studies/bert_sst2_curve/bert_sst2_curve_cpu_general_vocab.py \\
      --workdir=runs/bert_sst2_curve --parallel=1
  lm compare runs/bert_sst2_curve --group_by=init_from --against=data.max_train_examples --plot=dev_accuracy
"""

from experiments.studies import bert_curve as curve
from experiments.studies.bert_sst2_curve import bert_sst2_curve_cpu_vocab

CONFIG = bert_sst2_curve_cpu_vocab.CONFIG
AXES = {**bert_sst2_curve_cpu_vocab.AXES, "init_from": [curve.GENERAL_BERT_VOCAB]}
OVERRIDES = bert_sst2_curve_cpu_vocab.OVERRIDES  # lr 1e-3, the run's own tokenizer: bert-base-uncased's
