"""The learning-rate search of the STS-B learning curve (experiments/studies/bert_curve.py): the tiny encoder
pretrained on STS-B's own sentences (STSB_IN_DOMAIN) and from scratch with its vocabulary, 1000 labelled pairs,
seed 0, each at 3e-4, 1e-3 and 3e-3, scored by dev Pearson; bert_stsb_curve_cpu.py runs each arm's best (1e-3 for
both) over the label counts and seeds (docs/bert.md#learning-curves-and-in-domain-pretraining).

  lm sweep --sweep_file=experiments/studies/bert_stsb_curve/bert_stsb_curve_cpu_lr.py \\
      --workdir=runs/bert_stsb_curve_lr --parallel=2
  lm compare runs/bert_stsb_curve_lr --group_by=init_from,optimizer.learning_rate
"""

from experiments.studies import bert_curve as curve

CONFIG = "configs/bert_finetune.py:stsb_tiny"
AXES = curve.lr_search(curve.STSB_IN_DOMAIN)
OVERRIDES = curve.finetune(f"{curve.STSB_IN_DOMAIN}/tokenizer")
