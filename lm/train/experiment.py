"""What the trainer needs from an experiment, and the defaults most experiments share.

An experiment is any importable module with two functions (config.experiment names it: a built-in's
short name, such as `language_model`, or a dotted module path, such as `mypkg.tasks.toy`):

  build(config, workdir) -> Experiment         the task, ready to train (reads its data; workdir: the run
                                               folder, where an earlier attempt saved what it may reuse,
                                               or None outside a run); its .config is the one the trainer
                                               runs with and saves: config, or a copy with what config
                                               leaves to the data filled in (a language model's vocabulary
                                               size, from its tokenizer)
  from_workdir(config, workdir) -> Experiment  the task of a trained run, for the inference commands
                                               (its saved assets, no training data)

The `lm` command imports the module and hands its build to the trainer (lm.train.loop.train); nothing
under lm/ imports experiments. A subclass of Experiment writes init, loss, train_data, eval_data and
flops_per_example; the other methods have defaults that it overrides where the task needs more.
"""

import abc
import dataclasses
import pathlib
from collections.abc import Callable, Iterable
from typing import Any

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from lm.data.run_cache import DataCache
from lm.layers.moe import parameter_counts

Batch = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Evaluator:
    """An evaluation the trainer runs every `every` steps (0: never), at step 0 and after the last
    step: evaluate(params) -> metrics, logged as <name>_<metric> (eval_loss, val_bleu, ...)."""

    name: str
    every: int
    evaluate: Callable[[Any], dict[str, float]]


class Evaluation(dict):
    """One pass of the trainer's sharded eval step over global batches: the weighted mean metrics (the
    dict, name -> value) and `outputs`, the experiment's eval_outputs of every row of the batches, in
    order, padding rows included, as host arrays (None for an experiment without eval outputs)."""

    def __init__(self, metrics: dict[str, float], outputs: Any):
        super().__init__(metrics)
        self.outputs = outputs


