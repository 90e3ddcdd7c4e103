"""The STS-B learning curve on the CPU (experiments/studies/bert_curve.py): the tiny encoder pretrained on STS-B's own
sentences with its own vocabulary (STSB_IN_DOMAIN) against the same encoder from scratch with that vocabulary, both
at their best learning rate of bert_stsb_curve_cpu_lr.py (1e-3 for each), on 250, 1000, 4000 and all 5,749 labelled
pairs (drawn with the seed: both arms of a seed see the same ones), 3 seeds, scored by dev and test Pearson and
Spearman; docs/bert.md#learning-curves-and-in-domain-pretraining.

  lm sweep --sweep_file=experiments/studies/bert_stsb_curve/bert_stsb_curve_cpu.py \\
      --workdir=runs/bert_stsb_curve --parallel=2
  lm compare runs/bert_stsb_curve --group_by=init_from --against=data.max_train_examples --plot=dev_pearson
"""

from experiments.studies import bert_curve as curve

CONFIG = "configs/bert_finetune.py:stsb_tiny"
AXES = curve.curve_axes([curve.STSB_IN_DOMAIN, curve.SCRATCH], curve.STSB_LABELS)
OVERRIDES = {**curve.finetune(f"{curve.STSB_IN_DOMAIN}/tokenizer"), "optimizer.learning_rate": 1e-3}
