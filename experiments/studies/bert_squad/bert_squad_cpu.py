"""The CPU budget of bert_squad.py: BERT-Mini fine-tuned on SQuAD v1.1 (trained on the 44-article
subset of the training set, 11,877 questions; exact match and F1 on the whole official dev set, 10,570 questions)
from the finished pretraining (step 2000) and from random initialisation, 3 seeds each, 400 steps of 32 windows of
128 pieces (questions cut to 32 pieces, a window every 64 context pieces: 24,375 training windows, so about half an
epoch), so the six runs fit a 2-core machine; docs/bert.md#pretrained-vs-scratch has the figures. The dev set is
scored once, after the last step (eval.every=0: its 24,161 windows cost ~3.5 min of a CPU core a pass).

  lm train --config=configs/bert.py:mini --workdir=runs/bert_mini   # the encoder first
  lm sweep --sweep_file=experiments/studies/bert_squad/bert_squad_cpu.py --workdir=runs/bert_squad_cpu
  lm compare runs/bert_squad_cpu --group_by=init_from
"""

from experiments.studies import bert_budget as budget

CONFIG = budget.config("squad")
AXES = budget.pretrained_vs_scratch(budget.FINISHED)
OVERRIDES = budget.cpu_budget(400, max_seq_len=128, max_query_length=32, doc_stride=64, evals=0)
