"""BERT fine-tuning: the encoder of lm/models/bert.py under "bert" and one small task head under "head",
trained end to end on one of four tasks (config.task; data in lm/data/tasks/<task>.py, scores in
lm/task_metrics.py). The tasks are one table, lm/data/tasks/__init__.py TASKS: each names its kind of head,
which HEADS below maps to the class that builds and scores it, and the row length and steps its config
starts from.

  sst2       sentence classification: PooledClassifier on Bert's pooled [CLS] output; cross-entropy;
             dev accuracy
  conll2003  named-entity tagging: TokenTagger on every position, a word's tag on its first piece;
             cross-entropy over first pieces; entity precision / recall / F1 on valid and test
  squad      span extraction: SpanHead start and end logits over the context pieces (and [CLS], the
             target where a window lacks the answer); the mean of the two cross-entropies; exact match
             and F1 on dev, the best span over each question's windows
  stsb       sentence-pair regression: RegressionHead on the pooled output; mean squared error;
             Pearson and Spearman on dev (and on test, whose gold is in the STS Benchmark originals)

The encoder starts from a pretraining run with --config.init_from=RUN (its "bert" subtree loads by name,
the pretraining heads are dropped, the task head starts fresh), or from scratch without it. Rows are
padded to data.max_seq_len, so each step compiles once. The tokenizer is the init_from run's saved one
(data.vocab=""), else data.vocab; the run saves it beside its checkpoints.
"""

import dataclasses
import importlib
import pathlib
from types import ModuleType
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments.masked_lm import TOKENIZER_DIR  # <workdir>/tokenizer/tokenizer.json, as pretraining saves it
from lm import task_metrics
from lm.data import run_cache
from lm.data.tasks import TASKS, common
from lm.data.wordpiece import TOKENIZER_FILE, WordPieceTokenizer
from lm.errors import UserError, check_count
from lm.layers.heads import PooledClassifier, RegressionHead, SpanHead, TokenTagger
from lm.losses import cross_entropy, masked_accuracy, masked_cross_entropy, masked_mean, mean_squared_error
from lm.models.bert import BERT_SIZES, Bert, BertConfig, bert_config, flops_per_sequence
from lm.runs import CONFIG_FILE, differing_fields, init_from_not_found, override_flags, saved_config, settings
from lm.train.experiment import Experiment

DEFAULT_VOCAB = "bert-base-uncased"


@dataclasses.dataclass
class Split:
    """One split of a task: its rows (lm/data/tasks/common.py) and what scoring needs besides them."""

    rows: common.Rows
    extra: Any = None  # CoNLL: (sentences, word_starts); SQuAD: (questions, Windows)


class Task:
    """What a kind of task (a kind of head: HEADS) adds to the encoder (the methods each kind below defines):
    load (a split's rows), head (the head module), outputs (the head on Bert's outputs), loss, weight (what a
    batch counts in eval means: here its real rows), predict (jittable: outputs -> what score reads) and
    score (host predictions of every real row -> scores). `source` is the task's data module
    (lm/data/tasks/<task>.py): its FILES are the task's splits, train first; `scored` are the others, dev
    first."""

    def __init__(self, source: ModuleType, data: ml_collections.ConfigDict):
        self.source, self.data = source, data
        self.splits = tuple(source.FILES)
        self.scored = tuple(split for split in self.splits if split != "train")

    def weight(self, batch):
        return jnp.sum(batch["valid"].astype(jnp.float32))


class SentenceClassification(Task):
    """[CLS] sentence [SEP] -> one of the source's LABELS, from the pooled output (SST-2)."""

    def load(self, tokenizer, split: str, limit: int, seed: int | None) -> Split:
        return Split(self.source.encode(tokenizer, split, self.data.max_seq_len, limit, seed))

    def head(self, name: str) -> nn.Module:
        return PooledClassifier(len(self.source.LABELS), name=name)

    def outputs(self, head, hidden, pooled, batch):
        return head(pooled[:, None])  # (B, K): the pooled vector as the one position the head's "cls" pool reads

    def loss(self, logits, batch):
        valid = batch["valid"]
        loss = masked_cross_entropy(logits, batch["label"], valid)
        return loss, {"cross_entropy": loss, "accuracy": masked_accuracy(logits, batch["label"], valid)}

    def predict(self, logits):
        return jnp.argmax(logits, axis=-1)  # (B,)

    def score(self, predicted: np.ndarray, split: Split) -> dict[str, float]:
        return {"accuracy": task_metrics.accuracy(predicted, split.rows["label"])}


