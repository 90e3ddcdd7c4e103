"""The SST-2 learning curve on the CPU (experiments/studies/bert_curve.py), pretrained arm: the tiny encoder pretrained
on SST-2's own sentences with its own vocabulary (IN_DOMAIN) at its best learning rate of bert_sst2_curve_cpu_lr.py
(1e-3), on 250, 1000, 4000 and all 67,349 labelled sentences (drawn with the seed: every arm of a seed sees the same
ones), 3 seeds. bert_sst2_curve_cpu_scratch.py runs the scratch arm at its own best learning rate into the same folder;
docs/bert.md#learning-curves-and-in-domain-pretraining.

  lm sweep --sweep_file=experiments/studies/bert_sst2_curve/bert_sst2_curve_cpu.py \\
      --workdir=runs/bert_sst2_curve --parallel=2
  lm compare runs/bert_sst2_curve --group_by=init_from --against=data.max_train_examples --plot=dev_accuracy
"""

from experiments.studies import bert_curve as curve

CONFIG = "configs/bert_finetune.py:sst2_tiny"
AXES = curve.curve_axes([curve.IN_DOMAIN])
OVERRIDES = {**curve.finetune(f"{curve.IN_DOMAIN}/tokenizer"), "optimizer.learning_rate": 1e-3}
