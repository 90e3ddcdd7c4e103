"""Fault injection: SIGKILL the trainer at random moments, resume, and check that nothing is lost.

  python benchmarks/crash_resume.py --kills=20 [--config=configs/gpt_shakespeare.py:test] [--steps=300]
      [--set=data.packing=concat ...]  (each --set=KEY=VALUE reaches both runs as --config.KEY=VALUE)

Trains one run uninterrupted, and the same run in one workdir that is killed --kills times
(SIGKILL: no handler runs, as in a machine failure or an out-of-memory kill), each time at a
random moment after the first train step, and restarted with the same command. Checkpoints are
saved every --checkpoint_every steps (asynchronously), so many kills land during a write. After
every kill, every finished checkpoint in the workdir must restore; at the end the metrics log and
the final parameters must equal the uninterrupted run's bit for bit. Prints each kill's step and
what the workdir held, then the verdict; exits 1 if anything differs.
"""

import json
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

from absl import app, flags, logging

_CONFIG = flags.DEFINE_string("config", "configs/gpt_shakespeare.py:test", "Config file and variant.")
_KILLS = flags.DEFINE_integer("kills", 20, "How many times the run is killed before it may finish.")
_STEPS = flags.DEFINE_integer("steps", 300, "Steps of the run.")
_CHECKPOINT_EVERY = flags.DEFINE_integer("checkpoint_every", 2, "Steps between checkpoints.")
_WINDOW = flags.DEFINE_float("window", 1.5, "Kill within this many seconds after the first train step.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the kill times.")
_SET = flags.DEFINE_multi_string("set", [], "A config override KEY=VALUE, given to both runs as --config.KEY=VALUE.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where the two runs go (default: a temporary folder).")

REPO = pathlib.Path(__file__).resolve().parents[1]


def train_command(config: str, workdir: pathlib.Path, steps: int, checkpoint_every: int,
                  overrides: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "lm", "train", f"--config={config}", f"--workdir={workdir}",
            f"--config.train.num_steps={steps}", f"--config.train.checkpoint_every={checkpoint_every}",
            "--config.train.log_every=1", f"--config.eval.every={steps}", "--config.sample.max_new_tokens=0",
            *(f"--config.{override}" for override in overrides)]


def run_to_end(command: list[str]) -> None:
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")


def run_and_kill(command: list[str], delay: float) -> str:
    """Starts the command, SIGKILLs it `delay` seconds after its first train step; returns its last
    log line ('finished' if it ended by itself first)."""
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    first_step, lines = threading.Event(), []

    def read():
        for line in process.stdout:
            lines.append(line.rstrip())
            if line.startswith("step ") and "| loss" in line:
                first_step.set()
        first_step.set()  # it ended (or failed) before training

    threading.Thread(target=read, daemon=True).start()
    first_step.wait()
    time.sleep(delay)
    if process.poll() is not None:
        return "finished"
    process.kill()
    process.wait()
    return lines[-1] if lines else "(no output)"


def checkpoint_folders(workdir: pathlib.Path) -> tuple[list[int], int]:
    """(the steps Orbax finished writing, how many writes were cut off): an interrupted write stays
    in a '<step>.orbax-checkpoint-tmp-*' folder, which restoring ignores and the next run removes."""
    folder = workdir / "checkpoints"
    names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
    return sorted(int(n) for n in names if n.isdigit()), sum("tmp" in n for n in names)


def restore(workdir: pathlib.Path, step: int | None = None):
    """The params of a checkpoint of workdir's run (default: the latest), on one device."""
    from lm.cli.resolve import build_experiment, load_config
    from lm.train.setup import restore_params

    config = load_config(workdir)
    return restore_params(config, build_experiment(config), workdir, step)


def crash_trial(config: str, root: pathlib.Path, kills: int, steps: int, checkpoint_every: int, window: float,
                seed: int, report=print, overrides: Sequence[str] = ()) -> dict:
    """Runs the trial (module docstring); returns {'kills': [(delay, last log line, finished
    checkpoints, cut-off writes)], 'losses_equal', 'params_equal', 'restore_failures'}."""
    import jax
    import numpy as np

    reference, crashed = root / "reference", root / "crashed"
    run_to_end(train_command(config, reference, steps, checkpoint_every, overrides))
    command = train_command(config, crashed, steps, checkpoint_every, overrides)
    rng = random.Random(seed)
    outcome = {"kills": [], "restore_failures": []}
    for i in range(kills):
        delay = rng.uniform(0, window)
        last_line = run_and_kill(command, delay)
        held, cut_off = checkpoint_folders(crashed)
        for step in held:
            try:
                restore(crashed, step)
            except Exception as e:  # noqa: BLE001 (any failure to restore is what this looks for)
                outcome["restore_failures"].append((step, repr(e)))
        outcome["kills"].append((delay, last_line, held, cut_off))
        report(f"kill {i + 1:>2} after {delay:.2f}s | last line: {last_line[:32]:<32} | checkpoints {held}"
               f"{' | a write cut off' if cut_off else ''}")
    run_to_end(command)

    def losses(workdir):
        records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["loss"] for r in records if "loss" in r}

    outcome["losses_equal"] = losses(crashed) == losses(reference) and len(losses(reference)) == steps
    outcome["params_equal"] = all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(restore(crashed)), jax.tree.leaves(restore(reference)), strict=True)
    )
    return outcome


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    logging.set_verbosity(logging.WARNING)  # Orbax logs every restore at INFO
    with tempfile.TemporaryDirectory(prefix="crash-resume-") as tmp:
        root = pathlib.Path(_WORKDIR.value or tmp)
        start = time.perf_counter()
        outcome = crash_trial(_CONFIG.value, root, _KILLS.value, _STEPS.value, _CHECKPOINT_EVERY.value,
                              _WINDOW.value, _SEED.value, overrides=_SET.value)
    killed_in_training = sum(1 for _, line, _, _ in outcome["kills"] if line.startswith("step "))
    killed_writing = sum(1 for *_, cut_off in outcome["kills"] if cut_off)
    print(f"\n=== crash_resume: {_KILLS.value} SIGKILLs, {_STEPS.value} steps, a checkpoint every "
          f"{_CHECKPOINT_EVERY.value} ({time.perf_counter() - start:.0f} s) ===")
    print(f"kills after a train step was logged     {killed_in_training} of {_KILLS.value}")
    print(f"kills that cut a checkpoint write off    {killed_writing} of {_KILLS.value}")
    print(f"checkpoints that failed to restore       {len(outcome['restore_failures'])} {outcome['restore_failures']}")
    print(f"losses equal the uninterrupted run's     {outcome['losses_equal']}")
    print(f"final params equal (bit for bit)         {outcome['params_equal']}")
    ok = outcome["losses_equal"] and outcome["params_equal"] and not outcome["restore_failures"]
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    app.run(main)
