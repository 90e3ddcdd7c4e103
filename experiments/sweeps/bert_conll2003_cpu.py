"""The CPU budget of experiments/sweeps/bert_conll2003.py: BERT-Mini fine-tuned on CoNLL-2003 NER (valid and test entity
F1) from the pretrained encoder halfway (step 1000) and finished (step 2000) and from random initialisation, 3 seeds
each, 400 steps of 32 rows of 64 pieces, so the nine runs fit a 2-core machine; docs/bert.md#pretrained-vs-scratch has
the figures.

  python -m lm.main --config=configs/bert.py:mini --workdir=runs/bert_mini   # the encoder first (it keeps
  # its checkpoints of steps 500-2000: the pretrained arms start from step 1000, halfway, and 2000, finished)
  python -m lm.sweep --sweep_file=experiments/sweeps/bert_conll2003_cpu.py --workdir=runs/bert_conll2003_cpu
  python -m lm.compare runs/bert_conll2003_cpu --group_by=init_from
"""

CONFIG = "configs/bert_finetune.py:conll2003"
AXES = {
    "init_from": ["runs/bert_mini/checkpoints/1000", "runs/bert_mini/checkpoints/2000", ""],
    "seed": [0, 1, 2],
}
OVERRIDES = {
    "data.max_seq_len": 64,
    "train.num_steps": 400,
    "optimizer.decay_steps": 400,
    "optimizer.warmup_steps": 40,
    "eval.every": 200,
    "train.checkpoint_every": 400,
}