class Regression(Task):
    """[CLS] A [SEP] B [SEP] -> a score, from the pooled output (STS-B: similarity)."""

    def load(self, tokenizer, split: str, limit: int, seed: int | None) -> Split:
        return Split(self.source.encode(tokenizer, split, self.data.max_seq_len, limit, seed))

    def head(self, name: str) -> nn.Module:
        return RegressionHead(name=name)

    def outputs(self, head, hidden, pooled, batch):
        return head(pooled)  # (B,)

    def loss(self, predicted, batch):
        loss = mean_squared_error(predicted, batch["score"], batch["valid"])
        return loss, {"mean_squared_error": loss}

    def predict(self, predicted):
        return predicted

    def score(self, predicted: np.ndarray, split: Split) -> dict[str, float]:
        return task_metrics.correlations(predicted, split.rows["score"])


class Tagging(Task):
    """A tag per word (one of the source's TAGS), predicted at its first piece (CoNLL-2003: entities)."""

    def load(self, tokenizer, split: str, limit: int, seed: int | None) -> Split:
        sentences = self.source.load(split, limit, seed)
        rows, word_starts = self.source.encode(tokenizer, sentences, self.data.max_seq_len)
        return Split(rows, (sentences, word_starts))

    def head(self, name: str) -> nn.Module:
        return TokenTagger(len(self.source.TAGS), name=name)

    def outputs(self, head, hidden, pooled, batch):
        return head(hidden)  # (B, T, K)

    def tagged(self, batch):
        return batch["tag_mask"] * batch["valid"][:, None]  # (B, T): the first pieces of real rows

    def loss(self, logits, batch):
        tagged = self.tagged(batch)
        loss = masked_cross_entropy(logits, batch["tags"], tagged)
        return loss, {"cross_entropy": loss, "accuracy": masked_accuracy(logits, batch["tags"], tagged)}

    def weight(self, batch):
        return jnp.sum(self.tagged(batch).astype(jnp.float32))

    def predict(self, logits):
        return jnp.argmax(logits, axis=-1)  # (B, T)

    def score(self, predicted: np.ndarray, split: Split) -> dict[str, float]:
        sentences, word_starts = split.extra
        gold = [s.tags for s in sentences]
        return task_metrics.entity_scores(gold, self.source.word_tags(predicted, word_starts, sentences))


class SpanExtraction(Task):
    """The answer's first and last pieces in a question's context windows (SQuAD v1.1)."""

    def load(self, tokenizer, split: str, limit: int, seed: int | None) -> Split:
        questions = self.source.load(split, limit, seed)
        d = self.data
        windows = self.source.encode(tokenizer, questions, d.max_seq_len, d.doc_stride, d.max_query_length)
        return Split(windows.rows, (questions, windows))

    def head(self, name: str) -> nn.Module:
        return SpanHead(name=name)

    def outputs(self, head, hidden, pooled, batch):
        return head(hidden, batch["span_mask"].astype(bool))  # (start, end) logits, (B, T) each

    def loss(self, logits, batch):
        start_logits, end_logits = logits
        both = (cross_entropy(start_logits, batch["start"]) + cross_entropy(end_logits, batch["end"])) / 2
        loss = masked_mean(both, batch["valid"])
        return loss, {"cross_entropy": loss, "start_accuracy": masked_accuracy(start_logits, batch["start"],
                                                                               batch["valid"])}

    def predict(self, logits):
        return jnp.stack(logits, axis=-1)  # (B, T, 2)

    def score(self, predicted: np.ndarray, split: Split) -> dict[str, float]:
        questions, windows = split.extra
        answers = self.source.predicted_answers(predicted[..., 0], predicted[..., 1], windows, questions,
                                                self.data.max_answer_length, self.data.n_best)
        return task_metrics.squad_scores(answers, {q.id: q.answers for q in questions})


HEADS = {"classification": SentenceClassification, "tagging": Tagging, "span": SpanExtraction,
         "regression": Regression}  # the kinds of lm/data/tasks/__init__.py TASKS


def make_task(config: ml_collections.ConfigDict) -> Task:
    """config.task's kind of head (lm/data/tasks/__init__.py TASKS), reading lm/data/tasks/<task>.py."""
    if config.task not in TASKS:
        raise UserError(f"task={config.task!r}: use one of {', '.join(TASKS)}")
    source = importlib.import_module(f"lm.data.tasks.{config.task}")
    return HEADS[TASKS[config.task].head](source, config.data)


