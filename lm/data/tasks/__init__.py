"""The BERT fine-tuning tasks' data (one module each: sst2, stsb, conll2003, squad), read from $LM_DATA_DIR
and encoded into fixed-length rows of WordPiece ids (common.py: packing, and deterministic batches).

TASKS is the one table of the tasks: for each, the kind of head the experiment puts on the encoder
(experiments/finetune.py HEADS maps the kind to its class, which reads lm/data/tasks/<task>.py) and the
row length and steps its config starts from (configs/base.py finetune).
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Task:
    """A fine-tuning task: the kind of head on the encoder (experiments/finetune.py HEADS: classification
    on the pooled output, tagging of each word, span extraction, regression on the pooled output) and the
    task's defaults in configs/base.py finetune()."""

    head: str
    max_seq_len: int  # pieces per row
    num_steps: int  # the learning rate warms up over a tenth of them, then decays over all


TASKS = {
    "sst2": Task("classification", max_seq_len=64, num_steps=2000),
    "conll2003": Task("tagging", max_seq_len=128, num_steps=1500),
    "squad": Task("span", max_seq_len=384, num_steps=1200),
    "stsb": Task("regression", max_seq_len=128, num_steps=540),
}
