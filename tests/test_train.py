"""The trainer end to end on the real Tiny Shakespeare data, with the `test` config."""

import functools
import json
import types

import jax
import numpy as np
import pytest

from lm import progress
from lm.cli.resolve import build_experiment
from lm.train.compiled import CompiledPerShape
from lm.train.flops import peak_flops_per_device
from lm.train.loop import finished_line, train
from lm.train.setup import restore_params


def logged(workdir, key="loss"):
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[key] for r in records if key in r}


@pytest.mark.slow
def test_loss_falls_on_real_data(trained_run):
    _, workdir, summary = trained_run
    eval_loss = logged(workdir, "eval_loss")
    assert eval_loss[0] == pytest.approx(np.log(65), abs=0.15)  # uniform over 65 characters at init
    assert summary["eval_loss"] < eval_loss[0] - 0.6, eval_loss
    for name in ["config.json", "tokenizer.json", "samples.txt", "summary.json", "results.json"]:
        assert (workdir / name).is_file(), name
    results = json.loads((workdir / "results.json").read_text())  # no test split; no 2x context (learned)
    assert results == {"step": 40, "val_cross_entropy_ctx16": pytest.approx(summary["eval_cross_entropy"])}
    assert json.loads((workdir / "summary.json").read_text()) == summary
    assert 0 < summary["compile_seconds"] < summary["train_seconds"]
    assert list((workdir / "tensorboard").glob("events.out.tfevents.*"))
    record = json.loads((workdir / "metrics.jsonl").read_text().splitlines()[1])
    assert {"loss", "learning_rate", "grad_norm", "tokens_per_second"} <= set(record)
    assert "train_tokens_per_second" not in record  # (an online experiment's: time spent making batches left out)


def test_the_result_line_gives_the_eval_loss_the_held_out_results_and_the_files(tmp_path, monkeypatch):
    (tmp_path / "results.json").write_text('{"step": 40, "test_bleu": 36.41}')
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / ".lock.0").touch()  # hidden: not an output
    assert finished_line({"step": 40, "eval_loss": 1.88181}, tmp_path) == \
        f"done: eval loss 1.8818 at step 40 | test_bleu 36.41; outputs in {tmp_path} (checkpoints/, results.json)"
    monkeypatch.chdir(tmp_path.parent)  # a folder under the working one is named relative to it
    assert finished_line({"step": 40}, tmp_path) == \
        f"done: step 40 | test_bleu 36.41; outputs in {tmp_path.name} (checkpoints/, results.json)"


def test_mfu_only_against_a_data_sheet_or_a_given_peak(trained_run, tmp_path, data_dir, test_config, capsys):
    """A CPU's peak is not known: its runs (the shared trained one) log no MFU (not a figure over a measured
    matmul); train.peak_flops gives one."""
    assert peak_flops_per_device(types.SimpleNamespace(device_kind="cpu")) is None
    assert peak_flops_per_device(types.SimpleNamespace(device_kind="NVIDIA H100 80GB HBM3")) == 989e12
    assert logged(trained_run[1], "mfu") == {} and "mfu" not in trained_run[2]
    test_config.train.update(num_steps=2, log_every=1, peak_flops=1e12)
    train(test_config, str(tmp_path / "given"), build_experiment, devices=jax.devices()[:1])
    assert "MFU" in capsys.readouterr().out and logged(tmp_path / "given", "mfu").keys() == {1, 2}


@pytest.mark.slow
def test_a_run_prints_its_first_step_at_once_and_the_progress_of_long_eval_passes(tmp_path, data_dir, test_config,
                                                                                 capsys, monkeypatch):
    """log_every=4: a slow model's first line comes after its first step (also when it resumes), not 4
    steps later, without an ETA (one step tells no pace); the log files keep their records every log_every steps
    (and at the end). An eval pass (of 2 batches) longer than lm.progress.PROGRESS_SECONDS (0 s here) prints
    where it is. The last line is the result: the eval loss at the last step and the run's files."""
    lines = []

    def printed() -> tuple[list[int], list[str]]:
        lines[:] = capsys.readouterr().out.splitlines()
        return ([int(line.split()[1]) for line in lines if line.startswith("step") and "| loss " in line],
                [line.split(" | ")[0] for line in lines if " pass: " in line])

    monkeypatch.setattr(progress, "PROGRESS_SECONDS", 0.0)
    test_config.train.update(num_steps=6, log_every=4, checkpoint_every=6)
    test_config.optimizer.decay_steps = 8
    summary = train(test_config, str(tmp_path), build_experiment, devices=jax.devices()[:1])
    steps, passes = printed()
    assert steps == [1, 4, 6]
    assert passes == ["eval pass: 1 of 2"] * 2  # at steps 0 and 6
    assert ["ETA" in line for line in lines if "| loss " in line] == [False, True, True]
    assert lines[-1] == (f"done: eval loss {summary['eval_loss']:.4f} at step 6; outputs in {tmp_path} (checkpoints/, "
                         "config.json, data_cache/, metrics.jsonl, results.json, samples.txt, summary.json, "
                         "tensorboard/, tokenizer.json)")
    test_config.train.num_steps = 8
    train(test_config, str(tmp_path), build_experiment, devices=jax.devices()[:1])
    assert printed()[0] == [7, 8]
    assert sorted(logged(tmp_path)) == [4, 6, 8]


