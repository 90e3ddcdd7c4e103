"""init_from: a run starts from another run's parameters, by name, in either layer layout."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lm.cli.resolve import build_experiment
from lm.errors import UserError
from lm.layers.transformer import SCANNED_NAME, stack_layers, unstack_layers
from lm.train import init_from
from lm.train.loop import train


class DictSource:
    """A ParamSource over arrays in memory (how a non-Orbax source plugs in)."""

    description = "the test's dict"

    def __init__(self, params: dict):
        self.params = params

    def abstract_params(self) -> dict:
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), self.params)

    def load_params(self, shardings: dict) -> dict:
        return jax.tree.map(jax.device_put, self.params, shardings)


def random_tree(shapes: dict, seed: int) -> dict:
    leaves, structure = jax.tree.flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(structure, [jax.random.normal(k, shape) for k, shape in zip(keys, leaves, strict=True)])


def load(source_params: dict, fresh: dict, renames=()) -> tuple[dict, init_from.InitFrom]:
    """source_params loaded into fresh (on an 8-device mesh, fresh's arrays split along their first axis
    where it divides); returns the params and the plan."""
    mesh = Mesh(np.array(jax.devices()), ("devices",))
    shardings = jax.tree.map(
        lambda x: NamedSharding(mesh, PartitionSpec("devices") if x.shape and x.shape[0] % 8 == 0 else PartitionSpec()),
        fresh)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), fresh)
    plan = init_from.plan(DictSource(source_params), list(renames), abstract)
    params = plan.load(jax.tree.map(jnp.copy, fresh), shardings, mesh)
    assert jax.tree.map(lambda x: x.sharding, params) == shardings
    return params, plan


def unrolled_moe_stack(num_layers: int) -> dict:
    """Shapes of a stack with an MoE MLP in every second block (block_1, block_3, ...)."""
    blocks = {f"block_{i}": {"attention": {"kernel": (8, 3)}, "moe" if i % 2 else "mlp": {"kernel": (3, 5 + i % 2)}}
              for i in range(num_layers)}
    return {**blocks, "norm_final": {"scale": (3,)}}


def test_stack_layers_groups_moe_blocks_and_unstack_layers_inverts_it():
    stack = random_tree(unrolled_moe_stack(6), seed=0)
    scanned = stack_layers(stack, layer_period=2)
    assert sorted(scanned) == [SCANNED_NAME, "norm_final"] and sorted(scanned[SCANNED_NAME]) == ["block_0", "block_1"]
    for layer in range(6):  # scan index s of block_<j> is layer 2 s + j
        group = scanned[SCANNED_NAME][f"block_{layer % 2}"]["attention"]["kernel"]
        np.testing.assert_array_equal(group[layer // 2], stack[f"block_{layer}"]["attention"]["kernel"])
    unstacked = unstack_layers(scanned)
    assert jax.tree.structure(unstacked) == jax.tree.structure(stack)
    jax.tree.map(np.testing.assert_array_equal, unstacked, stack)
    with pytest.raises(ValueError, match="hold different parameters"):
        stack_layers(stack, layer_period=1)  # dense and MoE blocks do not stack together
    with pytest.raises(ValueError, match="6 layers do not split"):
        stack_layers(stack, layer_period=4)


@pytest.mark.parametrize("direction", ["unrolled_to_scanned", "scanned_to_unrolled"])
def test_layers_convert_to_this_models_layout(direction, capsys):
    """Source and target differ only in the layer layout (MoE groups of 2): every parameter is loaded,
    layer i of the unrolled side being scan index i // 2 of the scanned side's block_<i % 2>."""
    unrolled = random_tree({"decoder": unrolled_moe_stack(4), "embed": (16, 3)}, seed=1)
    scanned = {"decoder": stack_layers(unrolled["decoder"], 2), "embed": unrolled["embed"]}
    source, target = (unrolled, scanned) if direction == "unrolled_to_scanned" else (scanned, unrolled)
    fresh = jax.tree.map(jnp.zeros_like, target)
    params, plan = load(source, fresh)
    assert plan.initialised == plan.dropped == [] and len(plan.loaded) == len(jax.tree.leaves(target))
    if direction == "unrolled_to_scanned":
        stacks, layers = params["decoder"][SCANNED_NAME], unrolled["decoder"]
    else:
        stacks, layers = scanned["decoder"][SCANNED_NAME], params["decoder"]
    for i in range(4):
        kind = "moe" if i % 2 else "mlp"
        for name in ("attention", kind):
            np.testing.assert_array_equal(stacks[f"block_{i % 2}"][name]["kernel"][i // 2],
                                          layers[f"block_{i}"][name]["kernel"])
    np.testing.assert_array_equal(params["embed"], unrolled["embed"])
    np.testing.assert_array_equal(params["decoder"]["norm_final"]["scale"], unrolled["decoder"]["norm_final"]["scale"])
    assert "loaded" in capsys.readouterr().out


def test_a_source_stack_that_does_not_fit_the_scanned_groups_is_a_user_error():
    source = random_tree({"decoder": unrolled_moe_stack(3)}, seed=2)
    target = {"decoder": stack_layers(random_tree(unrolled_moe_stack(4), seed=3), 2)}
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), target)
    with pytest.raises(UserError, match="the 3 layers of the source's decoder do not stack into this model's scanned "
                                        "groups of 2 blocks"):
        init_from.plan(DictSource(source), [], abstract)


