"""The learning-rate search of the SST-2 learning curve (experiments/studies/bert_curve.py): the tiny encoder
pretrained on SST-2's own sentences (IN_DOMAIN) and from scratch with its vocabulary, 1000 labels, seed 0, each at
3e-4, 1e-3 and 3e-3; bert_sst2_curve_cpu.py and bert_sst2_curve_cpu_scratch.py run each arm's best over the
label counts and seeds (docs/bert.md#learning-curves-and-in-domain-pretraining).

  lm sweep --sweep_file=experiments/studies/bert_sst2_curve/bert_sst2_curve_cpu_lr.py \\
      --workdir=runs/bert_sst2_curve_lr --parallel=2
  lm compare runs/bert_sst2_curve_lr --group_by=init_from,optimizer.learning_rate
"""

from experiments.studies import bert_curve as curve

CONFIG = "configs/bert_finetune.py:sst2_tiny"
AXES = curve.lr_search(curve.IN_DOMAIN)
OVERRIDES = curve.finetune(f"{curve.IN_DOMAIN}/tokenizer")
