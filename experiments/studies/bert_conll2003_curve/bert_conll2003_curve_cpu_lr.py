"""The learning-rate search of the CoNLL-2003 learning curve (experiments/studies/bert_curve.py): the tiny encoder
pretrained on CoNLL-2003's own training sentences (CONLL_IN_DOMAIN) and from scratch with its vocabulary, 1000
labelled sentences, seed 0, each at 3e-4, 1e-3, 3e-3, 1e-2 and 3e-2 (LEARNING_RATES and two more: both arms were best
at 3e-3, the edge of the usual three, and the in-domain arm then at 1e-2), scored by dev (valid) entity F1;
bert_conll2003_curve_cpu.py and bert_conll2003_curve_cpu_scratch.py run each arm's best over the label counts and seeds
(docs/bert.md#learning-curves-and-in-domain-pretraining).

  lm sweep --sweep_file=experiments/studies/bert_conll2003_curve/bert_conll2003_curve_cpu_lr.py \\
      --workdir=runs/bert_conll2003_curve_lr --parallel=1
  lm compare runs/bert_conll2003_curve_lr --group_by=init_from,optimizer.learning_rate --plot=dev_f1
"""

from experiments.studies import bert_curve as curve

CONFIG = "configs/bert_finetune.py:conll2003_tiny"
LEARNING_RATES = (*curve.LEARNING_RATES, 1e-2, 3e-2)
AXES = curve.lr_search(curve.CONLL_IN_DOMAIN, LEARNING_RATES)
OVERRIDES = curve.finetune(f"{curve.CONLL_IN_DOMAIN}/tokenizer")
