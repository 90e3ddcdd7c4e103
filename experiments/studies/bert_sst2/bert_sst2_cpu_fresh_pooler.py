r"""An ablation of the SST-2 CPU study (bert_sst2_cpu.py, the same config and budget): the encoder
from the finished pretraining (step 2000) without its pooler, which next-sentence prediction trained; the pooler
starts fresh, as the classifier does (init_from_rename leaves it out of what is loaded). 3 seeds; the figures are in
docs/bert.md#pretrained-vs-scratch.

  lm sweep --sweep_file=experiments/studies/bert_sst2/bert_sst2_cpu_fresh_pooler.py \
      --workdir=runs/bert_sst2_cpu_fresh_pooler
  lm compare runs/bert_sst2_cpu runs/bert_sst2_cpu_fresh_pooler --group_by=init_from,init_from_rename
"""

from experiments.studies import bert_budget as budget
from experiments.studies.bert_sst2 import bert_sst2_cpu

CONFIG = bert_sst2_cpu.CONFIG
AXES = {"seed": list(budget.SEEDS)}
OVERRIDES = {**bert_sst2_cpu.OVERRIDES, "init_from": budget.FINISHED, "init_from_rename": "bert/pooler:"}
