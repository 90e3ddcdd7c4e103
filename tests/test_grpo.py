"""GRPO (experiments/grpo.py, configs/grpo.py): the prompts, the rows a rollout lays out, the checks that are one line,
and runs that train, resume exactly and learn from a reward."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from configs import grpo as grpo_config
from experiments import grpo
from lm import sharding
from lm.data.bpe import BPETokenizer
from lm.errors import UserError
from lm.sharding import MESH_AXES, make_mesh


def grpo_test_config():
    config = grpo_config.get_config("test")
    config.data.max_records = 64
    return config


def built_on_one_device(config, workdir=None):
    built = grpo.build(config, workdir)
    mesh = make_mesh({axis: 1 for axis in MESH_AXES}, jax.devices()[:1])
    params = jax.jit(lambda rng: nn.unbox(built.init(rng)["params"]))(jax.random.key(0))
    return built, mesh, jax.device_put(params, NamedSharding(mesh, PartitionSpec()))


def placed_prompts(built, mesh, step=0):
    rows = next(iter(built.train_data(built.config.train.batch_size, 0, (0, 1), step)))
    return sharding.place_batch(rows, mesh)


def test_a_completion_is_cut_after_its_first_stop_string_and_keeps_the_tokens_that_hold_it():
    tokenizer = BPETokenizer.bytes_only()
    ids = tokenizer.encode("12\nQuestion: 3")
    assert grpo.cut_at_stop(tokenizer, ids, ("\n",)) == ("12\n", 3)
    assert grpo.cut_at_stop(tokenizer, ids, ("Question", "\n")) == ("12\n", 3)  # the first in the text wins
    assert grpo.cut_at_stop(tokenizer, ids, ("zz",)) == ("12\nQuestion: 3", len(ids))
    assert grpo.cut_at_stop(tokenizer, ids, ()) == ("12\nQuestion: 3", len(ids))


def test_reward_metrics_are_the_means_and_the_std_within_groups():
    total = np.array([1.0, 0.0, 1.0, 1.0])
    metrics = grpo.reward_metrics(total, {"answer": total, "format": np.ones(4)}, group_size=2)
    assert metrics["reward"] == 0.75 and metrics["accuracy"] == 0.75
    assert metrics["reward_std"] == pytest.approx((0.5 + 0.0) / 2)  # group [1, 0]: std 0.5; group [1, 1]: 0
    assert metrics["reward_format"] == 1 and metrics["reward_format_std"] == 0
    assert grpo.completion_metrics(np.array([2, 8, 8, 4]), 8) == {
        "completion_length": 5.5, "completion_length_min": 2.0, "completion_length_max": 8.0, "truncated": 0.5}


@pytest.mark.parametrize("overrides, fragments", [
    ({"rl.inner_steps": 2}, ["train.steps_per_dispatch=1 must equal rl.inner_steps=2"]),
    ({"rl.inner_steps": 2, "train.steps_per_dispatch": 2, "train.log_every": 3}, ["train.log_every=3",
                                                                                  "multiple of rl.inner_steps=2"]),
    ({"rl.max_new_tokens": 40}, ["rl.max_new_tokens=40 leaves no room for a prompt in data.context_length=40"]),
    ({"data.context_length": 16}, ["synthetic:reverse", "record 0", "more than the 8 that data.context_length"]),
    ({"rl.rewards": "answer,nosuchmodule:f"}, ["rl.rewards", "nosuchmodule"]),
])
def test_a_config_grpo_cannot_run_is_one_line(overrides, fragments):
    config = grpo_test_config()
    for key, value in overrides.items():
        section, name = key.split(".")
        config[section][name] = value
    with pytest.raises(UserError) as raised:
        grpo.build(config)
    assert "\n" not in str(raised.value)
    for fragment in fragments:
        assert fragment in str(raised.value)


def test_a_group_of_one_completion_is_refused_by_the_options_check():
    from lm.layers.options import check_declared

    config = grpo_test_config()
    config.rl.group_size = 1
    with pytest.raises(UserError, match="rl.group_size"):
        check_declared(config)


def test_the_prompts_are_rendered_by_the_template_with_the_assistants_turn_open_and_keep_their_records():
    built = grpo.build(grpo_test_config())
    train, val = built.prompts["train"], built.prompts["val"]
    assert train.texts[0].startswith("Question: ") and train.texts[0].endswith("\nAnswer:")
    assert set(train.records[0]) == {"prompt", "answer"}
    assert train.texts[0] == f"Question: {train.records[0]['prompt']}\nAnswer:"
    row = train.ids[0, :train.lengths[0]]
    assert built.tokenizer.decode(row) == train.texts[0] and not train.ids[0, train.lengths[0]:].any()
    assert train.ids.shape[1] == val.ids.shape[1]  # one row width for both splits
    assert not set(train.where) & set(val.where)


def test_prompts_from_an_sft_run_use_its_chat_template_unless_one_is_set(tmp_path, capsys):
    run = tmp_path / "sft_run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"data": {"tokenizer": "bytes", "context_length": 40}}))
    (run / "chat_template.json").write_text(json.dumps({"name": "mine", "source": "{{ messages[0].content }} =",
                                                        "special_tokens": {}}))
    config = grpo_test_config()
    config.init_from = str(run)
    config.data.context_length = 64
    built = grpo.build(config)
    assert built.prompts["train"].texts[0] == built.prompts["train"].records[0]["prompt"] + " ="
    assert "its chat template (mine; set data.chat_template to override)" in capsys.readouterr().out
    config.data.chat_template = "chatml"
    assert grpo.build(config).prompts["train"].texts[0].startswith("<|im_start|>user\n")


def test_a_rollouts_prompts_stay_the_same_for_its_inner_steps():
    config = grpo_test_config()
    config.rl.inner_steps = config.train.steps_per_dispatch = 2
    built = grpo.build(config)
    batches = [next(iter(built.train_data(4, 0, (0, 1), step))) for step in range(4)]
    np.testing.assert_array_equal(batches[0]["record"], batches[1]["record"])
    np.testing.assert_array_equal(batches[2]["record"], batches[3]["record"])
    assert not np.array_equal(batches[0]["record"], batches[2]["record"])
    halves = [next(iter(built.train_data(2, 0, (index, 2), 2)))["record"] for index in (0, 1)]
    np.testing.assert_array_equal(np.concatenate(halves), batches[2]["record"])  # any number of processes


@pytest.mark.slow
def test_a_rollout_lays_out_scored_completions_as_the_train_steps_rows():
    """Rows: the prompt then the completion; weights on the completion's tokens alone; advantages normalised within
    each group of group_size; the shapes batch_variants promised; the same step samples the same completions, the
    next step others."""
    config = grpo_test_config()
    config.rl.update(kl_beta=0.1, inner_steps=2)
    config.train.update(steps_per_dispatch=2, log_every=2, checkpoint_every=2)
    config.eval.every = 2
    built, mesh, params = built_on_one_device(config)
    built.reference = params
    prompts = placed_prompts(built, mesh)
    rows, metrics = built.rollout(params, (prompts, prompts), step=0)
    assert len(rows) == 2 and rows[0] is rows[1]
    batch = jax.device_get(rows[0])
    variant = built.batch_variants(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                                               sharding=x.sharding), prompts))[0]
    assert {k: (v.shape, v.dtype) for k, v in variant.items()} == {k: (v.shape, v.dtype) for k, v in batch.items()}
    group = config.rl.group_size
    lengths = np.repeat(jax.device_get(prompts["prompt_length"]), group)
    for row, length in enumerate(lengths):
        weights = batch["weights"][row]
        assert not weights[:length - 1].any() and weights[length - 1] == 1  # the first completion token is a target
        np.testing.assert_array_equal(batch["inputs"][row, 1:], batch["targets"][row, :-1])
    sums = batch["advantages"].reshape(-1, group).sum(axis=1)
    np.testing.assert_allclose(sums, 0, atol=1e-5)
    np.testing.assert_allclose(batch["old_logprobs"], batch["ref_logprobs"], atol=1e-6)  # params == reference
    assert {"reward", "reward_std", "accuracy", "completion_length", "truncated", "sample_tokens_per_second",
            "rollout_seconds"} <= set(metrics)
    again, _ = built.rollout(params, (prompts, prompts), step=0)
    np.testing.assert_array_equal(jax.device_get(again[0]["targets"]), batch["targets"])
    other, _ = built.rollout(params, (prompts, prompts), step=2)
    assert not np.array_equal(jax.device_get(other[0]["targets"]), batch["targets"])


def metrics_records(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_grpo_run_with_kl_and_inner_steps_resumes_exactly(tmp_path):
    """Four steps straight, and two then two more resumed, give the same losses and parameters: the sampling key
    comes from (seed, step) and the reference from the run folder."""
    from lm.cli.resolve import build_experiment
    from lm.train.loop import train
    from lm.train.setup import restore_params

    config = grpo_test_config()
    config.rl.update(kl_beta=0.05, inner_steps=2)
    config.train.update(steps_per_dispatch=2, log_every=2, checkpoint_every=2)
    config.eval.every = 2
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(config, str(straight), build_experiment, jax.devices()[:1])
    assert (straight / grpo.REFERENCE_FILE).is_file()
    assert sorted(p.name for p in (straight / grpo.COMPLETIONS_DIR).iterdir()) == [
        "step_0.jsonl", "step_2.jsonl", "step_4.jsonl"]
    first = config.copy_and_resolve_references()
    first.train.num_steps = 2
    train(first, str(resumed), build_experiment, jax.devices()[:1])
    train(config, str(resumed), build_experiment, jax.devices()[:1])
    def trained(folder):  # step -> what the step logged of its rollout and updates
        keys = ("loss", "reward", "kl", "clip_ratio_region", "completion_length")
        return {r["step"]: [r[k] for k in keys] for r in metrics_records(folder) if "loss" in r}

    assert trained(straight) == trained(resumed) and sorted(trained(straight)) == [2, 4]
    logged = [r for r in metrics_records(straight) if "loss" in r]
    assert all(r["train_tokens_per_second"] > r["tokens_per_second"] > 0 for r in logged)  # rollouts left out
    built = grpo.build(config, straight)
    params = [restore_params(config, built, folder) for folder in (straight, resumed)]
    jax.tree.map(np.testing.assert_array_equal, *params)
    results = json.loads((straight / "results.json").read_text())
    assert {"val_accuracy", "val_reward", "val_completion_length"} <= set(results)
    assert (straight / "completions.jsonl").is_file()


@pytest.mark.slow
def test_grpo_with_lora_on_a_mesh_of_8_devices(tmp_path):
    """LoRA adapters train on a data x fsdp x tensor mesh; the base stays as it started."""
    from lm.cli.resolve import build_experiment
    from lm.train.loop import train

    config = grpo_test_config()
    config.model.lora.update(rank=4, targets=("query", "value"))
    config.mesh.update(data=2, fsdp=2, tensor=2)
    config.train.update(batch_size=4, num_steps=2, log_every=1, checkpoint_every=2)
    config.eval.every = 2
    summary = train(config, str(tmp_path / "run"), build_experiment, jax.devices())
    records = metrics_records(tmp_path / "run")
    assert all(np.isfinite(r["loss"]) for r in records if "loss" in r)
    assert summary["step"] == 2 and "heldout_accuracy" in summary


def reward_sevens(prompt, completion, record):
    """A reward the tests' runs learn: the share of a completion's characters that are '7'."""
    del prompt, record
    return completion.count("7") / max(1, len(completion))


@pytest.mark.slow
def test_grpo_raises_a_plugin_reward_it_can_learn(tmp_path):
    """From a fresh model (about 1/257 of its characters sevens), 30 steps of GRPO on a plug-in reward (the share of
    sevens) raise it to most of the completion."""
    from lm.cli.resolve import build_experiment
    from lm.train.loop import train

    config = grpo_test_config()
    config.rl.update(rewards="test_grpo:reward_sevens", group_size=8, max_new_tokens=6)
    config.optimizer.update(learning_rate=1e-2, min_learning_rate=1e-2)
    config.train.update(batch_size=4, num_steps=30, log_every=5, checkpoint_every=30)
    config.eval.every = 30
    train(config, str(tmp_path / "run"), build_experiment, jax.devices()[:1])
    rewards = [r["reward"] for r in metrics_records(tmp_path / "run") if "reward" in r]
    assert rewards[0] < 0.1 and rewards[-1] > 0.8, rewards
