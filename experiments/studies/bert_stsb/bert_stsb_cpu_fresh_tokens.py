r"""The fresh-token-table ablation of experiments/studies/bert_sst2/bert_sst2_cpu_fresh_tokens.py on STS-B, at the
STS-B CPU study's budget and learning rate (bert_stsb_cpu.py, 1e-4): the finished encoder (step 2000) with its token
table left out of what is loaded. 3 seeds; the figures are in docs/bert.md#pretrained-vs-scratch.

  lm sweep --sweep_file=experiments/studies/bert_stsb/bert_stsb_cpu_fresh_tokens.py \
      --workdir=runs/bert_stsb_cpu_fresh_tokens --parallel=2
  lm compare runs/bert_stsb_cpu runs/bert_stsb_cpu_fresh_tokens --group_by=init_from,init_from_rename
"""

from experiments.studies import bert_budget as budget
from experiments.studies.bert_stsb import bert_stsb_cpu

CONFIG = bert_stsb_cpu.CONFIG
AXES = {"seed": list(budget.SEEDS)}
OVERRIDES = {**bert_stsb_cpu.OVERRIDES, "init_from": budget.FINISHED,
             "init_from_rename": "bert/embeddings/token_embed:"}
