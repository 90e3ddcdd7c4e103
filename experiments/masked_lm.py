"""BERT pretraining: masked LM plus next-sentence prediction (configs/bert.py, docs/bert.md).

Loss = masked-LM cross-entropy (the mean over the real masked positions) + next-sentence cross-entropy
(the mean over the pairs) [+ the mixture-of-experts auxiliary losses]. Logged: mlm_loss, mlm_accuracy,
nsp_loss, nsp_accuracy, for training and for the fixed batches of the held-out documents (eval_*).
The tokenizer is bert-base-uncased's vocabulary (data.vocab), another run's (data.vocab=RUN/tokenizer: to go
on pretraining that run with init_from=RUN on other text) or trained on the training documents (data.vocab="",
data.vocab_size); either way it is saved in the run folder (tokenizer/tokenizer.json).
"""

import functools
import itertools
import pathlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from lm.data import masked_lm, run_cache
from lm.data.sources import Source
from lm.data.wordpiece import WordPieceTokenizer
from lm.errors import UserError, check_count
from lm.losses import cross_entropy, masked_accuracy, masked_cross_entropy, moe_objective
from lm.models.bert import BertForPretraining, bert_config, flops_per_sequence
from lm.train.experiment import Experiment

TOKENIZER_DIR = "tokenizer"  # workdir/tokenizer/tokenizer.json
METRICS = ("mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy")


class MaskedLM(Experiment):
    unit = "tokens"  # sequence positions, padding included

    def __init__(self, config: ml_collections.ConfigDict, tokenizer: WordPieceTokenizer,
                 train_pairs: list[masked_lm.Pair] | None = None, eval_pairs: list[masked_lm.Pair] | None = None,
                 data_cache: run_cache.DataCache | None = None):
        """train_pairs, eval_pairs: the pairs of the training and held-out documents (None to predict)."""
        super().__init__(config, data_cache)
        self.tokenizer = tokenizer
        self.train_pairs, self.eval_pairs = train_pairs or [], eval_pairs or []
        self.model = BertForPretraining(bert_config(config.model, tokenizer.vocab_size))
        self.masking = masked_lm.Masking.of(tokenizer, config.data.mask_prob, config.data.max_predictions)
        self.units_per_example = config.data.max_seq_len

    def init(self, rng: jax.Array) -> dict:
        tokens = jnp.zeros((1, self.config.data.max_seq_len), jnp.int32)
        positions = jnp.zeros((1, self.config.data.max_predictions), jnp.int32)
        return self.model.init({"params": rng}, tokens, tokens, tokens == 0, positions)

    def loss(self, params, batch, rng, train: bool):
        (mlm_logits, nsp_logits), collections = self.model.apply(
            {"params": params}, batch["tokens"], batch["segments"], batch["mask"], batch["masked_positions"],
            train=train, rngs={"dropout": rng}, mutable=["moe"],
        )  # (B, P, V), (B, 2)
        targets, weights, labels = batch["masked_targets"], batch["masked_weights"], batch["next_sentence"]
        mlm_loss = masked_cross_entropy(mlm_logits, targets, weights)
        nsp_loss = jnp.mean(cross_entropy(nsp_logits, labels))
        moe = self.model.config.transformer.moe
        aux_loss, moe_metrics = moe_objective(collections.get("moe", {}), moe.load_balance_weight,
                                              moe.router_z_weight)
        metrics = {
            "mlm_loss": mlm_loss,
            "mlm_accuracy": masked_accuracy(mlm_logits, targets, weights),
            "nsp_loss": nsp_loss,
            "nsp_accuracy": masked_accuracy(nsp_logits, labels, jnp.ones_like(labels)),
            **moe_metrics,
        }
        return mlm_loss + nsp_loss + aux_loss, metrics

    def train_data(self, batch_size: int, seed: int, shard: tuple[int, int], start_step: int):
        d = self.config.data
        return masked_lm.train_batches(self.train_pairs, self.masking, d.max_seq_len, self.tokenizer.pad_id,
                                       batch_size, seed, shard, start_step)

    def eval_data(self):
        e = self.config.eval
        return masked_lm.eval_batches(self.eval_pairs, self.masking, self.config.data.max_seq_len,
                                      self.tokenizer.pad_id, e.batch_size, e.num_batches)

    def flops_per_example(self, active_params: int) -> float:
        d = self.config.data
        return flops_per_sequence(self.model.config, active_params, d.max_seq_len, d.max_predictions)

    def save_assets(self, workdir: pathlib.Path) -> None:
        super().save_assets(workdir)
        self.tokenizer.save(workdir / TOKENIZER_DIR)

    def export_vocabulary(self) -> tuple[int, WordPieceTokenizer]:
        """The WordPiece vocabulary, written beside the weights (vocab.txt) as BERT folders hold it."""
        return self.tokenizer.vocab_size, self.tokenizer

    def final_results(self, params, evaluate, workdir: pathlib.Path) -> dict[str, float]:
        """The held-out metrics of the trained model (heldout_mlm_loss, ...)."""
        metrics = evaluate(self.eval_data())
        return {f"heldout_{name}": float(metrics[name]) for name in METRICS}


