"""Benchmark: what the language model's data pipelines deliver, against what its train step consumes.

  python benchmarks/data_pipeline.py [--seconds=3] [--steps=5]

One process on this machine's CPU, each pipeline iterated alone (no train step beside it) for --seconds
at each batch shape, GPT-2 BPE ids:
  token file  tokens.train_windows over a memory-mapped uint16 file of 64M ids (random windows)
  packed      packing.train_batches over rows of documents packed by document (lognormal lengths, median
              400 tokens, 16M tokens)
  mixture     mixture.MixtureBatches of those rows and a second packed set, weights 0.7 / 0.3
  tokenizer   online tokenisation: GPT-2's tokenizer on one core (tokens/s per core), on the shared
              corpus's text ($LM_DATA_DIR/corpus/us_presidential_speeches.txt.gz)
Batch shapes: gpt2.py:test (8 x 64), gpt_shakespeare.py:baby's shape (64 x 256) and GPT-2 124M's global
batch (512 x 1024; one host feeding one GPU). Consumption: the train step alone of gpt2.py:test and of
baby's shape on BPE ids (benchmarks/accelerator.py step_alone, on this CPU, tokens/s), and for 124M on an
H100 the figure the issue gives (about 0.5M tokens/s; not measured here). Prints, per shape, each
pipeline's tokens/s and its ratio to the consumption (goal: at least 3).
"""

import itertools
import os
import pathlib
import tempfile
import time

import numpy as np
from absl import app, flags, logging

from lm.data import mixture, packing, tokens

_SECONDS = flags.DEFINE_float("seconds", 3.0, "Seconds each pipeline is iterated at each shape.")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed train steps of each CPU consumer (after one that compiles).")

VOCAB = 50257
H100_124M_TOKENS_PER_SECOND = 0.5e6  # the figure for GPT-2 124M's train step on an H100 (not measured here)
SHAPES = {  # name: (batch, context, the config whose train step consumes it on this CPU or None)
    "gpt2_test": (8, 64, ("configs/gpt2.py:test", {})),
    "baby_bpe": (64, 256, ("configs/gpt2.py:bpe_small", {"data.dataset": "synthetic", "train.batch_size": 64,
                                                        "data.context_length": 256, "data.vocab_size": 2048})),
    "gpt2_124m": (512, 1024, None),
}


def random_documents(rng: np.random.Generator, total_tokens: int) -> list[np.ndarray]:
    """Documents of lognormal lengths (median 400 tokens) holding about total_tokens random ids."""
    lengths = np.maximum(1, rng.lognormal(np.log(400), 1.0, size=total_tokens // 400)).astype(np.int64)
    lengths = lengths[np.cumsum(lengths) <= total_tokens]
    return np.split(rng.integers(0, VOCAB, size=int(lengths.sum()), dtype=np.int32), np.cumsum(lengths)[:-1])


def tokens_per_second(batches, batch_tokens: int, seconds: float) -> float:
    """Tokens per second of an iterator of batches, iterated for about seconds (the first batch untimed)."""
    next(batches)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        next(batches)
        count += 1
    return count * batch_tokens / (time.perf_counter() - start)


def tokenizer_per_core(seconds: float) -> float:
    """GPT-2's tokenizer on one core: tokens per second encoding the corpus's paragraphs."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import gzip

    from lm.data.bpe import BPETokenizer
    from lm.data.files import find_file

    tokenizer = BPETokenizer.from_gpt2()
    with gzip.open(find_file("corpus/us_presidential_speeches.txt.gz"), "rt", encoding="utf-8") as f:
        paragraphs = [line for line in f.read().splitlines() if line.strip()]
    count, start = 0, time.perf_counter()
    for paragraph in itertools.cycle(paragraphs):
        count += len(tokenizer.encode(paragraph))
        if time.perf_counter() - start > seconds:
            break
    return count / (time.perf_counter() - start)


def consumption(spec: str, overrides: dict, steps: int) -> float:
    """The train step alone of the config on this CPU, tokens per second."""
    from accelerator import step_alone

    from lm.cli.overrides import resolve_config

    config = resolve_config(spec, {k: str(v) for k, v in overrides.items()})
    timing = step_alone(config, steps, rounds=1)
    return timing["units_per_step"] / timing["step_seconds"]


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="data-pipeline-") as tmp:
        token_file = pathlib.Path(tmp) / "train.bin"
        rng.integers(0, VOCAB, size=64 << 20, dtype=np.uint16).tofile(token_file)
        ids = np.memmap(token_file, dtype=np.uint16, mode="r")
        documents = random_documents(rng, 16 << 20)
        print(f"token file: {len(ids):,} ids; packed: {len(documents):,} documents, "
              f"{sum(map(len, documents)):,} tokens")
        per_core = tokenizer_per_core(_SECONDS.value)
        print(f"tokenizer (GPT-2, one core, corpus paragraphs): {per_core:,.0f} tokens/s per core")
        for name, (batch, context, consumer) in SHAPES.items():
            start = time.perf_counter()
            rows = packing.pack_documents(documents, context)
            other = packing.pack_documents(documents[: len(documents) // 3], context)
            packed_seconds = time.perf_counter() - start
            pipelines = {
                "token file": tokens.train_windows(ids, context, batch, 0, (0, 1), 0, VOCAB),
                "packed": packing.train_batches(rows, batch, seed=0),
                "mixture": mixture.MixtureBatches([rows, other], [0.7, 0.3], batch, seed=0),
            }
            if consumer is None:
                consumed, where = H100_124M_TOKENS_PER_SECOND, "H100, the issue's figure, not measured here"
            else:
                consumed, where = consumption(*consumer, _STEPS.value), f"{consumer[0]} step alone on this CPU"
            print(f"\n{name}: batch {batch} x {context} (packing both sets {packed_seconds:.1f} s); the train step "
                  f"consumes {consumed:,.0f} tokens/s ({where})")
            for pipeline, batches in pipelines.items():
                rate = tokens_per_second(iter(batches), batch * context, _SECONDS.value)
                print(f"  {pipeline:<11} {rate:>14,.0f} tokens/s  {rate / consumed:8.1f}x the step")
            print(f"  {'tokenizer':<11} {per_core:>14,.0f} tokens/s  {per_core / consumed:8.2f}x per core")


if __name__ == "__main__":
    app.run(main)
