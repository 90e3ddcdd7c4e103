"""The CPU budget of experiments/sweeps/bert_stsb.py: BERT-Mini fine-tuned on STS-B (dev Pearson and Spearman) from the
pretrained encoder halfway (step 1000) and finished (step 2000) and from random initialisation, 3 seeds each, 360
steps of 32 rows of 64 pieces, so the nine runs fit a 2-core machine; docs/bert.md#pretrained-vs-scratch has the
figures.

  python -m lm.main --config=configs/bert.py:mini --workdir=runs/bert_mini   # the encoder first (it keeps
  # its checkpoints of steps 500-2000: the pretrained arms start from step 1000, halfway, and 2000, finished)
  python -m lm.sweep --sweep_file=experiments/sweeps/bert_stsb_cpu.py --workdir=runs/bert_stsb_cpu
  python -m lm.compare runs/bert_stsb_cpu --group_by=init_from
"""

CONFIG = "configs/bert_finetune.py:stsb"
AXES = {
    "init_from": ["runs/bert_mini/checkpoints/1000", "runs/bert_mini/checkpoints/2000", ""],
    "seed": [0, 1, 2],
}
OVERRIDES = {
    "data.max_seq_len": 64,
    "train.num_steps": 360,
    "optimizer.decay_steps": 360,
    "optimizer.warmup_steps": 36,
    "eval.every": 180,
    "train.checkpoint_every": 360,
}
