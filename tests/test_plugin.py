"""An experiment from the user's own package: a toy linear regression written under tmp_path, outside
lm, trained, resumed, swept, compared and evaluated through the `lm` commands (python -m lm ..., run
in the package's folder as a user would), without touching lm."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import subprocess_env

from lm.cli import compare
from lm.cli.resolve import load_run
from lm.errors import UserError

EXPERIMENT = '''
"""A toy task: y = x . w + noise, fitted by a linear model (the shape of any experiment)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lm.train.experiment import Experiment


def examples(rng: np.random.Generator, count: int, dim: int, noise: float) -> dict[str, np.ndarray]:
    w = np.arange(1, dim + 1, dtype=np.float32) / dim  # the weights to learn
    x = rng.normal(size=(count, dim)).astype(np.float32)
    return {"x": x, "y": x @ w + noise * rng.normal(size=count).astype(np.float32)}


class Regression(Experiment):
    def __init__(self, config):
        super().__init__(config)
        self.model = nn.Dense(1)

    def init(self, rng):
        return self.model.init(rng, jnp.zeros((1, self.config.data.dim)))

    def loss(self, params, batch, rng, train):
        predicted = self.model.apply({"params": params}, batch["x"])[:, 0]  # (B,)
        mse = jnp.mean((predicted - batch["y"]) ** 2)
        return mse, {"mse": mse}

    def train_data(self, batch_size, seed, shard, start_step):
        index, count = shard
        d = self.config.data
        step = start_step
        while True:  # global batch s from (seed, s) alone
            batch = examples(np.random.default_rng([seed, step]), batch_size * count, d.dim, d.noise)
            yield {k: v[index * batch_size:(index + 1) * batch_size] for k, v in batch.items()}
            step += 1

    def eval_data(self):
        d = self.config.data
        return [examples(np.random.default_rng([10**6, i]), 32, d.dim, d.noise) for i in range(2)]

    def flops_per_example(self, active_params):
        return 6 * active_params

    def final_results(self, params, evaluate, workdir):
        d = self.config.data
        return {"test_mse": evaluate([examples(np.random.default_rng([10**7]), 64, d.dim, d.noise)])["mse"]}


def build(config, workdir):
    return Regression(config)


def from_workdir(config, workdir):
    return Regression(config)
'''

CONFIG = '''
"""The toy regression: python -m lm train --config=toypkg/config.py --workdir=runs/toy"""

import ml_collections

from lm import sharding
from lm.train.options import mesh_options, optimizer_options, run_options, train_options


def get_config():
    config = run_options("toypkg.regression")
    config.data = ml_collections.ConfigDict({"dim": 4, "noise": 0.01})
    config.optimizer = optimizer_options(learning_rate=0.1, warmup_steps=0, decay_steps=40)
    config.train = train_options(batch_size=16, num_steps=40, log_every=10, checkpoint_every=20,
                                 compilation_cache_dir="none")
    config.eval = ml_collections.ConfigDict({"every": 20})
    config.mesh = mesh_options()
    config.sharding_rules = sharding.DEFAULT_RULES
    return config
'''


def lm_command(folder, *args) -> subprocess.CompletedProcess:
    """`python -m lm args` run in folder, on one CPU device."""
    return subprocess.run([sys.executable, "-m", "lm", *args], cwd=folder, env=subprocess_env(), capture_output=True,
                          text=True, timeout=300)


def history(workdir) -> dict[int, dict]:
    """metrics.jsonl's records by step (train and eval records of a step merged)."""
    records = {}
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        records.setdefault(record["step"], {}).update(record)
    return records


@pytest.mark.slow
def test_an_experiment_from_the_users_package_trains_resumes_sweeps_and_compares(tmp_path, capsys, monkeypatch):
    package = tmp_path / "toypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "regression.py").write_text(textwrap.dedent(EXPERIMENT))
    (package / "config.py").write_text(textwrap.dedent(CONFIG))
    config = "--config=toypkg/config.py"

    # a sweep over two seeds, both arms at once (each a `python -m lm train` of its own)
    swept = lm_command(tmp_path, "sweep", config, "--sweep=seed=0,1", "--workdir=runs/sweep", "--parallel=2")
    assert swept.returncode == 0, swept.stdout[-3000:] + swept.stderr[-3000:]
    seed0 = tmp_path / "runs/sweep/seed=0"
    results = json.loads((seed0 / "results.json").read_text())
    assert results["step"] == 40 and results["test_mse"] < 0.05, results  # learnt: the start is ~1.9

    # stopped at step 20 and resumed: the same history as the sweep's uninterrupted seed-0 arm
    first = lm_command(tmp_path, "train", config, "--workdir=runs/resumed", "--config.train.num_steps=20")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = lm_command(tmp_path, "train", config, "--workdir=runs/resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 20" in resumed.stdout
    straight, again = history(seed0), history(tmp_path / "runs/resumed")
    assert sorted(again) == sorted(straight) == [0, 10, 20, 30, 40]
    for step in (30, 40):
        np.testing.assert_allclose(again[step]["loss"], straight[step]["loss"], rtol=1e-5)
    np.testing.assert_allclose(again[40]["eval_mse"], straight[40]["eval_mse"], rtol=1e-5)

    compare.compare(str(tmp_path / "runs/sweep"))  # what `lm compare runs/sweep` runs
    assert "test_mse" in capsys.readouterr().out and (tmp_path / "runs/sweep/report.md").is_file()

    evaluated = lm_command(tmp_path, "eval", f"--workdir={seed0}")  # the checkpoint, scored again
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    scores = json.loads((seed0 / "eval_40/eval.json").read_text())
    np.testing.assert_allclose(scores["test_mse"], results["test_mse"], rtol=1e-5)
    np.testing.assert_allclose(scores["eval_mse"], straight[40]["eval_mse"], rtol=1e-5)

    # a command the experiment has no method for (`lm sample`): one line
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match=f"^{seed0} holds a 'toypkg.regression' run, whose experiment has no sample"):
        load_run(seed0, "sample")


def test_an_experiment_module_that_is_missing_or_incomplete_is_one_line(tmp_path, monkeypatch):
    from lm.cli.resolve import find_experiment

    (tmp_path / "halfdone.py").write_text("def build(config, workdir):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match="no module 'nowhere.toy' can be imported; use a built-in"):
        find_experiment("nowhere.toy")
    with pytest.raises(UserError, match="halfdone.py defines no from_workdir"):
        find_experiment("halfdone")
    with pytest.raises(UserError, match="is not a module path"):
        find_experiment("")
    assert find_experiment("language_model").__name__ == "experiments.language_model"