def check_config(config: ml_collections.ConfigDict) -> None:
    """UserErrors for data options that cannot work, before any file is read."""
    d, m = config.data, config.model
    if m.position == "learned" and d.max_seq_len > m.max_positions:
        raise UserError(f"data.max_seq_len={d.max_seq_len} is longer than the position table "
                        f"(model.max_positions={m.max_positions}): shorten it or raise model.max_positions")
    if d.max_seq_len < 8 or not 0 < d.mask_prob < 1 or d.max_predictions < 1:
        raise UserError(f"need data.max_seq_len >= 8 (got {d.max_seq_len}), 0 < data.mask_prob < 1 (got "
                        f"{d.mask_prob}) and data.max_predictions >= 1 (got {d.max_predictions})")
    check_count(d, "max_documents", "documents per corpus file")
    if bool(d.vocab) == bool(d.vocab_size):
        raise UserError(f"data.vocab={d.vocab!r}, data.vocab_size={d.vocab_size}: give one, a vocab.txt name or "
                        "path (e.g. 'bert-base-uncased'), or data.vocab='' and data.vocab_size=N to train one")


def build(config: ml_collections.ConfigDict, workdir: pathlib.Path | None = None) -> MaskedLM:
    """Reads the documents (split_documents), holds data.eval_documents out (drawn with seed 0), loads or trains the
    tokenizer, tokenizes every sentence and builds the training and held-out pairs; a resumed run reads the
    tokenizer saved in workdir and the pairs cached there instead (lm/data/run_cache.py)."""
    check_config(config)
    d = config.data
    documents = functools.cache(lambda: split_documents(d))  # read only if needed, once
    tokenizer = run_cache.saved_or_fitted(workdir, config, TOKENIZER_DIR, WordPieceTokenizer.load,
                                          lambda: fit_tokenizer(d, documents))
    key = run_cache.digest(d, config.seed, run_cache.saved_digest(tokenizer.save))
    cache = run_cache.DataCache(workdir)
    train_pairs, eval_pairs = cache.get("pairs", key, lambda: make_pairs(config, tokenizer, *documents()))
    return MaskedLM(config, tokenizer, train_pairs, eval_pairs, cache)


def split_documents(data: ml_collections.ConfigDict) -> tuple[list[list[str]], list[list[str]]]:
    """The documents of data.corpus, or of data.source (source_documents), paragraphs each, as (training,
    held-out): data.eval_documents of them held out, drawn with seed 0."""
    if data.source:
        documents = source_documents(data)
    else:
        documents = [doc for name in data.corpus for doc in masked_lm.read_documents(name, data.max_documents)]
    if not 1 <= data.eval_documents < len(documents):
        raise UserError(f"data.eval_documents={data.eval_documents}: hold out at least 1 and fewer than the "
                        f"{len(documents)} documents of data.{'source' if data.source else 'corpus'}")
    held_out = set(np.random.default_rng(0).choice(len(documents), data.eval_documents, replace=False).tolist())
    return ([doc for i, doc in enumerate(documents) if i not in held_out],
            [doc for i, doc in enumerate(documents) if i in held_out])


def source_documents(data: ml_collections.ConfigDict) -> list[list[str]]:
    """The documents of data.source, each a record's data.text_field split into paragraphs as a corpus file's
    lines are (masked_lm.paragraphs; blank ones left out): the first data.max_documents of them (0: all)."""
    source = Source(data.source, data.text_field, data.skip_bad_records, "data.source")
    documents = filter(None, (masked_lm.paragraphs(text) for _, text in source))
    return list(itertools.islice(documents, data.max_documents or None))


def fit_tokenizer(data: ml_collections.ConfigDict, documents: Callable[[], tuple[list, list]]) -> WordPieceTokenizer:
    """data.vocab's vocabulary, or one of data.vocab_size pieces trained on the training documents
    (documents() gives them, with the held-out ones: split_documents, called only to train)."""
    if data.vocab:
        return WordPieceTokenizer.named(data.vocab)
    return WordPieceTokenizer.train([p for doc in documents()[0] for p in doc], data.vocab_size)


def make_pairs(config: ml_collections.ConfigDict, tokenizer: WordPieceTokenizer, train_documents: list,
               eval_documents: list) -> tuple[list[masked_lm.Pair], list[masked_lm.Pair]]:
    """The (training, held-out) pairs of the documents' tokenized sentences; the training ones drawn with
    config.seed."""
    d = config.data

    def pairs(docs: list[list[str]], rng: np.random.Generator) -> list[masked_lm.Pair]:
        return masked_lm.create_pairs(masked_lm.tokenize_documents(docs, tokenizer), d.max_seq_len,
                                      d.short_seq_prob, rng, tokenizer.cls_id, tokenizer.sep_id)

    train_pairs = pairs(train_documents, np.random.default_rng([masked_lm.TRAIN_STREAM, config.seed]))
    eval_pairs = pairs(eval_documents, np.random.default_rng([masked_lm.EVAL_STREAM]))
    print(f"masked LM data: {len(train_pairs)} training pairs from {len(train_documents)} documents, "
          f"{len(eval_pairs)} held-out pairs from {len(eval_documents)}; vocabulary of {tokenizer.vocab_size}")
    return train_pairs, eval_pairs


def from_workdir(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> MaskedLM:
    """The experiment for using a trained model: the tokenizer from the run folder, no corpus needed."""
    return MaskedLM(config, run_cache.load_saved(workdir / TOKENIZER_DIR, WordPieceTokenizer.load))
