"""Optimizers and schedules by name (lm/train/optim.py): each schedule against its formula in numpy, Muon's update
against numpy's Newton-Schulz, the weight-decay mask for every optimizer, Muon's split, the optimizer state sharded
like the parameters and resumed exactly, a WSD run extended with more steps, and bad input as one line."""

import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import PartitionSpec as P

from lm.cli.overrides import resolve_config
from lm.cli.resolve import build_experiment
from lm.errors import UserError
from lm.train.checkpoint import Checkpointer
from lm.train.loop import train
from lm.train.optim import (
    decay_start,
    learning_rate_schedule,
    logged_learning_rates,
    make_optimizer,
    muon_labels,
    resolve_schedule,
    wsd_resume_limit,
)
from lm.train.options import OPTIMIZERS, optimizer_options
from lm.train.setup import build
from lm.train.state import TrainState
from lm.train.step import make_multi_step, make_train_step

PEAK, END = 1e-2, 1e-3


def schedule_config(schedule: str, **changes) -> ml_collections.ConfigDict:
    """An optimizer section with a 10-step warmup and a 100-step decay."""
    return optimizer_options(schedule=schedule, learning_rate=PEAK, min_learning_rate=END, warmup_steps=10,
                             decay_steps=100, **changes)


def numpy_schedule(schedule: str, shape: str, steps: np.ndarray) -> np.ndarray:
    """The formulas, written out: warmup 0 -> PEAK over 10 steps, then the schedule to END at step 100."""
    warm = PEAK * steps / 10
    t = np.clip((steps - 10) / 90, 0, 1)  # the share of the post-warmup steps done
    after = {"cosine": END + (PEAK - END) * 0.5 * (1 + np.cos(np.pi * t)),
             "linear": PEAK + (END - PEAK) * t,
             "constant": np.full_like(t, PEAK)}.get(schedule)
    if schedule == "wsd":  # stable to step 80 (decay_fraction 0.2 of 100), then down over 20 steps
        d = np.clip((steps - 80) / 20, 0, 1)
        down = {"linear": PEAK + (END - PEAK) * d, "cosine": END + (PEAK - END) * 0.5 * (1 + np.cos(np.pi * d)),
                "1-sqrt": PEAK - (PEAK - END) * np.sqrt(d)}[shape]
        after = np.where(steps < 80, PEAK, down)
    return np.where(steps < 10, warm, after)


@pytest.mark.parametrize("schedule, shape", [("cosine", "linear"), ("linear", "linear"), ("constant", "linear"),
                                             ("wsd", "linear"), ("wsd", "cosine"), ("wsd", "1-sqrt")])
