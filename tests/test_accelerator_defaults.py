"""The accelerator defaults, checked on CPU: no bf16 scatter in a bf16 train step, k train steps per
dispatch equal k single steps, the loop reads device values only at log/eval/checkpoint steps, and
the persistent compilation cache is on by default and makes a second run compile faster."""

import json
import re
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest
from conftest import REPO, subprocess_env

from lm.cli.resolve import build_experiment
from lm.errors import UserError
from lm.train import loop, setup


def lowered_train_step(config) -> str:
    """The StableHLO of config's train step as the trainer builds it (one device), before XLA
    optimises it (XLA:CPU upcasts bf16 scatters to f32 afterwards; XLA:GPU runs them as they are)."""
    run = setup.build(config, build_experiment, jax.devices()[:1])
    batch = next(iter(run.train_data(0)))
    with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.rules):
        shapes, shardings = run.abstract_state()
        step = run.jit_train_step(shardings)
        return step.lower(shapes, (batch,)).as_text()


def scatter_operand_types(hlo: str) -> list[str]:
    """The operand tensor type (e.g. '128x32xf32') of every stablehlo.scatter in the module."""
    return re.findall(r'"stablehlo\.scatter".*?\}\) : \(tensor<([^>]*)>', hlo, re.S)


def test_a_bf16_train_step_has_no_bf16_scatter(data_dir, test_config):
    """The token lookup's gradient is a scatter-add into the table: in f32, never bf16 (slow on GPUs)."""
    test_config.model.compute_dtype = "bfloat16"
    scatters = scatter_operand_types(lowered_train_step(test_config))
    vocab_rows = 128  # Tiny Shakespeare's 65 characters padded to a multiple of 64
    assert any(t.startswith(f"{vocab_rows}x32x") for t in scatters), scatters  # the embedding's gradient is there
    assert not [t for t in scatters if t.endswith("bf16")], scatters


def test_scatter_types_are_read_from_the_hlo():
    """The pattern above finds a bf16 scatter where there is one (so the test above can fail)."""
    table = jax.numpy.zeros((10, 4), jax.numpy.bfloat16)
    grad = jax.grad(lambda t: t[np.array([1, 1, 3])].astype(np.float32).sum())
    assert scatter_operand_types(jax.jit(grad).lower(table).as_text()) == ["10x4xbf16"]


@pytest.mark.parametrize("step, expected", [(0, 4), (4, 2), (6, 4), (10, 2), (22, 2), (23, 1)])
def test_steps_until_boundary(step, expected):
    """4 steps per dispatch, logs every 6, evals every 12, 24 steps: dispatches end on each boundary."""
    assert loop.steps_until_boundary(step, 4, 24, (6, 12, 12)) == expected


def train_log(config, workdir) -> tuple[list[dict], dict]:
    loop.train(config, str(workdir), build_experiment, devices=jax.devices()[:1])
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    from experiments.language_model import build

    return records, setup.restore_params(config, build(config), workdir)


@pytest.mark.parametrize("dispatch, expected", [
    ((1e12, 1e12, (6, 12)), 1),  # long steps, or an unknown peak: one step a dispatch
    ((1e11, None, (6, 12)), 1),
    ((1e11, 0.9e14, (50, 1000, 500)), 5),  # 2.8 ms a step at 40% of the peak: 4 make 10 ms, 5 divides 50
    ((1e11, 1e15, (50, 1000, 500)), 10),  # 40 would: at most 16, the largest divisor of 50 under it
    ((1e11, 1e15, (7, 14)), 7),
    ((1e11, 1e15, (3, 1000)), 1),  # (the intervals' gcd is 1)
])
def test_auto_steps_per_dispatch(dispatch, expected):
    assert loop.auto_steps_per_dispatch(*dispatch) == expected


@pytest.mark.slow
@pytest.mark.parametrize("changes, dispatch", [({"steps_per_dispatch": 4}, "4 and 2"),
                                               ({"steps_per_dispatch": 0, "peak_flops": 1e15}, "auto: 6")])
def test_k_steps_per_dispatch_equal_k_single_steps(data_dir, test_config, tmp_path, capsys, changes, dispatch):
    """steps_per_dispatch=4 with logs every 6 steps (dispatches of 4 and 2 steps), or 0 (automatic) with a peak
    that makes these steps short (6 steps a dispatch: the gcd of the intervals): the same logged losses, grad
    norms and eval losses, and the same final parameters, as one step per dispatch."""
    test_config.train.update(num_steps=12, log_every=6, checkpoint_every=12, steps_per_dispatch=1)
    test_config.eval.every = 12
    single, single_params = train_log(test_config, tmp_path / "single")
    test_config.train.update(changes)
    multi, multi_params = train_log(test_config, tmp_path / "multi")
    chose_six = "6 steps per dispatch (train.steps_per_dispatch=0" in capsys.readouterr().out
    assert chose_six == dispatch.startswith("auto")
    for key in ("loss", "grad_norm", "learning_rate", "eval_loss"):
        a = [(r["step"], r[key]) for r in single if key in r]
        b = [(r["step"], r[key]) for r in multi if key in r]
        assert len(a) >= 2 and [s for s, _ in a] == [s for s, _ in b], (key, a, b)
        np.testing.assert_allclose([v for _, v in a], [v for _, v in b], rtol=1e-5, err_msg=key)
    # Up to the summation order of two different programs: Adam turns the noise on near-zero gradients into
    # updates of about 1e-6 (a skipped or repeated step moves parameters by about the learning rate, 1e-3).
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5), single_params, multi_params)


