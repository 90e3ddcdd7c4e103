"""What the BERT learning-curve studies share (docs/bert.md#learning-curves-and-in-domain-pretraining): the tiny
encoder (configs/bert.py:tiny, 2 layers x 64) pretrained several ways at one budget, the fine-tuning budget, the label
counts and the seeds. Not a sweep file: the sweep files of experiments/studies/bert_*_curve/ import it.

The pretraining runs, one command each (PRETRAIN: 4000 steps of 32 pairs of 64 pieces, 8.2M positions; the
vocabulary trained on the run's own text, 8000 pieces, unless said):

  python -m experiments.task_text --task=sst2 --jsonl=runs/text/sst2.jsonl        # SST-2's 67,349 sentences
  lm train --config=configs/bert.py:tiny --workdir=runs/bert_tiny_sst2 $PRETRAIN \\
      --config.data.source=files:runs/text/sst2.jsonl                           # IN_DOMAIN
  lm train --config=configs/bert.py:tiny --workdir=runs/bert_tiny_corpus $PRETRAIN \\
      --config.data.corpus='("gutenberg_books","us_presidential_speeches")'     # GENERAL: the shared corpus
  lm train --config=configs/bert.py:tiny --workdir=runs/bert_tiny_sst2_bert_vocab $PRETRAIN \\
      --config.data.source=files:runs/text/sst2.jsonl \\
      --config.data.vocab=bert-base-uncased --config.data.vocab_size=0          # BERT_VOCAB
  lm train --config=configs/bert.py:tiny --workdir=runs/bert_tiny_corpus_bert_vocab $PRETRAIN \\
      --config.data.corpus='("gutenberg_books","us_presidential_speeches")' \\
      --config.data.vocab=bert-base-uncased --config.data.vocab_size=0          # GENERAL_BERT_VOCAB
  lm train --config=configs/bert.py:tiny --workdir=runs/bert_tiny_corpus_then_sst2 $PRETRAIN \\
      --config.data.source=files:runs/text/sst2.jsonl --config.train.num_steps=2000 \\
      --config.init_from=runs/bert_tiny_corpus/checkpoints/2000 \\
      --config.data.vocab=runs/bert_tiny_corpus/tokenizer --config.data.vocab_size=0   # AFTER: 2000 + 2000 steps

with PRETRAIN = PRETRAIN_FLAGS below; STS-B's and CoNLL-2003's in-domain runs (STSB_IN_DOMAIN, CONLL_IN_DOMAIN) as
IN_DOMAIN's, on the text of `python -m experiments.task_text --task=stsb --jsonl=runs/text/stsb.jsonl` (and
--task=conll2003 --jsonl=runs/text/conll2003.jsonl). The fine-tuning arms: each encoder, and from scratch with the
in-domain run's vocabulary (so that the pretrained and scratch arms differ by the weights alone), on LABELS (STS-B:
STSB_LABELS, CoNLL-2003: CONLL_LABELS) training examples drawn with the seed (data.max_train_examples), finetune()'s
budget.
"""

PRETRAIN_FLAGS = ("--config.train.num_steps=4000 --config.train.batch_size=32 --config.train.checkpoint_every=2000 "
                  "--config.eval.every=1000 --config.data.max_documents=0 --config.data.eval_documents=6 "
                  "--config.data.vocab_size=8000")
IN_DOMAIN = "runs/bert_tiny_sst2"  # masked LM on SST-2's training sentences, its own vocabulary
GENERAL = "runs/bert_tiny_corpus"  # on the shared corpus (books and speeches), its own vocabulary
BERT_VOCAB = "runs/bert_tiny_sst2_bert_vocab"  # on SST-2's sentences with bert-base-uncased's vocabulary
AFTER = "runs/bert_tiny_corpus_then_sst2"  # GENERAL's first 2000 steps, then 2000 on SST-2's sentences
GENERAL_BERT_VOCAB = "runs/bert_tiny_corpus_bert_vocab"  # as GENERAL, with bert-base-uncased's vocabulary
SCRATCH = ""
STSB_IN_DOMAIN = "runs/bert_tiny_stsb"  # as IN_DOMAIN, on STS-B's training sentences (both of each pair)
CONLL_IN_DOMAIN = "runs/bert_tiny_conll2003"  # as IN_DOMAIN, on CoNLL-2003's training sentences
LABELS = (250, 1000, 4000, 67349)  # 67,349: all of SST-2's training set
STSB_LABELS = (250, 1000, 4000, 5749)  # 5,749: all of STS-B's training pairs
CONLL_LABELS = (250, 1000, 4000, 14041)  # 14,041: all of CoNLL-2003's training sentences
SEEDS = (0, 1, 2)
LEARNING_RATES = (3e-4, 1e-3, 3e-3)  # the search (seed 0, 1000 labels)


def lr_search(in_domain: str, learning_rates: tuple[float, ...] = LEARNING_RATES) -> dict[str, list]:
    """AXES of a curve's learning-rate search: the in-domain run and scratch at each of learning_rates, 1000 labels,
    seed 0."""
    return {
        "init_from": [in_domain, SCRATCH],
        "optimizer.learning_rate": list(learning_rates),
        "data.max_train_examples": [1000],
        "seed": [0],
    }


def curve_axes(init_froms: list[str], labels: tuple[int, ...] = LABELS) -> dict[str, list]:
    """AXES of a learning curve: each of init_froms (SCRATCH: from random initialisation) on each count of labels,
    with each of SEEDS."""
    return {"init_from": init_froms, "data.max_train_examples": list(labels), "seed": list(SEEDS)}


def finetune(vocab: str = "") -> dict:
    """OVERRIDES of configs/bert_finetune.py:sst2_tiny for a curve (the learning rate is each sweep file's): 300 steps
    of 32 rows of 64 pieces (warmup over a tenth, then linear decay), the whole dev set scored every 100 steps and
    after the last; data.vocab: every arm's tokenizer (a run's tokenizer folder), '' for each init_from run's own."""
    return {
        "data.vocab": vocab,
        "data.max_eval_examples": 0,
        "optimizer.warmup_fraction": 0.1,
        "train.batch_size": 32,
        "train.num_steps": 300,
        "train.checkpoint_every": 300,
        "train.log_every": 50,
        "eval.every": 100,
    }