def test_each_schedule_is_its_formula(schedule, shape):
    steps = np.arange(0, 121)
    got = jax.vmap(learning_rate_schedule(schedule_config(schedule, decay_shape=shape)))(jnp.asarray(steps))
    np.testing.assert_allclose(np.asarray(got), numpy_schedule(schedule, shape, steps), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant", "wsd"])
def test_without_a_warmup_every_schedule_starts_at_its_peak(schedule):
    config = optimizer_options(schedule=schedule, learning_rate=PEAK, warmup_steps=0, decay_steps=100)
    assert float(learning_rate_schedule(config)(0)) == pytest.approx(PEAK)


def test_a_wsd_decay_follows_the_run_and_a_moved_decay_resumes_before_either_decay_began():
    config = resolve_config("configs/gpt_shakespeare.py:baby", {"optimizer.schedule": "wsd", "train.num_steps": "500"})
    recorded = resolve_schedule(config).optimizer.to_dict()
    assert (recorded["warmup_steps"], recorded["decay_steps"], decay_start(resolve_schedule(config).optimizer)) \
        == (25, 500, 400)
    config.train.num_steps = 1000  # extended: the decay moves to the new end, the warmup it had stays
    extended = resolve_schedule(config, recorded).optimizer
    assert (extended.warmup_steps, extended.decay_steps, decay_start(extended)) == (25, 1000, 800)
    assert wsd_resume_limit(recorded, extended) == 400  # the last stable step of the 500-step run
    assert wsd_resume_limit(recorded, ml_collections.ConfigDict(recorded)) is None  # resumed, not extended
    config.optimizer.schedule = "cosine"  # cosine keeps the schedule its config.json records
    assert resolve_schedule(config, {**recorded, "schedule": "cosine"}).optimizer.decay_steps == 500
    assert decay_start(resolve_schedule(config).optimizer) is None


def muon_config(**changes) -> ml_collections.ConfigDict:
    return optimizer_options(name="muon", learning_rate=1e-3, muon_learning_rate=0.02, warmup_steps=0,
                             decay_steps=10, grad_clip_norm=1e6, **changes)


def numpy_orthogonalised(g: np.ndarray) -> np.ndarray:
    """Muon's Newton-Schulz iteration (modded-nanogpt's quintic coefficients, 5 steps) on a wide matrix."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g / (np.linalg.norm(g) + 1e-8)
    for _ in range(5):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x


def test_muon_orthogonalises_the_block_matrices_and_adamw_takes_the_rest():
    rng = np.random.default_rng(0)
    params = {"block_0": {"mlp": {"kernel": rng.normal(size=(4, 8)).astype(np.float32),
                                  "bias": np.ones(8, np.float32)}},
              "token_embed": {"embedding": rng.normal(size=(16, 4)).astype(np.float32)}}
    grads = jax.tree.map(lambda p: rng.normal(size=p.shape).astype(np.float32) * 0.1, params)
    assert muon_labels(muon_config().muon_params)(params) == {
        "block_0": {"mlp": {"kernel": "muon", "bias": "adamw"}}, "token_embed": {"embedding": "adamw"}}
    optimizer = make_optimizer(muon_config())
    updates, _ = jax.jit(optimizer.update)(grads, optimizer.init(params), params)

    beta, g = 0.95, grads["block_0"]["mlp"]["kernel"]
    nesterov = beta * g / (1 + beta) + g  # beta * m_hat + (1 - beta) * g_hat at the first step, m = (1 - beta) g
    expected = -0.02 * np.sqrt(8 / 4) * numpy_orthogonalised(nesterov)  # lr x sqrt(fan_out / fan_in)
    np.testing.assert_allclose(updates["block_0"]["mlp"]["kernel"], expected, rtol=2e-4, atol=1e-6)
    g = grads["token_embed"]["embedding"]  # Adam's first step: g / (|g| + eps)
    np.testing.assert_allclose(updates["token_embed"]["embedding"], -1e-3 * g / (np.abs(g) + 1e-8), rtol=1e-4)
    # The train step logs both groups' rates: those these updates were scaled by.
    rates = logged_learning_rates(muon_config())
    assert list(rates) == ["learning_rate", "muon_learning_rate"]
    np.testing.assert_allclose([rates["learning_rate"](0), rates["muon_learning_rate"](0)], [1e-3, 0.02], rtol=1e-6)
    assert list(logged_learning_rates(optimizer_options(name="adamw", warmup_steps=0, decay_steps=10))) == [
        "learning_rate"]


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_weight_decay_falls_on_matrices_and_embeddings_alone_for_every_optimizer(name):
    params = {"block_0": {"mlp": {"kernel": np.full((4, 8), 2.0, np.float32), "bias": np.ones(8, np.float32)},
                          "norm": {"scale": np.ones(4, np.float32)}},
              "token_embed": {"embedding": np.full((16, 4), 3.0, np.float32)}}
    config = optimizer_options(name=name, learning_rate=0.1, muon_learning_rate=0.5, weight_decay=0.2,
                               warmup_steps=0, decay_steps=10)
    optimizer = make_optimizer(config)
    zero = jax.tree.map(np.zeros_like, params)  # no gradient: what moves is the decay alone
    updates, _ = jax.jit(optimizer.update)(zero, optimizer.init(params), params)
    rate = {"kernel": 0.5 if name == "muon" else 0.1, "embedding": 0.1}  # Muon's matrices at its own rate
    flat_params = traverse_util.flatten_dict(params)
    for path, update in traverse_util.flatten_dict(updates).items():
        param = flat_params[path]
        np.testing.assert_allclose(update, -rate[path[-1]] * 0.2 * param if path[-1] in rate else 0 * param,
                                   rtol=1e-6, err_msg=str(path))


def test_unknown_names_and_a_muon_split_matching_nothing_are_one_line_errors(test_config):
    with pytest.raises(UserError, match=r"optimizer.name='adam': use one of \('adamw', 'muon', 'adafactor', "
                                        r"'lion', 'sgd'\)"):
        resolve_config("configs/gpt_shakespeare.py:test", {"optimizer.name": "adam"})
    with pytest.raises(UserError, match=r"optimizer.schedule='step': use one of \('cosine', 'wsd', 'linear', "
                                        r"'constant'\)"):
        resolve_config("configs/gpt_shakespeare.py:test", {"optimizer.schedule": "step"})
    with pytest.raises(UserError, match="optimizer.decay_shape='sqrt': use one of"):
        resolve_config("configs/gpt_shakespeare.py:test", {"optimizer.decay_shape": "sqrt"})
    with pytest.raises(UserError, match=r"optimizer.muon_params='\(' is no regular expression"):
        make_optimizer(muon_config(muon_params="("))
    test_config.optimizer.update(name="muon", muon_params="attn_qkv")
    setup = build(test_config, build_experiment, jax.devices()[:1])
    with pytest.raises(UserError) as error:
        setup.abstract_state()  # (the trainer's first step with the model's parameters: before anything is written)
    assert str(error.value) == (
        "optimizer.muon_params='attn_qkv' matches no matrix of this model's parameters (paths such as "
        "'decoder/block_0/attention/key/bias'): pass a regular expression that finds its matrices")


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_optimizer_state_is_sharded_like_the_parameters(name, data_dir, test_config):
    """On a data 2 x fsdp 2 x tensor 2 mesh, every moment shaped like the MLP kernel carries its sharding
    (Adafactor's factored row and column statistics are replicated vectors)."""
    test_config.optimizer.name = name
    test_config.mesh.update(data=2, fsdp=2, tensor=2)
    shapes, shardings = build(test_config, build_experiment, jax.devices()).abstract_state()
    kernel = shardings.params["decoder"]["block_0"]["mlp"]["up"]["kernel"]
    kernel_shape = shapes.params["decoder"]["block_0"]["mlp"]["up"]["kernel"].shape
    moments = [s for s, x in zip(jax.tree.leaves(shardings.opt_state), jax.tree.leaves(shapes.opt_state), strict=True)
               if x.shape == kernel_shape]
    assert moments and all(s.spec == kernel.spec != P() for s in moments), (name, moments)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_checkpointed_optimizer_state_resumes_exactly(name, tmp_path):
    """3 steps, a checkpoint restored into the abstract state, 3 more: bit for bit the 6 steps straight."""
    rng = np.random.default_rng(0)
    params = {"block_0": {"mlp": {"kernel": rng.normal(size=(4, 8)).astype(np.float32),
                                  "bias": np.zeros(8, np.float32)}},
              "token_embed": {"embedding": rng.normal(size=(16, 4)).astype(np.float32)}}
    data = [rng.integers(0, 16, size=(5,)) for _ in range(6)]

    def loss_fn(p, ids, step_rng, is_training):  # (loss, metrics): a one-layer model of the next id
        h = jnp.tanh(p["token_embed"]["embedding"][ids] @ p["block_0"]["mlp"]["kernel"] + p["block_0"]["mlp"]["bias"])
        return jnp.mean(h**2) + 0.1 * jnp.mean(jax.random.normal(step_rng, h.shape) * h), {}

    config = optimizer_options(name=name, learning_rate=1e-2, weight_decay=0.1, warmup_steps=2, decay_steps=6)
    optimizer = make_optimizer(config)
    step = jax.jit(make_multi_step(make_train_step(loss_fn, optimizer, logged_learning_rates(config), 1, 0)))
    straight = resumed = TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))
    for ids in data:
        straight, _ = step(straight, (ids,))
    for ids in data[:3]:
        resumed, _ = step(resumed, (ids,))
    with Checkpointer(str(tmp_path / "checkpoints"), 1) as checkpointer:
        checkpointer.save(3, resumed)
    with Checkpointer(str(tmp_path / "checkpoints"), 1) as checkpointer:
        restored_step, resumed = checkpointer.restore_latest(jax.eval_shape(lambda: resumed), fallback=False)
    assert restored_step == 3
    for ids in data[3:]:
        resumed, _ = step(resumed, (ids,))
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(straight), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_a_wsd_run_given_more_steps_goes_on_from_its_last_stable_step_as_one_run_would(tmp_path, data_dir,
                                                                                          test_config, capsys):
    """10 steps of WSD (stable to step 8), then 20 in the same folder: it resumes from the kept step-8 checkpoint
    (removing step 10's, trained on the old decay), at the 20-step schedule's learning rates from there on."""
    def logged(workdir):
        records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: (r["loss"], r["learning_rate"]) for r in records if "loss" in r}

    test_config.optimizer.update(schedule="wsd", warmup_steps=2)
    test_config.train.update(num_steps=10, log_every=1, checkpoint_every=5, keep_checkpoints=1)
    test_config.eval.every = 100
    device = jax.devices()[:1]
    extended = tmp_path / "extended"
    train(test_config, str(extended), build_experiment, devices=device)
    assert sorted(int(p.name) for p in (extended / "checkpoints").iterdir() if p.name.isdigit()) == [8, 10]
    first = logged(extended)
    test_config.train.num_steps = 20
    capsys.readouterr()
    train(test_config, str(extended), build_experiment, devices=device)
    out = capsys.readouterr().out
    assert "resumed from step 8" in out and "removed the checkpoints after it (steps 10): the decay moved to step 20" \
        in out
    again = logged(extended)
    assert {step: again[step] for step in range(1, 9)} == {step: first[step] for step in range(1, 9)}
    schedule = learning_rate_schedule(resolve_schedule(test_config).optimizer)  # 20 steps: stable to step 16
    assert [rate for _, rate in again.values()] == pytest.approx([float(schedule(s - 1)) for s in again])
    assert again[16][1] == pytest.approx(test_config.optimizer.learning_rate)
    assert again[18][1] < again[17][1] == again[16][1]

    (extended / "checkpoints" / "16").rename(extended / "elsewhere")  # its last stable checkpoint gone
    test_config.train.num_steps = 30
    with pytest.raises(UserError, match=r"holds no checkpoint from before its WSD decay \(step 16 or earlier\) to "
                                        r"train on with the decay at step 30: resume with "
                                        r"--config.optimizer.decay_steps=20"):
        train(test_config, str(extended), build_experiment, devices=device)
