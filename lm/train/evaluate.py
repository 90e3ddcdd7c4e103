"""Evaluating params the trainer's way, during training and after it (`lm eval`).

Evaluations holds what every evaluation of a run shares: the eval step compiled for the mesh (jitted,
the params and batches sharded as in training), the experiment's fixed eval batches and its
evaluators. run(evaluators, params) gives their metrics: the trainer's own `eval` (the weighted mean
loss and metrics of eval_data, and the experiment's eval_scores of that pass's outputs) and the
experiment's own (BLEU of decoded sentences, ...). evaluate_checkpoint runs every one of them, then the
experiment's held-out final results, on a saved checkpoint of a run.
"""

import json
import pathlib

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from lm import sharding
from lm.distributed import host_local, is_primary
from lm.errors import UserError
from lm.progress import Progress, await_each, length
from lm.train.checkpoint import Checkpointer
from lm.train.compiled import CompiledPerShape
from lm.train.experiment import Evaluation, Evaluator
from lm.train.metrics import mean_metrics
from lm.train.setup import MakeExperiment, Setup, build, checkpoint_directory
from lm.train.step import make_eval_step

EVAL_FILE = "eval.json"  # what evaluate_checkpoint writes


class Evaluations:
    """The eval step, the eval batches and the evaluators of a run (setup), for params in
    params_shardings: `eval` every eval.every steps, then the experiment's own evaluators."""

    def __init__(self, setup: Setup, params_shardings):
        experiment = setup.experiment
        self.mesh, self.experiment = setup.mesh, experiment
        self.eval_step = CompiledPerShape(jax.jit(
            make_eval_step(experiment.loss, experiment.eval_weight, experiment.eval_outputs),
            in_shardings=(params_shardings, sharding.batch_sharding(setup.mesh)),
        ), "eval step")
        self.eval_batches = list(experiment.eval_data())
        own = [Evaluator("eval", setup.config.eval.every,
                         lambda params: self.evaluate_batches(params, self.eval_batches))] if self.eval_batches else []
        self.evaluators = [*own, *experiment.evaluators()]

    def evaluate_batches(self, params, batches, what: str = "eval") -> Evaluation:
        """Weighted mean metrics (per real token, say, not per padded batch) of global batches, and the
        experiment's eval outputs of all their rows, in order, gathered whole onto every process. A
        long pass prints its progress ('<what> pass: <i> of <N> | <batches/s> | ETA': lm.progress)."""
        progress = Progress(f"{what} pass", length(batches), "batches")
        steps = await_each((self.eval_step(params, sharding.place_batch(b, self.mesh)) for b in batches), progress)
        metrics, weights, outputs = zip(*steps, strict=True)
        rows = jax.tree.map(lambda *parts: np.concatenate(parts), *jax.device_get(host_local(list(outputs))))
        return Evaluation(mean_metrics(list(metrics), list(weights)), rows)

    def run(self, evaluators: list[Evaluator], params, prefix: str = "") -> dict[str, float]:
        """The metrics of evaluators on params (sharded as in training; the experiment's own evaluators
        get them host-local), named <evaluator>_<metric>, with the experiment's eval_scores of the `eval`
        pass (named as it names them); each evaluator's printed on a line after prefix (its loss if it
        has one, else all)."""
        results = {}
        for evaluator in evaluators:
            metrics = evaluator.evaluate(params if evaluator.name == "eval" else host_local(params))
            shown = {"loss": metrics["loss"]} if "loss" in metrics else metrics
            print(prefix + " | ".join(f"{evaluator.name} {k} {v:.4f}" for k, v in shown.items()))
            results.update({f"{evaluator.name}_{k}": v for k, v in metrics.items()})
            if evaluator.name == "eval":  # the task's scores, from the same pass
                scores = self.experiment.eval_scores(metrics.outputs)
                if scores:
                    print(prefix + " | ".join(f"{k} {v:.4f}" for k, v in scores.items()))
                results.update(scores)
        return results

    def final_results(self, params, workdir: pathlib.Path) -> dict[str, float]:
        """The experiment's held-out results of params (sharded as in training), its files in workdir."""
        return self.experiment.final_results(
            host_local(params), lambda batches: self.evaluate_batches(params, batches, "held-out"), workdir)


def evaluate_checkpoint(config: ml_collections.ConfigDict, workdir: pathlib.Path, make_experiment: MakeExperiment,
                        step: int | None = None, out: pathlib.Path | None = None,
                        devices: list[jax.Device] | None = None) -> tuple[dict[str, float], pathlib.Path]:
    """Every evaluation of the run in workdir (config: its saved one) on its checkpoint at step (default:
    the latest), on config's mesh over devices (default: all): ({"step": step, the evaluators' metrics,
    the experiment's final results}, out). They are written to out/eval.json (out: default
    workdir/eval_<step>), where the files final results write go too; the run's own files stay as
    they are."""
    setup = build(config, make_experiment, devices, workdir)
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
        state_shapes, state_shardings = setup.abstract_state()
        directory = checkpoint_directory(config, workdir)
        checkpointer = Checkpointer(directory, config.train.keep_checkpoints)
        try:
            steps = checkpointer.manager.all_steps()
            if not steps:
                raise UserError(f"no checkpoint in {directory}: train first with lm train")
            if step is None:
                step = max(steps)
            elif step not in steps:
                raise UserError(f"--step={step}: {directory} holds the checkpoints of steps "
                                f"{', '.join(map(str, sorted(steps)))}")
            params = checkpointer.restore_checked(step, state_shapes).params
        finally:
            checkpointer.close()
        evaluations = Evaluations(setup, state_shardings.params)
        metrics = evaluations.run(evaluations.evaluators, params, prefix=f"step {step:>6} | ")
        out = out or workdir / f"eval_{step}"
        out.mkdir(parents=True, exist_ok=True)
        results = {"step": step, **metrics, **evaluations.final_results(params, out)}
    if is_primary():
        (out / EVAL_FILE).write_text(json.dumps(results, indent=2))
    return results, out
