"""The learning-rate search of the CoNLL-2003 learning curve's general arm (bert_conll2003_curve_cpu_lr.py's, for the
tiny encoder pretrained on the shared corpus, GENERAL, with its own vocabulary): 1000 labelled sentences, seed 0, at
the same learning rates; bert_conll2003_curve_cpu_general.py runs its best over the label counts and seeds
(docs/bert.md#learning-curves-and-in-domain-pretraining).

  lm sweep --sweep_file=experiments/studies/bert_conll2003_curve/bert_conll2003_curve_cpu_general_lr.py \\
      --workdir=runs/bert_conll2003_curve_lr --parallel=1
  lm compare runs/bert_conll2003_curve_lr --group_by=init_from,optimizer.learning_rate --plot=dev_f1
"""

from experiments.studies import bert_curve as curve
from experiments.studies.bert_conll2003_curve import bert_conll2003_curve_cpu_lr as lr

CONFIG = lr.CONFIG
AXES = {**lr.AXES, "init_from": [curve.GENERAL]}
OVERRIDES = {**lr.OVERRIDES, "data.vocab": ""}  # the run's own tokenizer (trained on the corpus)
