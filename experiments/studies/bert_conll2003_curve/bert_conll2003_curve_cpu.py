"""The CoNLL-2003 learning curve on the CPU (experiments/studies/bert_curve.py), pretrained arm: the tiny encoder
pretrained on CoNLL-2003's own training sentences with its own vocabulary (CONLL_IN_DOMAIN) at its best learning rate
of bert_conll2003_curve_cpu_lr.py (1e-2), on 250, 1000, 4000 and all 14,041 labelled sentences (drawn with the seed:
every arm of a seed sees the same ones), 3 seeds, scored by valid (dev) and test entity F1.
bert_conll2003_curve_cpu_scratch.py and bert_conll2003_curve_cpu_general.py run the scratch and general arms at their
own best learning rates into the same folder; docs/bert.md#learning-curves-and-in-domain-pretraining.

  lm sweep --sweep_file=experiments/studies/bert_conll2003_curve/bert_conll2003_curve_cpu.py \\
      --workdir=runs/bert_conll2003_curve --parallel=1
  lm compare runs/bert_conll2003_curve --group_by=init_from --against=data.max_train_examples --plot=dev_f1
"""

from experiments.studies import bert_curve as curve

CONFIG = "configs/bert_finetune.py:conll2003_tiny"
AXES = curve.curve_axes([curve.CONLL_IN_DOMAIN], curve.CONLL_LABELS)
OVERRIDES = {**curve.finetune(f"{curve.CONLL_IN_DOMAIN}/tokenizer"), "optimizer.learning_rate": 1e-2}
