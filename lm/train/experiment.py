"""What the trainer needs from an experiment (one module per task in experiments/)."""

import dataclasses
import pathlib
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import grain
import jax
import numpy as np

Batch = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Evaluator:
    """An evaluation the trainer runs every `every` steps (0: never), at step 0 and after the last
    step: evaluate(params) -> metrics, logged as <name>_<metric> (eval_loss, val_bleu, ...)."""

    name: str
    every: int
    evaluate: Callable[[Any], dict[str, float]]


class Experiment(Protocol):
    unit: str  # what a batch counts, for throughput: "tokens", "images", ...
    units_per_example: int  # e.g. the context length for a language model

    def init(self, rng: jax.Array) -> dict:
        """Model variables, with parameters boxed with their logical axis names."""

    def loss(self, params, batch: Batch, rng: jax.Array, train: bool) -> tuple[jax.Array, dict]:
        """Mean loss over the batch and scalar metrics; pure and jittable."""

    def train_data(self, batch_size: int, seed: int, shard: tuple[int, int], start_step: int) -> grain.IterDataset:
        """Endless batches of batch_size examples: with shard = (index, count), the k-th is rows
        [index * batch_size, (index + 1) * batch_size) of global batch number start_step + k. Global
        batch s depends on the seed and s only (not on the number of processes), so a run resumes
        at its checkpoint's step on any topology."""

    def batch_variants(self, batch: dict[str, jax.ShapeDtypeStruct]) -> list[dict[str, jax.ShapeDtypeStruct]]:
        """The shapes of every training batch train_data can yield, from those of one (global) batch:
        [batch] for data of one shape; one per length bucket for bucketed data. The trainer compiles
        the train step for all of them at the start, in parallel."""

    def eval_data(self) -> Iterable[Batch]:
        """The fixed eval batches, whole (every process reads them; each feeds its devices' rows)."""

    def eval_weight(self, batch: Batch) -> jax.Array:
        """How much a batch counts in the eval means (its real target tokens, say); jittable."""

    def evaluators(self) -> list[Evaluator]:
        """Evaluations besides the trainer's own `eval` (the loss and metrics of eval_data every
        eval.every steps): BLEU of decoded val sentences, say. They get host-local params (whole
        arrays on every process, like texts and final_results). May be empty."""

    def active_params(self, params: Any) -> int:
        """The parameters one example's computation uses (fewer than all with mixture-of-experts)."""

    def flops_per_example(self, active_params: int) -> float:
        """Training FLOPs (forward + backward) for one example."""

    def save_assets(self, workdir: pathlib.Path) -> None:
        """Writes what later commands need besides the checkpoint (tokenizers, ...)."""

    def texts(self, params: Any) -> dict[str, str]:
        """Human-readable outputs of the trained model (samples, translations), may be empty."""

    def final_results(
        self, params: Any, evaluate: Callable[[Iterable[Batch]], dict[str, float]], workdir: pathlib.Path
    ) -> dict[str, float]:
        """Held-out results of the trained model (test metrics, BLEU), computed once after training;
        `evaluate(batches)` gives the weighted mean metrics of global batches (as eval_data
        gives them) from the trainer's sharded eval step. May be empty. Runs on every process (the
        computations are collective); files for workdir (decoded outputs, plots) are written by
        process 0 only (lm.distributed.is_primary)."""