def test_renamed_subtrees_load_new_ones_stay_fresh_and_the_rest_is_dropped(capsys):
    """'encoder:bert/encoder': the source's encoder becomes this model's bert/encoder; this model's
    classifier (not in the source) keeps its initialisation; the source's pretraining head is dropped."""
    source = random_tree({"encoder": {"block_0": {"kernel": (8, 4)}, "norm_final": {"scale": (4,)}},
                          "head": {"kernel": (4, 30)}}, seed=4)
    fresh = random_tree({"bert": {"encoder": {"block_0": {"kernel": (8, 4)}, "norm_final": {"scale": (4,)}}},
                         "classifier": {"kernel": (4, 2), "bias": (2,)}}, seed=5)
    params, plan = load(source, fresh, init_from.parse_renames("encoder:bert/encoder"))
    jax.tree.map(np.testing.assert_array_equal, params["bert"]["encoder"], source["encoder"])
    jax.tree.map(np.testing.assert_array_equal, params["classifier"], fresh["classifier"])
    assert plan.loaded == ["bert/encoder/block_0/kernel", "bert/encoder/norm_final/scale"]
    assert plan.dropped == ["head/kernel"]
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "init_from the test's dict:"
    assert out[1:] == ["  loaded         2 arrays,          36 parameters: bert (2)",
                       "  initialised    2 arrays,          10 parameters: classifier (2)",
                       "  dropped        1 arrays,         120 parameters: head (1)"]
    # An empty right side leaves a source subtree out: the longest matching prefix wins.
    _, plan = load(source, fresh, init_from.parse_renames("encoder:bert/encoder,encoder/norm_final:"))
    assert plan.loaded == ["bert/encoder/block_0/kernel"]


@pytest.mark.parametrize("rename, message", [
    ("encoder", "write source_subtree:this_subtree pairs"),
    ("decoder:bert", "'decoder' names nothing in the test's dict, whose top-level subtrees are encoder"),
])
def test_bad_renames_are_user_errors(rename, message):
    source = {"encoder": {"kernel": jnp.ones((2, 2))}}
    with pytest.raises(UserError, match=message):
        init_from.plan(DictSource(source), init_from.parse_renames(rename),
                       {"kernel": jax.ShapeDtypeStruct((2, 2), jnp.float32)})


def metrics(workdir) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scanned"])
def test_a_run_starts_from_another_runs_parameters(trained_run, tmp_path, test_config, scan_layers, capsys):
    """The trained run's parameters, loaded into a new run (its stacked layout too), give its final
    eval loss at step 0; a rerun resumes from its own checkpoint and ignores init_from."""
    _, source, source_summary = trained_run
    test_config.init_from = str(source)
    test_config.train.update(num_steps=1, checkpoint_every=1)
    test_config.eval.every = 100
    test_config.model.scan_layers = scan_layers
    workdir = tmp_path / "finetune"
    train(test_config, str(workdir), build_experiment, devices=jax.devices()[:1])
    assert metrics(workdir)[0]["step"] == 0
    assert metrics(workdir)[0]["eval_loss"] == pytest.approx(source_summary["eval_loss"], rel=1e-6)
    out = capsys.readouterr().out
    arrays = 20 if scan_layers else 36  # 2 layers of 17 arrays, or each of them stacked
    assert f"init_from {source}/checkpoints step 40:\n  loaded        {arrays} arrays,      30,080 parameters: " \
           f"decoder ({arrays - 2}), position_embed (1), token_embed (1)\n" in out
    test_config.init_from = str(tmp_path / "gone")  # it no longer matters
    assert train(test_config, str(workdir), build_experiment, devices=jax.devices()[:1]) == {"step": 1}
    assert "init_from ignored: resuming from this run's own checkpoint at step 1" in capsys.readouterr().out