@pytest.mark.slow
def test_sharded_8_device_mesh_matches_one_device(tmp_path, data_dir, test_config):
    assert jax.device_count() == 8
    test_config.train.num_steps = 10
    test_config.train.log_every = 1
    test_config.model.dropout = 0.1  # dropout masks must not depend on the layout either
    train(test_config, str(tmp_path / "one"), build_experiment, devices=jax.devices()[:1])
    test_config.mesh.update(data=2, fsdp=2, tensor=2)
    train(test_config, str(tmp_path / "mesh"), build_experiment, devices=jax.devices())
    one, mesh = logged(tmp_path / "one"), logged(tmp_path / "mesh")
    assert one.keys() == mesh.keys()
    np.testing.assert_allclose([mesh[s] for s in mesh], [one[s] for s in one], rtol=2e-5)


@pytest.mark.slow
def test_gradient_accumulation_matches_the_full_batch(tmp_path, data_dir, test_config):
    test_config.train.num_steps = 5
    test_config.train.log_every = 1
    train(test_config, str(tmp_path / "full"), build_experiment, devices=jax.devices()[:1])
    test_config.train.grad_accum_steps = 4
    train(test_config, str(tmp_path / "accum"), build_experiment, devices=jax.devices()[:1])
    full, accum = logged(tmp_path / "full"), logged(tmp_path / "accum")
    np.testing.assert_allclose(list(accum.values()), list(full.values()), rtol=1e-5)


@pytest.mark.slow
def test_mixture_of_experts_trains_sharded_over_experts_and_logs_routing(tmp_path, data_dir, test_config):
    """The trainer on a data 2 x expert 4 mesh: parameter counts and routing metrics. (That the sharded
    layer computes what one device does: tests/test_moe.py.)"""
    test_config.model.moe.update(num_experts=4, every=1, top_k=2, capacity_factor=1.0)
    test_config.train.update(num_steps=4, log_every=1)
    test_config.mesh.update(data=2, expert=4)
    summary = train(test_config, str(tmp_path), build_experiment, devices=jax.devices())
    # Two MoE blocks of 4 experts, 2 active per token: 2 x 2 idle experts, each a 32 -> 128 -> 32 MLP.
    expert_size = (32 * 128 + 128) + (128 * 32 + 32)
    assert summary["num_params"] - summary["active_params"] == 2 * 2 * expert_size
    losses = logged(tmp_path)
    assert sorted(losses) == [1, 2, 3, 4] and losses[4] < losses[1]
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[1])
    fractions = [record[f"moe_expert_{e}_fraction"] for e in range(4)]
    assert sum(fractions) == pytest.approx(1.0, abs=1e-5)
    assert 0 < record["moe_dropped_fraction"] < 0.5  # capacity factor 1: some tokens overflow
    assert record["loss"] > record["cross_entropy"]  # the auxiliary losses are in the objective


def test_the_train_step_compiles_once_per_batch_shape():
    step = CompiledPerShape(jax.jit(lambda state, batch: (state + batch["x"].sum(), {})))
    state = jax.numpy.zeros(())
    for length in [3, 5, 3, 5, 3]:  # e.g. length-bucketed batches
        state, _ = step(state, {"x": np.ones((2, length), np.float32)})
    assert len(step.compiled) == 2 and step.seconds > 0
    assert float(state) == 2 * (3 + 5 + 3 + 5 + 3)


@pytest.mark.slow
def test_val_loss_at_a_longer_context_scores_windows_of_that_length(data_dir, test_config):
    """eval.context_lengths: RoPE and ALiBi models are scored on windows twice the training length
    (the per-token cross-entropy of the model on exactly those windows); learned positions are left out."""
    from experiments.language_model import build

    test_config.eval.context_lengths = (32,)
    for position in ("rope", "alibi", "learned"):
        test_config.model.position = position
        experiment = build(test_config)
        params = experiment.init(jax.random.key(0))["params"]
        seen, jitted = [], jax.jit(functools.partial(experiment.loss, train=False))

        def evaluate(batches, loss=jitted, params=params, seen=seen):
            seen.extend(b["inputs"].shape for b in batches)
            losses = [loss(params, b, jax.random.key(0))[1]["cross_entropy"] for b in batches]
            return {"cross_entropy": float(np.mean(losses))}

        results = experiment.final_results(params, evaluate, workdir=None)
        if position == "learned":
            assert results == {} and seen == []
            continue
        assert seen == [(8, 32)] * 2  # eval.batch_size x 32, eval.num_batches of them
        assert results["val_cross_entropy_ctx32"] == pytest.approx(np.log(65), abs=0.2)  # untrained: ~uniform


