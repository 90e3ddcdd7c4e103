"""Evaluate a run's checkpoint: its eval metrics, evaluators and held-out results.

  lm eval --workdir=runs/baby [--step=1000] [--out=runs/baby/eval_1000]

Runs every evaluation the trainer runs, on the checkpoint at --step (default: the latest) of the run in
--workdir, with the run's saved config and on its mesh (jitted, sharded as in training): the loss and
metrics of the eval data (eval_*, with the experiment's scores of that pass, e.g. dev_accuracy), the
experiment's evaluators (val_bleu, ...) and its held-out final results (test BLEU, test accuracy, ...).
Prints them and writes them to <out>/eval.json, with any files the final results write (decoded test
sentences, plots); --out defaults to <workdir>/eval_<step>, so the run's own files stay as they are.
The run's data is read again (the run's data cache and tokenizers are reused where it saved them).
"""

import pathlib

from absl import app, flags, logging

from lm.cli import define_string_once, define_workdir, parse_flags, reject_arguments
from lm.cli.resolve import find_experiment, load_config
from lm.errors import UserError, run_user_errors

_WORKDIR = define_workdir("A run folder written by lm train.")
_STEP = flags.DEFINE_integer("step", None, "The checkpoint's step (default: the latest).")
_OUT = define_string_once("out", "Where eval.json and the results' files go (default: <workdir>/eval_<step>).")


def evaluate(workdir: pathlib.Path, step: int | None, out: str | None) -> dict[str, float]:
    """The run's evaluations at step, printed and written to out/eval.json; returns them."""
    from lm.train.evaluate import EVAL_FILE, evaluate_checkpoint

    if step is not None and step < 0:
        raise UserError(f"--step={step}: give a checkpoint's step, or leave it out for the latest")
    config = load_config(workdir)
    experiment = find_experiment(config.experiment)
    results, folder = evaluate_checkpoint(config, workdir, experiment.build, step, pathlib.Path(out) if out else None)
    print("results: " + " | ".join(f"{k} {v:.4g}" for k, v in results.items() if k != "step"))
    print(f"written: {folder / EVAL_FILE}")
    return results


def main(argv: list[str]) -> None:
    reject_arguments(argv)
    logging.set_verbosity(logging.WARNING)
    run_user_errors(lambda: evaluate(pathlib.Path(_WORKDIR.value), _STEP.value, _OUT.value))


def run() -> None:
    """The command: flags from sys.argv, then main."""
    app.run(main, flags_parser=parse_flags)
