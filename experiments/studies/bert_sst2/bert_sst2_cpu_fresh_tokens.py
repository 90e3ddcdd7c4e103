r"""An ablation of the SST-2 CPU study at its best learning rate (bert_sst2_cpu_lr_best.py, 3e-4):
the finished encoder (step 2000) with a fresh token table. With the table tied to the masked-LM output, pretraining
on the small corpus pushes the rows of the pieces it rarely or never saw in one common direction (a mean cosine of
0.65-0.74 between the rows of SST-2's pieces that the corpus holds fewer than 10 times, 0.06-0.10 between those it
holds 100 times or more, 0.00 at initialisation: python -m experiments.analysis.token_table); init_from_rename
leaves the table out of what is loaded, so it starts random, as the scratch arm's does. 3 seeds; the figures are in
docs/bert.md#pretrained-vs-scratch.

  lm sweep --sweep_file=experiments/studies/bert_sst2/bert_sst2_cpu_fresh_tokens.py \
      --workdir=runs/bert_sst2_cpu_fresh_tokens
  lm compare runs/bert_sst2_cpu_lr runs/bert_sst2_cpu_fresh_tokens \
      --group_by=init_from,init_from_rename,optimizer.learning_rate
"""

from experiments.studies import bert_budget as budget
from experiments.studies.bert_sst2 import bert_sst2_cpu_lr_best

CONFIG = bert_sst2_cpu_lr_best.CONFIG
AXES = {"seed": list(budget.SEEDS)}
OVERRIDES = {**bert_sst2_cpu_lr_best.OVERRIDES, "init_from": budget.FINISHED,
             "init_from_rename": "bert/embeddings/token_embed:", "optimizer.learning_rate": 3e-4}