def test_a_nonfinite_step_leaves_the_weights_and_optimizer_state_alone():
    import jax.numpy as jnp
    import optax

    from lm.train.state import TrainState
    from lm.train.step import make_train_step

    def loss_fn(params, batch, rng, train):
        loss = jnp.sum((params["w"] - batch["x"]) ** 2) * batch["scale"]
        return loss, {}

    optimizer = optax.adam(0.1)
    params = {"w": jnp.ones(3)}
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params))
    step = jax.jit(make_train_step(loss_fn, optimizer, {"learning_rate": optax.constant_schedule(0.1)}, 1, seed=0))
    for scale in (np.nan, np.inf):
        after, metrics = step(state, {"x": jnp.zeros(3), "scale": jnp.float32(scale)})
        assert metrics["nonfinite"] == 1 and int(after.step) == 1
        for a, b in zip(jax.tree.leaves((after.params, after.opt_state)), jax.tree.leaves((params, state.opt_state)),
                        strict=True):
            np.testing.assert_array_equal(a, b)
    after, metrics = step(state, {"x": jnp.zeros(3), "scale": jnp.float32(1.0)})
    assert metrics["nonfinite"] == 0 and not np.allclose(after.params["w"], 1.0)


@pytest.mark.slow
def test_diverging_run_stops_with_a_message_or_skips_and_never_saves_nonfinite(tmp_path, data_dir, test_config):
    """A learning rate of 1e4 sends the loss to ~1e9 at step 2 and to NaN/Inf from step 3 or 4 on
    (which one depends on XLA's float optimisations)."""
    from lm.errors import UserError

    test_config.optimizer.update(learning_rate=1e4, warmup_steps=0)
    test_config.train.update(num_steps=8, checkpoint_every=2, log_every=4)
    device = jax.devices()[:1]
    with pytest.raises(UserError, match=r"NaN/Inf at step [34] .*the checkpoint at step 2 is the newest whose") as stop:
        train(test_config, str(tmp_path / "stop"), build_experiment, devices=device)
    first_nonfinite = int(str(stop.value).split("NaN/Inf at step ")[1].split()[0])
    assert sorted(p.name for p in (tmp_path / "stop" / "checkpoints").iterdir() if p.name.isdigit()) == ["2"]

    test_config.train.on_nonfinite = "skip"
    summary = train(test_config, str(tmp_path / "skip"), build_experiment, devices=device)
    assert summary["skipped_steps"] == 9 - first_nonfinite and summary["step"] == 8
    params = restore_params(test_config, build_experiment(test_config), tmp_path / "skip")
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(params))
    assert logged(tmp_path / "skip", "nonfinite") == {4: (5 - first_nonfinite) / 4, 8: 1.0}


@pytest.mark.slow
def test_ctrl_c_finishes_the_step_saves_and_the_rerun_resumes_exactly(tmp_path, data_dir, test_config):
    import os
    import signal
    import threading
    import time

    from lm.train.loop import Stopped

    test_config.train.update(num_steps=100_000, log_every=1, checkpoint_every=100_000)
    test_config.optimizer.decay_steps = 20  # one schedule for the interrupted run and the straight one below
    test_config.eval.every = 100_000
    workdir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    # The interrupted run keeps its checkpoints outside its workdir (a bucket or Drive, say), and loads each
    # batch in the loop (prefetch 0) where its rerun and the straight run load them ahead: the same batches.
    test_config.train.update(checkpoint_dir=str(elsewhere), prefetch=0)
    handler_before = signal.getsignal(signal.SIGINT)  # pytest's, or SIG_IGN in a background job

    def interrupt_after_step_5():
        while not (workdir / "metrics.jsonl").is_file() or len(logged(workdir)) < 5:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_after_step_5, daemon=True).start()
    with pytest.raises(Stopped, match="SIGINT: saved a checkpoint at step") as stopped:
        train(test_config, str(workdir), build_experiment, devices=jax.devices()[:1])
    saved = stopped.value.step
    assert saved >= 5 and [int(p.name) for p in elsewhere.iterdir() if p.name.isdigit()] == [saved]
    assert signal.getsignal(signal.SIGINT) is handler_before  # pytest's Ctrl-C works again

    test_config.train.update(num_steps=saved + 3, prefetch=2)
    train(test_config, str(workdir), build_experiment, devices=jax.devices()[:1])
    assert not (workdir / "checkpoints").exists()
    interrupted = test_config.copy_and_resolve_references()
    straight = tmp_path / "straight"
    test_config.train.checkpoint_dir = ""
    train(test_config, str(straight), build_experiment, devices=jax.devices()[:1])
    assert logged(workdir) == logged(straight)  # the same batches, dropout keys and updates
    for a, b in zip(jax.tree.leaves(restore_params(interrupted, build_experiment(test_config), workdir)),
                    jax.tree.leaves(restore_params(test_config, build_experiment(test_config), straight)), strict=True):
        np.testing.assert_array_equal(a, b)
