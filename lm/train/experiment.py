"""What the trainer needs from an experiment (one module per task in experiments/)."""

import pathlib
from collections.abc import Iterable
from typing import Any, Protocol

import grain
import jax
import numpy as np

Batch = dict[str, np.ndarray]


class Experiment(Protocol):
    unit: str  # what a batch counts, for throughput: "tokens", "images", ...
    units_per_example: int  # e.g. the context length for a language model

    def init(self, rng: jax.Array) -> dict:
        """Model variables, with parameters boxed with their logical axis names."""

    def loss(self, params, batch: Batch, rng: jax.Array, train: bool) -> tuple[jax.Array, dict]:
        """Mean loss over the batch and scalar metrics; pure and jittable."""

    def train_data(self, batch_size: int, seed: int, shard: tuple[int, int]) -> grain.IterDataset:
        """Endless checkpointable batches of this process's batch_size examples."""

    def eval_data(self) -> Iterable[Batch]:
        """The fixed global eval batches."""

    def active_params(self, params: Any) -> int:
        """The parameters one example's computation uses (fewer than all with mixture-of-experts)."""

    def flops_per_example(self, active_params: int) -> float:
        """Training FLOPs (forward + backward) for one example."""

    def save_assets(self, workdir: pathlib.Path) -> None:
        """Writes what later commands need besides the checkpoint (tokenizers, ...)."""

    def texts(self, params: Any) -> dict[str, str]:
        """Human-readable outputs of the trained model (samples, translations), may be empty."""