class BertWithHead(nn.Module):
    """A batch (tokens, segments, mask (B, T), and what the task reads) -> the task head's outputs: Bert
    under "bert" (the pretraining run's names), the head under "head", dropout between them."""

    bert: BertConfig
    task: Task
    dropout: float

    @nn.compact
    def __call__(self, batch: dict, train: bool = False):
        hidden, pooled = Bert(self.bert, name="bert")(batch["tokens"], batch["segments"], batch["mask"], train)
        dropout = nn.Dropout(self.dropout, deterministic=not train)
        return self.task.outputs(self.task.head("head"), dropout(hidden), dropout(pooled), batch)


def saved_tokenizer(init_from: str) -> WordPieceTokenizer | None:
    """The tokenizer a pretraining run saved (TOKENIZER_DIR in init_from, or in one of the two folders above
    it: init_from may name the run's checkpoint folder or one step's folder); None if there is none."""
    place = pathlib.Path(init_from).expanduser()
    for folder in (place, *list(place.parents)[:2]):
        if (folder / TOKENIZER_DIR / TOKENIZER_FILE).is_file():
            return run_cache.load_saved(folder / TOKENIZER_DIR, WordPieceTokenizer.load)
    return None


SIZE_FIELDS = ("num_layers", "embed_dim", "num_heads")  # an encoder size of BERT_SIZES, in its order


def check_init_from(config: ml_collections.ConfigDict) -> None:
    """A local init_from must exist; when it is an lm run, its encoder must be this config's size (SIZE_FIELDS
    in its config.json), else a UserError naming every model field that differs, both values, and the variant
    of configs/bert_finetune.py of that size (or the flags, for a size no variant has)."""
    init_from = config.init_from
    if not init_from or "://" in init_from or init_from.startswith("hf:"):  # (hf:DIR checks its own fields)
        return
    if not pathlib.Path(init_from).expanduser().exists():
        raise init_from_not_found(init_from)
    saved = saved_config(init_from)
    size = tuple(((saved or {}).get("model") or {}).get(key) for key in SIZE_FIELDS)
    if saved is None or size == tuple(config.model[key] for key in SIZE_FIELDS):
        return
    fields = differing_fields(saved, config, ("model",))
    named = next((name for name, dimensions in BERT_SIZES.items() if dimensions == size), None)
    fix = (f"use --config=configs/bert_finetune.py:{config.task}_{named}, the variant of that size" if named
           else f"run with {override_flags(fields)}")
    raise UserError(f"init_from={init_from} holds an encoder of another size: {settings(fields, saved=True)} (its "
                    f"{CONFIG_FILE}), this config has {settings(fields, saved=False)}: {fix}")


def find_tokenizer(config: ml_collections.ConfigDict) -> WordPieceTokenizer:
    """data.vocab if set (a vocab.txt name or path, or a folder holding a tokenizer.json), which must be the
    init_from run's vocabulary when it saved one; else the init_from run's saved tokenizer; else, from
    scratch, bert-base-uncased."""
    vocab, init_from = config.data.vocab, config.init_from
    pretrained = saved_tokenizer(init_from) if init_from else None
    if not vocab:
        if pretrained is None and init_from:
            raise UserError(f"init_from={init_from} has no saved tokenizer ({TOKENIZER_DIR}/{TOKENIZER_FILE} in it "
                            "or above it): name the pretraining vocabulary with --config.data.vocab")
        return pretrained or WordPieceTokenizer.from_vocab(DEFAULT_VOCAB)
    tokenizer = WordPieceTokenizer.named(vocab)
    if pretrained is not None and tokenizer.tokenizer.get_vocab() != pretrained.tokenizer.get_vocab():
        raise UserError(f"data.vocab={vocab!r} ({tokenizer.vocab_size} pieces) is not the vocabulary the init_from "
                        f"run was pretrained with ({pretrained.source}, {pretrained.vocab_size} pieces): leave "
                        "data.vocab empty to fine-tune with the pretraining vocabulary")
    return tokenizer