def test_a_head_of_another_shape_or_a_missing_source_stops_before_anything_is_written(trained_run, tmp_path,
                                                                                     test_config):
    """The error names the model fields in which the source run's config.json differs, with both values
    and the flags that match it; a source without one (nothing to compare) gets the parameter's shapes."""
    _, source, _ = trained_run
    workdir = tmp_path / "run"
    test_config.init_from = str(source)
    test_config.model.vocab_multiple = 256  # the (tied) embedding: 256 rows, not 128
    with pytest.raises(UserError, match=rf"^init_from={source} holds a model with model.vocab_multiple=64 \(its "
                                        r"config.json\), this config has model.vocab_multiple=256: run with "
                                        r"--config.model.vocab_multiple=64, or give init_from a run of this model$"):
        train(test_config, str(workdir), build_experiment, devices=jax.devices()[:1])
    abstract = jax.eval_shape(lambda: {"token_embed": {"embedding": jnp.zeros((256, 32))}})
    source_params = {"token_embed": {"embedding": jnp.zeros((128, 32))}}
    with pytest.raises(UserError, match=r"init_from: token_embed/embedding is \(128, 32\) in the test's dict but "
                                        r"\(256, 32\) in this model; .*init_from_rename='SUBTREE:'"):
        init_from.plan(DictSource(source_params), [], abstract)
    # With the source's embedding left out there is no error: this model's stays fresh.
    plan = init_from.prepare(str(source), "token_embed:", abstract, None, test_config)
    assert plan.initialised == ["token_embed/embedding"]
    test_config.init_from = str(tmp_path / "nowhere")
    with pytest.raises(UserError, match=f"init_from={tmp_path}/nowhere not found: give a run folder written by "
                                        "lm train, its checkpoints folder, or one step's folder"):
        train(test_config, str(workdir), build_experiment, devices=jax.devices()[:1])
    assert not workdir.exists()  # nor an empty checkpoints folder in it


def test_a_checkpoint_or_step_folder_is_a_source_too(trained_run, test_config, monkeypatch):
    """Given as absolute paths, and relative to the working directory (as a user types them)."""
    _, source, _ = trained_run
    abstract = jax.eval_shape(lambda: {"token_embed": {"embedding": jnp.zeros((128, 32))}})
    monkeypatch.chdir(source.parent)
    for location, step in [(source / "checkpoints", 40), (source / "checkpoints" / "30", 30),
                           (f"{source.name}/checkpoints", 40), (f"{source.name}/checkpoints/30", 30)]:
        plan = init_from.prepare(str(location), "", abstract, None, test_config)
        assert plan.source.description == f"{source / 'checkpoints'} step {step}" and len(plan.dropped) == 35
        assert plan.source.run_config == json.loads((source / "config.json").read_text())  # the run's, above


def test_an_init_from_of_another_context_names_data_context_length_first(trained_run, tmp_path, test_config):
    """A LoRA run from a run trained at another context: the error names data.context_length (the learned position
    table's length), not the LoRA rank (the base model's parameters keep their shapes under LoRA)."""
    _, source, _ = trained_run
    test_config.init_from = str(source)
    test_config.data.context_length = 32  # the source's: 16
    test_config.model.lora.rank = 4
    with pytest.raises(UserError, match=rf"^init_from={source} holds a model with data.context_length=16 \(its "
                                        r"config.json\), this config has data.context_length=32: run with "
                                        r"--config.data.context_length=16, or give init_from a run of this model$"):
        train(test_config, str(tmp_path / "run"), build_experiment, devices=jax.devices()[:1])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("recipe", ["sft.py:small", "dpo.py:small", "gpt2.py:124m"])
def test_init_from_a_run_brings_its_tokenizer_and_context_length(recipe, tmp_path, capsys):
    """init_from=RUN: the run's tokenizer (its copy in the run folder; the vocabulary follows it) and context
    length, where the config leaves them at their defaults (configs/sft.py:small and dpo.py:small set neither);
    a value the config sets stays. Only the run's config.json and tokenizer.json are read here."""
    import importlib

    from lm.data.bpe import BPETokenizer
    from lm.runs import CONFIG_FILE

    hh = {"chosen": "\n\nHuman: Hi?\n\nAssistant: Hello there.", "rejected": "\n\nHuman: Hi?\n\nAssistant: No."}
    records = {"sft": {"question": "Name a colour.", "answer": "Blue."}, "dpo": hh, "gpt2": {"text": "Some text."}}
    name, variant = recipe.split(".py:")
    run = tmp_path / "run"
    run.mkdir()
    tokenizer = BPETokenizer.train(["Name a colour. Blue. Hi? Hello there. No. Some text."] * 20, 300)
    tokenizer.save(run / "tokenizer.json")
    (run / CONFIG_FILE).write_text(json.dumps({"data": {"tokenizer": "/gone/tokenizer.json", "context_length": 24}}))
    (tmp_path / "records.jsonl").write_text(json.dumps(records[name]) + "\n")
    config = importlib.import_module(f"configs.{name}").get_config(variant)
    config.data.update(source=f"files:{tmp_path}/records.jsonl", val_source=f"files:{tmp_path}/records.jsonl")
    config.init_from = str(run)
    build = importlib.import_module(f"experiments.{'language_model' if name == 'gpt2' else name}").build
    data = build(config).config.data
    assert (data.tokenizer, data.vocab_size, data.context_length) == (str(run / "tokenizer.json"),
                                                                      tokenizer.vocab_size, 24)
    assert f"init_from={run}: data.tokenizer={run}/tokenizer.json, data.context_length=24 (the run's" in \
        capsys.readouterr().out
    config.data.context_length = 20  # set: it stays
    assert build(config).config.data.context_length == 20