def test_a_bad_steps_per_dispatch_is_a_user_error(test_config):
    test_config.train.steps_per_dispatch = -1
    with pytest.raises(UserError, match=r"train.steps_per_dispatch=-1"):
        setup.build(test_config, build_experiment, None)


def test_the_loop_reads_device_values_only_at_log_eval_and_checkpoint_steps(data_dir, test_config, tmp_path,
                                                                           monkeypatch):
    """24 steps, one log/eval/checkpoint at the end: no implicit device->host transfer at all (the
    transfer guard raises on one), and a handful of explicit reads (the step-0 and final evals, the
    first step's printed line, the final log and NaN check), not one per step."""
    test_config.train.update(num_steps=24, log_every=24, checkpoint_every=24)
    test_config.eval.every = 24
    reads = []
    device_get = jax.device_get
    monkeypatch.setattr(jax, "device_get", lambda tree: reads.append(1) or device_get(tree))
    with jax.transfer_guard_device_to_host("disallow"):
        loop.train(test_config, str(tmp_path), build_experiment, devices=jax.devices()[:1])
    assert 0 < len(reads) <= 8, len(reads)  # + the checkpoint's host copy for its checksums


def test_the_compilation_cache_is_on_by_default(tmp_path, monkeypatch):
    """'auto': $JAX_COMPILATION_CACHE_DIR, else a per-user folder under $XDG_CACHE_HOME; 'none' is
    off; an unwritable default folder means no cache (a warning), not a failed run."""
    from jax.experimental.compilation_cache import compilation_cache

    before = jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache
    try:
        monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "from_env"))
        assert setup.use_compilation_cache("auto") == str(tmp_path / "from_env")
        monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        assert setup.use_compilation_cache("auto") == str(tmp_path / "xdg" / "lm" / "jax_compilation_cache")
        assert jax.config.jax_enable_compilation_cache
        (tmp_path / "blocker").write_text("")
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "blocker"))
        assert setup.use_compilation_cache("auto") == ""
        assert setup.use_compilation_cache("none") == "" and not jax.config.jax_enable_compilation_cache
    finally:
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_enable_compilation_cache", before[1])
        compilation_cache.reset_cache()


@pytest.mark.slow
def test_a_second_identical_run_compiles_faster(tmp_path, data_dir):
    """Two runs of the same command with the default cache (a fresh per-user folder here): the second
    names the same cache in its first lines and loads the train step instead of compiling it."""
    env = subprocess_env(JAX_COMPILATION_CACHE_DIR=None, XDG_CACHE_HOME=str(tmp_path / "cache_home"),
                         JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    compile_seconds = []
    for run in ("first", "second"):
        result = subprocess.run(
            [sys.executable, "-m", "lm", "train", "--config=configs/gpt_shakespeare.py:test",
             f"--workdir={tmp_path / run}", "--config.train.num_steps=2", "--config.sample.max_new_tokens=0"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        cache = tmp_path / "cache_home" / "lm" / "jax_compilation_cache"
        assert result.stdout.splitlines()[0] == f"compilation cache: {cache}"
        compile_seconds.append(json.loads((tmp_path / run / "summary.json").read_text())["compile_seconds"])
    assert compile_seconds[1] < 0.6 * compile_seconds[0], compile_seconds


def test_image_workers_default_to_the_cores_less_two_and_keep_the_batches(monkeypatch):
    """num_workers=-1 (ViT full): cores - 2 worker processes, at least 1; the batches are those of
    the in-process pipeline, in order."""
    from absl import flags

    from lm.data import images

    if not flags.FLAGS.is_parsed():  # Grain's workers read absl flags (lm train parses them)
        flags.FLAGS.mark_as_parsed()
    assert (images.worker_count(16), images.worker_count(3), images.worker_count(2)) == (14, 1, 1)
    rng = np.random.default_rng(0)
    pixels, labels = rng.integers(0, 256, (64, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, 64)
    monkeypatch.setattr(images.os, "cpu_count", lambda: 4)
    in_process = iter(images.train_batches(pixels, labels, 8, seed=1, num_workers=0))
    workers = iter(images.train_batches(pixels, labels, 8, seed=1, num_workers=-1))
    for _ in range(3):
        a, b = next(in_process), next(workers)
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