class FineTune(Experiment):

    def __init__(self, config: ml_collections.ConfigDict, tokenizer: WordPieceTokenizer,
                 splits: dict[str, Split] | None = None, data_cache: run_cache.DataCache | None = None):
        super().__init__(config, data_cache)
        self.tokenizer = tokenizer
        self.task = make_task(config)
        self.splits = splits or {}
        if config.data.max_seq_len > config.model.max_positions:
            raise UserError(f"data.max_seq_len={config.data.max_seq_len} is longer than the model's "
                            f"model.max_positions={config.model.max_positions}: lower it")
        self.model = BertWithHead(bert_config(config.model, tokenizer.vocab_size), self.task,
                                  config.model.head_dropout)

    def init(self, rng: jax.Array) -> dict:
        length = self.config.data.max_seq_len
        batch = {name: jnp.zeros((1, length), jnp.int32) for name in ("tokens", "segments", "mask", "span_mask")}
        return self.model.init({"params": rng}, batch)

    def loss(self, params, batch, rng, train: bool):
        outputs = self.model.apply({"params": params}, batch, train=train, rngs={"dropout": rng})
        return self.task.loss(outputs, batch)

    def train_data(self, batch_size: int, seed: int, shard: tuple[int, int], start_step: int):
        return common.train_batches(self.splits["train"].rows, batch_size, seed, shard, start_step)

    def eval_data(self, split: str | None = None):
        return common.eval_batches(self.splits[split or self.task.scored[0]].rows, self.config.eval.batch_size)

    def eval_weight(self, batch) -> jax.Array:
        return self.task.weight(batch)

    def eval_outputs(self, params, batch) -> dict[str, jax.Array]:
        """What the task's scores read of a batch: its predictions (task.predict) and which rows are real,
        valid (B,)."""
        outputs = self.model.apply({"params": params}, batch)
        return {"predicted": self.task.predict(outputs), "valid": batch["valid"]}

    def split_scores(self, outputs: dict[str, np.ndarray], split: str) -> dict[str, float]:
        """The task's scores on a split from the eval outputs of its batches (eval_data(split), gathered in
        order): the predictions of its real rows."""
        return self.task.score(outputs["predicted"][outputs["valid"] == 1], self.splits[split])

    def eval_scores(self, outputs: dict[str, np.ndarray]) -> dict[str, float]:
        """The task's scores on its dev split (eval_data()), from the trainer's eval pass: dev_<score>."""
        return {f"dev_{k}": v for k, v in self.split_scores(outputs, self.task.scored[0]).items()}

    def flops_per_example(self, active_params: int) -> float:
        """The encoder's training FLOPs for one padded row (lm/models/bert.py, no masked-LM predictions)."""
        return flops_per_sequence(self.model.bert, active_params, self.config.data.max_seq_len, 0)

    def save_assets(self, workdir: pathlib.Path) -> None:
        super().save_assets(workdir)
        self.tokenizer.save(workdir / TOKENIZER_DIR)

    def final_results(self, params, evaluate, workdir: pathlib.Path) -> dict[str, float]:
        """The task's scores on each scored split (dev; CoNLL-2003 valid and test; STS-B dev and test),
        named <split>_<score>, and the loss there (<split>_loss), from one pass of the trainer's eval step
        over each."""
        results = {}
        for split in self.task.scored:
            evaluation = evaluate(self.eval_data(split))
            scores = {**self.split_scores(evaluation.outputs, split), "loss": evaluation["loss"]}
            results.update({f"{split}_{k}": v for k, v in scores.items()})
        return results


def build(config: ml_collections.ConfigDict, workdir: pathlib.Path | None = None) -> FineTune:
    """The checked init_from (check_init_from), the tokenizer (find_tokenizer), then the task's splits encoded
    with it (load_splits), or for a resumed run the splits cached in workdir (lm/data/run_cache.py)."""
    for key in ("max_train_examples", "max_eval_examples"):
        check_count(config.data, key, "examples")
    check_init_from(config)
    tokenizer = find_tokenizer(config)
    key = run_cache.digest(config.task, config.data, config.seed, run_cache.saved_digest(tokenizer.save))
    cache = run_cache.DataCache(workdir)
    return FineTune(config, tokenizer, cache.get("splits", key, lambda: load_splits(config, tokenizer)), cache)


def load_splits(config: ml_collections.ConfigDict, tokenizer: WordPieceTokenizer) -> dict[str, Split]:
    """Every split of the task, encoded, its rows marked valid: data.max_train_examples training examples drawn
    at random with config.seed (so every arm of a seed trains on the same ones; lm/data/tasks/common.py choose),
    the first data.max_eval_examples of each scored split (0: all)."""
    task, splits = make_task(config), {}
    for split in task.splits:
        train = split == "train"
        limit = config.data.max_train_examples if train else config.data.max_eval_examples
        loaded = task.load(tokenizer, split, limit, config.seed if train else None)
        loaded.rows["valid"] = np.ones(len(loaded.rows["tokens"]), np.int32)
        splits[split] = loaded
    return splits


def from_workdir(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> FineTune:
    """The experiment for predicting with a trained model: its tokenizer from the run folder, no data."""
    return FineTune(config, run_cache.load_saved(workdir / TOKENIZER_DIR, WordPieceTokenizer.load))
