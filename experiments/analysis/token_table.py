"""How a pretrained BERT run's token table depends on how often its pretraining corpus holds each piece, and
how much of SST-2's training text those pieces carry (docs/bert.md#pretrained-vs-scratch).

  python -m experiments.analysis.token_table --run=runs/bert_mini --checkpoint=2000

The masked-LM output layer is tied to the token table, so every prediction's softmax moves every row that is
not the target against the prediction's hidden state (down its logit), in proportion to its probability. Rows of
pieces the corpus seldom or never holds get little else, drift the same way and end up alike; a fine-tuning task
whose words the corpus lacks then starts from rows it can hardly tell apart.
Prints, per band of corpus counts: the pieces, the share of SST-2's pieces, and over SST-2's distinct
pieces in the band (up to 500, drawn with seed 0): the mean cosine between two rows and the mean row norm, for
the checkpoint's table and for the run's initial table (the same seed's init, never trained).
"""

import json
import pathlib

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from absl import app, flags

from lm.data import masked_lm
from lm.data.tasks import sst2
from lm.data.wordpiece import WordPieceTokenizer
from lm.errors import UserError, run_user_errors
from lm.train.init_from import CheckpointSource

_RUN = flags.DEFINE_string("run", "runs/bert_mini", "A bert.py run folder (its config, tokenizer, checkpoints).")
_CHECKPOINT = flags.DEFINE_integer("checkpoint", 0, "The checkpoint step (0: the latest).")

BANDS = ((0, 0), (1, 9), (10, 99), (100, 999), (1000, None))  # corpus counts, inclusive


def piece_counts(tokenizer: WordPieceTokenizer, texts: list[str]) -> np.ndarray:
    """(V,) how many times each piece occurs in the texts' encodings (specials left out)."""
    counts = np.zeros(tokenizer.vocab_size, np.int64)
    for encoding in tokenizer.tokenizer.encode_batch(texts, add_special_tokens=False):
        np.add.at(counts, encoding.ids, 1)
    return counts


def mean_pairwise_cosine(rows: np.ndarray) -> float:
    """rows (N, D) -> the mean cosine similarity over the N (N - 1) ordered pairs of distinct rows (NaN for
    fewer than 2 rows)."""
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    n = len(unit)
    if n < 2:
        return float("nan")
    total = unit.sum(0)
    return float((total @ total - n) / (n * (n - 1)))  # sum over all pairs minus the n self-pairs


def band_rows(corpus_counts: np.ndarray, task_counts: np.ndarray, table: np.ndarray, low: int, high: int | None,
              rng: np.random.Generator, sample: int = 500) -> dict[str, float]:
    """The band [low, high] of corpus counts: its pieces, their share of the task's pieces, and the mean
    pairwise cosine and row norm over (a sample of) the task's distinct pieces in it."""
    in_band = (corpus_counts >= low) & (corpus_counts <= (np.inf if high is None else high))
    used = np.flatnonzero(in_band & (task_counts > 0))
    chosen = rng.choice(used, min(sample, len(used)), replace=False)
    return {"pieces": int(in_band.sum()), "task_share": float(task_counts[in_band].sum() / task_counts.sum()),
            "task_pieces": len(used), "cosine": mean_pairwise_cosine(table[chosen]),
            "norm": float(np.linalg.norm(table[chosen], axis=1).mean())}


def tables(run: pathlib.Path, config: ml_collections.ConfigDict, checkpoint: int) -> dict[str, np.ndarray]:
    """{'step N': the checkpoint's token table, 'init': the run's step-0 table} as float64 arrays."""
    from experiments.masked_lm import from_workdir

    location = run / "checkpoints" / str(checkpoint) if checkpoint else run
    source = CheckpointSource(str(location))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    params = source.load_params(jax.tree.map(lambda _: device, source.abstract_params()))
    initial = nn.unbox(from_workdir(config, run).init(jax.random.key(config.seed))["params"])
    return {f"step {source.step}": token_table(params), "init": token_table(initial)}


def token_table(params: dict) -> np.ndarray:
    """The (V, D) token table of BERT pretraining params, float64."""
    return np.asarray(params["bert"]["embeddings"]["token_embed"]["embedding"], np.float64)


def main(argv):
    del argv
    run_user_errors(report)


def report() -> None:
    run = pathlib.Path(_RUN.value)
    config_file = run / "config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    if config.get("experiment") != "masked_lm":
        raise UserError(f"--run={run} is not a bert.py run folder (its config.json with experiment masked_lm); "
                        "pretrain one first: lm train --config=configs/bert.py:mini --workdir=runs/bert_mini")
    config = ml_collections.ConfigDict(config)
    tokenizer = WordPieceTokenizer.load(run / "tokenizer")
    corpus = [paragraph for name in config.data.corpus for document in masked_lm.read_documents(name)
              for paragraph in document]
    corpus_counts = piece_counts(tokenizer, corpus)
    sentences, _ = sst2.load("train")
    task_counts = piece_counts(tokenizer, sentences)
    print(f"corpus {', '.join(config.data.corpus)}: {corpus_counts.sum():,} pieces; SST-2 train: "
          f"{task_counts.sum():,} pieces; vocabulary {tokenizer.vocab_size:,}")
    compared = tables(run, config, _CHECKPOINT.value)
    print("| corpus count | pieces | share of SST-2's pieces | SST-2's distinct pieces | "
          + " | ".join(f"{name}: mean cosine, row norm" for name in compared) + " |")
    for low, high in BANDS:
        # the same seed for every table: each is measured on the same sample of pieces
        bands = [band_rows(corpus_counts, task_counts, table, low, high, np.random.default_rng(0))
                 for table in compared.values()]
        label = f"{low}" if high == low else f"{low}-{high}" if high else f"{low}+"
        print(f"| {label} | {bands[0]['pieces']:,} | {bands[0]['task_share']:.1%} | {bands[0]['task_pieces']:,} | "
              + " | ".join(f"{band['cosine']:.3f}, {band['norm']:.3f}" for band in bands) + " |")


if __name__ == "__main__":
    app.run(main)