class Experiment(abc.ABC):
    """A task the trainer runs: its model, loss and data, from config (the run's whole config)."""

    unit: str = "examples"  # what a batch counts, for throughput: "tokens", "images", ...
    units_per_example: int = 1  # e.g. the context length for a language model

    def __init__(self, config: ml_collections.ConfigDict, data_cache: DataCache | None = None):
        """data_cache: what build() derived from the data, written into the run folder by save_assets."""
        self.config = config
        self.data_cache = data_cache

    @abc.abstractmethod
    def init(self, rng: jax.Array) -> dict:
        """Model variables, with parameters boxed with their logical axis names."""

    @abc.abstractmethod
    def loss(self, params, batch: Batch, rng: jax.Array, train: bool) -> tuple[jax.Array, dict]:
        """Mean loss over the batch and scalar metrics; pure and jittable."""

    @abc.abstractmethod
    def train_data(self, batch_size: int, seed: int, shard: tuple[int, int], start_step: int) -> grain.IterDataset:
        """Endless batches of batch_size examples: with shard = (index, count), the k-th is rows
        [index * batch_size, (index + 1) * batch_size) of global batch number start_step + k. Global
        batch s depends on the seed and s only (not on the number of processes), so a run resumes
        at its checkpoint's step on any topology."""

    @abc.abstractmethod
    def eval_data(self) -> Iterable[Batch]:
        """The fixed eval batches, whole (every process reads them; each feeds its devices' rows); none: the
        trainer's own `eval` is left out (an experiment whose evaluators say all there is to say)."""

    @abc.abstractmethod
    def flops_per_example(self, active_params: int) -> float:
        """Training FLOPs (forward + backward) for one example."""

    def batch_variants(self, batch: dict[str, jax.ShapeDtypeStruct]) -> list[dict[str, jax.ShapeDtypeStruct]]:
        """The shapes of every batch the train step can get (rollout's of train_data's), from those of one global
        batch of train_data: [batch] for data of one shape (the default); one per length bucket for bucketed
        data. The trainer compiles the train step for all of them at the start, in parallel."""
        return [batch]

    def rollout(self, params: Any, batches: tuple[dict[str, jax.Array], ...], step: int
                ) -> tuple[tuple[dict[str, jax.Array], ...], dict[str, float]]:
        """The batches the train step trains on, from the global batches train_data gave for steps step, step + 1,
        ... (on the devices) and the params of step (sharded as in training), with metrics of their making to log
        beside the step's (host floats). Online reinforcement learning samples its training batches from the
        policy here (experiments/grpo.py); the trainer calls it before every dispatch, outside the jitted step.
        Default: the batches as they are, no metrics."""
        del params, step  # (offline data: nothing to make)
        return batches, {}

    def eval_weight(self, batch: Batch) -> jax.Array:
        """How much a batch counts in the eval means; jittable. Default: its examples (the leading
        axis); an experiment with padding counts its real target tokens, say."""
        return jnp.asarray(jax.tree.leaves(batch)[0].shape[0], jnp.float32)

    def evaluators(self) -> list[Evaluator]:
        """Evaluations besides the trainer's own `eval` (the loss and metrics of eval_data every
        eval.every steps): BLEU of decoded val sentences, say. They get host-local params (whole
        arrays on every process, like texts and final_results). Default: none."""
        return []

    def eval_outputs(self, params: Any, batch: Batch) -> Any:
        """What the eval step returns per example besides the loss (predictions: arrays whose leading
        axis is the batch's), gathered over the eval pass into Evaluation.outputs for eval_scores and
        final_results: so task scores need no second pass over the data. Pure and jittable. Default:
        None (nothing)."""
        return None

    def eval_scores(self, outputs: Any) -> dict[str, float]:
        """Scores of the trainer's eval pass over eval_data() (accuracy, F1, ...) from its gathered
        eval_outputs, logged under these names (e.g. dev_accuracy) beside eval_loss. Default: none."""
        return {}

    def active_params(self, params: Any) -> int:
        """The parameters one example's computation uses: all of them, but only top_k of the experts
        of a mixture-of-experts block (config.model.moe.top_k, where the config has one)."""
        moe = self.config.get("model", {}).get("moe")
        return parameter_counts(params, moe.top_k if moe else 1)[1]

    def prepare(self, params: Any, workdir: pathlib.Path) -> None:
        """What the experiment derives from a new run's starting parameters (fresh, with init_from loaded: its
        step-0 params, sharded as in training, under the run's mesh), before the trainer asks for its data: DPO
        scores its pairs with them, the frozen reference, and keeps the scores in workdir (process 0 writes) for
        build() to read back when the run resumes, which is not prepared again. Runs on every process (its
        computations are collective). Default: nothing."""
        del params, workdir  # (nothing to derive)

    def save_assets(self, workdir: pathlib.Path) -> None:
        """Writes what later commands and a resumed run need besides the checkpoint, once every check of the
        run has passed: here the data cache (build's tokenised data); a subclass adds its tokenizers, say,
        and calls this too."""
        if self.data_cache is not None:
            self.data_cache.save(workdir)

    def export_vocabulary(self) -> tuple[int | None, Any]:
        """For `lm export`: (the vocabulary size, a tokenizer to write beside the weights or None).
        Default: (None, None), a model without tokens (images)."""
        return None, None

    def texts(self, params: Any) -> dict[str, str]:
        """Human-readable outputs of the trained model (samples, translations). Default: none."""
        return {}

    def final_results(
        self, params: Any, evaluate: Callable[[Iterable[Batch]], Evaluation], workdir: pathlib.Path
    ) -> dict[str, float]:
        """Held-out results of the trained model (test metrics, BLEU), computed once after training;
        `evaluate(batches)` gives the weighted mean metrics of global batches (as eval_data
        gives them) from the trainer's sharded eval step, and their eval_outputs (an Evaluation).
        Runs on every process (the computations are collective); files for workdir (decoded outputs,
        plots) are written by process 0 only (lm.distributed.is_primary). Default: none."""
        return {}
