"""LoRA (lm/layers/lora.py, lm/train/optim.py, lm/hf/peft.py): a fresh adapter changes nothing, the adapted
projection is W x + s B A x, only the adapters train (and hold optimizer state), merging changes no logit,
peft's own adapters (tests/fixtures/lora, made by make_fixtures.py with peft) give peft's logits in lm,
merged or not, and lm's export reads back exactly; bad targets are one line."""

import json
import pathlib
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding
from safetensors.numpy import load_file

from experiments.language_model import LanguageModel
from lm.cli.export import check_lora_flags
from lm.cli.overrides import resolve_config
from lm.data.text import CharTokenizer
from lm.errors import UserError
from lm.hf.export import unrolled
from lm.hf.peft import PeftSource, peft_adapters, write_adapters
from lm.hf.peft import merge as merge_into
from lm.hf.source import following
from lm.layers.linear import Linear
from lm.layers.lora import Adapter, LoraConfig, adapters_off, has_adapters, merged
from lm.layers.transformer import TransformerConfig
from lm.models.gpt import GPT, GPTConfig
from lm.train import init_from
from lm.train.checkpoint import FROZEN_DIR, Checkpointer
from lm.train.optim import make_optimizer, trainable_line
from lm.train.options import optimizer_options
from lm.train.state import TrainState
from lm.train.step import make_train_step

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
TOLERANCE = 1e-5


def tiny_gpt(rank: int) -> GPT:
    blocks = TransformerConfig(num_layers=2, num_heads=2, num_kv_heads=1, embed_dim=16, mlp="swiglu", scan_layers=True,
                               lora=LoraConfig(rank=rank, alpha=6.0))
    return GPT(GPTConfig(vocab_size=40, context_length=8, transformer=blocks, vocab_multiple=8))


TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 40, (2, 8)), jnp.int32)
ADAPTER = Adapter(rank=3, scale=2.5, dropout=0.0, train=False)


def with_random_b(params: dict, seed: int = 1, scale: float = 0.3) -> dict:
    """params with every lora_b drawn at random (a trained adapter)."""
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map_with_path(
        lambda path, p: rng.normal(0, scale, p.shape).astype(np.float32) if path[-1].key == "lora_b" else p, params)


def random_params(module: nn.Module, *inputs) -> dict:
    """module's parameters (unboxed) drawn at random, every lora_b zero (a fresh adapter), without compiling its
    init."""
    rng = np.random.default_rng(0)
    shapes = nn.unbox(jax.eval_shape(module.init, jax.random.key(0), *inputs)["params"])
    return jax.tree_util.tree_map_with_path(
        lambda path, s: np.zeros(s.shape, np.float32) if path[-1].key == "lora_b" else
        rng.normal(0, 0.2, s.shape).astype(np.float32), shapes)


def base_of(params: dict) -> dict:
    return traverse_util.unflatten_dict({path: value for path, value in traverse_util.flatten_dict(params).items()
                                         if path[-1] not in ("lora_a", "lora_b")})


@pytest.fixture(scope="module")
def tiny():
    """(params of a 2-layer GPT with rank-3 adapters on every projection: random, lora_b zero as initialised;
    its apply, jitted; the apply of the same GPT without adapters, jitted)."""
    adapted, plain = tiny_gpt(3), tiny_gpt(0)
    return random_params(adapted, TOKENS), jax.jit(adapted.apply), jax.jit(plain.apply)


X = np.random.default_rng(1).normal(size=(4, 5, 6)).astype(np.float32)


@pytest.fixture(scope="module")
def linear():
    """(an adapted Linear (6,) -> (2, 3), its initial parameters, boxed with their axis names)."""
    layer = Linear((6,), (2, 3), ("embed", "heads", "kv"), adapter=ADAPTER)
    return layer, jax.jit(layer.init)(jax.random.key(0), X)["params"]


def test_a_fresh_adapter_leaves_the_outputs_exactly_as_they_were(linear, tiny):
    _, boxed = linear
    assert not np.any(boxed["lora_b"].value) and np.any(boxed["lora_a"].value)
    assert np.abs(boxed["lora_a"].value).max() <= 1 / np.sqrt(6)  # torch's default Linear init, as peft's lora_A
    params, apply_adapted, apply_plain = tiny
    assert {path[-2] for path in traverse_util.flatten_dict(params) if path[-1] == "lora_a"} == {
        "query", "key", "value", "out", "gate", "up", "down"}
    np.testing.assert_array_equal(apply_adapted({"params": params}, TOKENS),
                                  apply_plain({"params": base_of(params)}, TOKENS))


def test_an_adapted_projection_is_w_x_plus_scaled_b_a_x_and_shards_like_its_weight(linear):
    layer, boxed = linear
    assert boxed["lora_a"].names == ("embed", None) and boxed["lora_b"].names == (None, "heads", "kv")
    params = with_random_b(nn.unbox(boxed))
    w, bias, a, b = (np.asarray(params[k], np.float64) for k in ("kernel", "bias", "lora_a", "lora_b"))
    x64 = X.astype(np.float64)
    expected = x64 @ w.reshape(6, 6) + bias.reshape(6) + 2.5 * (x64 @ a) @ b.reshape(3, 6)
    np.testing.assert_allclose(layer.apply({"params": params}, X).reshape(4, 5, 6), expected, atol=1e-5)


class AdaptedThenFrozen(nn.Module):
    """An adapted projection, a LayerNorm and a projection without adapter: (B, 6) -> (B, 3)."""

    @nn.compact
    def __call__(self, x):
        h = nn.LayerNorm()(jnp.tanh(Linear((6,), (4,), ("embed", "mlp"), adapter=ADAPTER, name="adapted")(x)))
        return Linear((4,), (3,), ("mlp", "embed"), name="plain")(h)


def test_only_the_adapters_train_and_hold_optimizer_state_while_the_base_stays_bit_identical():
    model = AdaptedThenFrozen()
    x = X[0]
    params = with_random_b(random_params(model, x))
    optimizer = make_optimizer(optimizer_options(learning_rate=1e-2, warmup_steps=0, decay_steps=10))
    opt_state = optimizer.init(params)
    moments = [leaf.size for leaf in jax.tree.leaves(opt_state) if leaf.ndim]
    assert sum(moments) == 2 * (params["adapted"]["lora_a"].size + params["adapted"]["lora_b"].size)

    def loss_fn(p, batch, rng, train):  # (loss, metrics)
        return jnp.mean((model.apply({"params": p}, batch) - 1) ** 2), {}

    step = jax.jit(make_train_step(loss_fn, optimizer, {"learning_rate": optax.constant_schedule(1e-2)}, 1, 0))
    state, metrics = step(TrainState(jnp.zeros((), jnp.int32), params, opt_state), x)
    assert metrics["grad_norm"] > 0
    for path, before in traverse_util.flatten_dict(params).items():
        after = traverse_util.flatten_dict(state.params)[path]
        assert np.array_equal(before, after) != (path[-1] in ("lora_a", "lora_b")), path


def test_a_lora_run_says_what_it_trains_as_peft_does():
    """peft's print_trainable_parameters line: the adapters' 18 + 12 parameters of the 81 (adapters included);
    the same from the parameters' shapes (the dry run's); none for a model without adapters."""
    params = random_params(AdaptedThenFrozen(), X[0])
    assert sum(leaf.size for leaf in jax.tree.leaves(params)) == 81
    line = "trainable params: 30 || all params: 81 || trainable%: 37.0370"
    assert trainable_line(params) == trainable_line(jax.eval_shape(lambda: params)) == line
    assert trainable_line(base_of(params)) is None


def test_a_lora_checkpoint_holds_the_adapters_and_the_frozen_base_once_and_restores_whole(tmp_path):
    model = AdaptedThenFrozen()
    params = with_random_b(random_params(model, X[0]))
    optimizer = make_optimizer(optimizer_options(learning_rate=1e-2, warmup_steps=0, decay_steps=10))
    state = TrainState(jnp.ones((), jnp.int32), params, optimizer.init(params))
    on_cpu = SingleDeviceSharding(jax.devices("cpu")[0])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=on_cpu), state)
    with Checkpointer(str(tmp_path), keep=2) as checkpointer:
        checkpointer.save(1, state)
        written = (tmp_path / FROZEN_DIR / "_CHECKPOINT_METADATA").stat().st_mtime_ns
        checkpointer.save(2, state.replace(step=state.step + 1))
    assert (tmp_path / FROZEN_DIR / "_CHECKPOINT_METADATA").stat().st_mtime_ns == written  # saved once
    saved = json.loads((tmp_path / "2" / "checksums.json").read_text())
    assert {name.split("/")[-1] for name in saved if name.startswith("params")} == {"lora_a", "lora_b"}
    with Checkpointer(str(tmp_path), keep=2) as checkpointer:
        step, restored = checkpointer.restore_latest(abstract, fallback=False)
    assert step == 2 and restored.step == 2
    assert jax.tree.all(jax.tree.map(np.array_equal, (restored.params, restored.opt_state),
                                     (state.params, state.opt_state)))


def test_merged_adapters_give_the_adapted_logits_and_adapters_off_the_base_ones(tiny):
    params, apply_adapted, apply_plain = tiny
    params = with_random_b(params)
    logits = apply_adapted({"params": params}, TOKENS)
    merged_params = jax.jit(merged, static_argnums=1)(params, 6.0 / 3)
    assert not has_adapters(merged_params)
    np.testing.assert_allclose(apply_plain({"params": merged_params}, TOKENS), logits, atol=TOLERANCE)
    np.testing.assert_array_equal(apply_adapted({"params": adapters_off(params)}, TOKENS),
                                  apply_plain({"params": base_of(params)}, TOKENS))


def lora_run_config(name: str, rank: int, targets=None):
    """The gpt2.py test config following the fixture's config.json, fp32, unrolled (it compiles faster; init_from
    stacks a source's layers alike for a scanned model), with LoRA of rank and alpha 8."""
    from configs.gpt2 import get_config

    config = get_config("test")
    config.data.context_length = 24
    config.model.compute_dtype = "float32"
    config.model.scan_layers = False
    config = following(str(FIXTURES / "hf" / name), config)
    config.model.lora.update(rank=rank, alpha=8.0)
    if targets:
        config.model.lora.targets = targets
    return config


def load(config, adapters: str = ""):
    """(experiment, params): the run's model with init_from=hf:<its fixture> and init_from_adapters=adapters."""
    config.init_from_adapters = adapters
    experiment = LanguageModel(config, None)
    abstract = nn.unbox(jax.eval_shape(experiment.init, jax.random.key(0))["params"])
    fresh = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), abstract)
    mesh = Mesh(np.array(jax.devices()[:1]), ("devices",))
    shardings = jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()), fresh)
    plan = init_from.prepare(config.init_from, "", abstract, None, config)
    return experiment, plan.load(fresh, shardings, mesh)


@pytest.fixture(scope="module")
def peft_loaded():
    """The peft fixtures (llama_peft, gpt2_peft: rank 4, alpha 8) loaded onto their bases, once each."""
    cache = {}

    def get(name: str):
        if name not in cache:
            config = lora_run_config(name, rank=4)
            config.init_from = f"hf:{FIXTURES / 'hf' / name}"
            cache[name] = (config, *load(config, str(FIXTURES / "lora" / f"{name}_peft")))
        return cache[name]

    return get


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_peft_adapters_give_peft_logits_in_lm_merged_or_not(peft_loaded, name):
    """Llama: q, k, v, o, gate, up, down adapted; GPT-2: peft's rank-4 adapter of the fused c_attn becomes lm's
    query, key and value adapters (its A shared, its B's rows split), c_proj and c_fc."""
    config, experiment, params = peft_loaded(name)
    expected = np.load(FIXTURES / "lora" / f"{name}_peft" / "expected.npz")
    ids = jnp.asarray(expected["ids"], jnp.int32)
    apply = jax.jit(experiment.model.apply)
    np.testing.assert_allclose(apply({"params": params}, ids), expected["logits"], atol=TOLERANCE)
    on_host = jax.tree.map(np.asarray, params)  # merged on the host; run by the same program, lora_b zero
    adapters_zeroed = {path: value * (path[-1] == "lora_a") for path, value in
                       traverse_util.flatten_dict(on_host).items() if path[-1] in ("lora_a", "lora_b")}
    merged_params = merge_into(merged(on_host, 8.0 / 4), traverse_util.unflatten_dict(adapters_zeroed))
    np.testing.assert_allclose(apply({"params": merged_params}, ids), expected["merged_logits"], atol=TOLERANCE)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_exported_adapters_read_back_exactly(peft_loaded, name, tmp_path):
    """GPT-2's query, key and value adapters of rank 4 go out as one c_attn adapter of rank 12 (block-diagonal
    B, with peft's rank_pattern and alpha_pattern) and come back apart."""
    config, _, params = peft_loaded(name)
    params = with_random_b(jax.tree.map(np.asarray, params), seed=2)
    adapter_config, tensors = peft_adapters(config, params, base_model="base", vocab_size=config.data.vocab_size)
    write_adapters(tmp_path, adapter_config, tensors)
    if name == "gpt2":
        assert adapter_config["rank_pattern"] == {"c_attn": 12} and adapter_config["alpha_pattern"] == {"c_attn": 24}
        assert tensors["base_model.model.transformer.h.0.attn.c_attn.lora_A.weight"].shape == (12, 32)
        assert adapter_config["target_modules"] == ["c_attn", "c_fc", "c_proj"] and adapter_config["fan_in_fan_out"]
    else:
        assert tensors["base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"].shape == (16, 4)
    abstract = jax.eval_shape(lambda: params)
    read = traverse_util.flatten_dict(PeftSource(str(tmp_path), config, abstract).arrays)  # unrolled, as a source's
    flat = traverse_util.flatten_dict(unrolled(params))
    adapters = {path: value for path, value in flat.items() if path[-1] in ("lora_a", "lora_b")}
    assert set(read) == set(adapters)
    for path, value in adapters.items():
        np.testing.assert_array_equal(read[path], value)


def test_peft_folders_that_do_not_fit_the_run_are_one_line(peft_loaded):
    config, _, params = peft_loaded("llama")
    abstract = jax.eval_shape(lambda: params)
    folder = str(FIXTURES / "lora" / "llama_peft")
    with pytest.raises(UserError, match=r"rank 4, this run's model.lora.rank is 8; run with "
                                        r"--config.model.lora.rank=4"):
        PeftSource(folder, lora_run_config("llama", rank=8), abstract)
    narrow = lora_run_config("llama", rank=4, targets=("query", "value"))
    with pytest.raises(UserError, match=r"adapter of model.layers.0.self_attn.k_proj changes lm's key projection, "
                                        r"which model.lora.targets leave out; add 'key' to them"):
        PeftSource(folder, narrow, jax.eval_shape(lambda: traverse_util.unflatten_dict({
            k: v for k, v in traverse_util.flatten_dict(params).items() if k[-2] in ("query", "value") or
            k[-1] not in ("lora_a", "lora_b")})))
    with pytest.raises(UserError, match="init_from_adapters=x needs init_from: the base model"):
        init_from.prepare("", "", {}, None, resolve_config("configs/gpt2.py:test", {"init_from_adapters": "x"}))


def test_bad_targets_and_export_flags_are_one_line():
    with pytest.raises(UserError, match=r"'q_proj' is no projection of lm's Transformer; the targets are query, "
                                        r"key, value, out, gate, up, down"):
        LoraConfig(rank=4, targets=("q_proj",))
    with pytest.raises(UserError, match=r"model.lora.targets=\('gate',\) match no projection of this model; its "
                                        r"projections are query, key, value, out, up, down"):
        TransformerConfig(mlp="gelu", lora=LoraConfig(rank=4, targets=("gate",)))
    TransformerConfig(mlp="gelu", lora=LoraConfig(rank=0, targets=("gate",)))  # no adapters: nothing to match
    assert LoraConfig(targets=["query,value"]).targets == ("query", "value")  # (--config...targets=query,value)
    config = resolve_config("configs/gpt2.py:test", {"model.lora.targets": "('query','out')"})
    assert config.model.lora.targets == ("query", "out")
    with pytest.raises(UserError, match="this run has LoRA adapters .* pass --merge_lora .* or --adapters"):
        check_lora_flags(True, False, False)
    with pytest.raises(UserError, match=r"--adapters: this run has no LoRA adapters \(model.lora.rank=0\)"):
        check_lora_flags(False, False, True)


def test_a_character_level_runs_adapters_export_with_its_vocabulary_and_read_back(tmp_path):
    """A character-level run has no data.vocab_size (its vocabulary is its characters'): its adapters go out with
    the vocabulary the run has and come back exactly, onto a model of the same config."""
    config = resolve_config("configs/gpt_shakespeare.py:test", {"model.lora.rank": 4})
    assert config.data.get("vocab_size") is None
    experiment = LanguageModel(config, CharTokenizer("\n !',.:;?abcdefghijklmnopqrstuvwxyz"))
    params = with_random_b(random_params(experiment.model, TOKENS[:, :config.data.context_length]))
    adapter_config, tensors = peft_adapters(config, params, base_model=None, vocab_size=experiment.vocab_size)
    assert adapter_config["base_model_name_or_path"] is None and adapter_config["rank_pattern"] == {"c_attn": 12}
    write_adapters(tmp_path, adapter_config, tensors)
    read = traverse_util.flatten_dict(PeftSource(str(tmp_path), config, jax.eval_shape(lambda: params)).arrays)
    adapters = {path: value for path, value in traverse_util.flatten_dict(unrolled(params)).items()
                if path[-1] in ("lora_a", "lora_b")}
    assert read.keys() == adapters.keys()
    for path, value in adapters.items():
        np.testing.assert_array_equal(read[path], value)


def edited_peft(tmp_path: pathlib.Path, name: str, tensors: dict | None = None, **settings) -> str:
    """A copy of the peft fixture of name with adapter_config.json's settings changed and tensors added."""
    folder = tmp_path / name
    shutil.copytree(FIXTURES / "lora" / f"{name}_peft", folder)
    adapter_config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**adapter_config, **settings}))
    if tensors:
        write_adapters(folder, {**adapter_config, **settings}, {**load_file(folder / "adapter_model.safetensors"),
                                                                 **tensors})
    return str(folder)


def test_an_adapter_config_that_disagrees_with_its_weights_is_one_line_naming_both(peft_loaded, tmp_path):
    """r=8 over rank-4 weights (peft refuses such a folder), a rank_pattern alike, and weights of modules that
    target_modules leave out are refused, each naming the two values."""
    config, _, params = peft_loaded("llama")
    abstract = jax.eval_shape(lambda: params)
    with pytest.raises(UserError, match=r"its adapter_config.json gives model.layers.0.self_attn.q_proj r=8, its "
                                        r"weights have rank 4 \(lora_A \(4, 32\)\); peft refuses such a folder: set "
                                        r"r \(or its rank_pattern\) to 4"):
        PeftSource(edited_peft(tmp_path / "r", "llama", r=8), config, abstract)
    with pytest.raises(UserError, match=r"gives model.layers.0.mlp.up_proj r=2, its weights have rank 4"):
        PeftSource(edited_peft(tmp_path / "pattern", "llama", rank_pattern={"up_proj": 2}), config, abstract)
    with pytest.raises(UserError, match=r"its adapter_model.safetensors adapts model.layers.0.mlp.down_proj, "
                                        r"model.layers.0.mlp.gate_proj, model.layers.0.mlp.up_proj ..., which its "
                                        r"adapter_config.json's target_modules=\['q_proj', 'k_proj', 'v_proj', "
                                        r"'o_proj'\] leave out \(peft would not load those weights\)"):
        PeftSource(edited_peft(tmp_path / "targets", "llama", target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
                   config, abstract)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_an_adapter_on_lm_head_is_refused_with_what_to_do_instead(peft_loaded, name, tmp_path):
    """An adapter on the output head (Llama's untied lm_head, GPT-2's tied one) is no projection lm's LoRA adapts:
    the line says so and how to use the folder (merged by peft), not to add a target lm refuses."""
    config, _, params = peft_loaded(name)
    width = config.model.embed_dim
    head = {"base_model.model.lm_head.lora_A.weight": np.ones((4, width), np.float32),
            "base_model.model.lm_head.lora_B.weight": np.ones((config.data.vocab_size, 4), np.float32)}
    targets = json.loads((FIXTURES / "lora" / f"{name}_peft" / "adapter_config.json").read_text())["target_modules"]
    folder = edited_peft(tmp_path, name, head, target_modules=[*targets, "lm_head"])
    with pytest.raises(UserError, match=r"it adapts lm_head, which lm's LoRA does not adapt \(it adapts the "
                                        r"Transformer's projections: query, key, value, out, gate, up, down\); "
                                        r"merge the folder's adapters into its base with peft \(merge_and_unload, "
                                        r"then save_pretrained\) and start from that folder \(init_from=hf:DIR\)"):
        PeftSource(folder, config, jax.eval_shape(lambda: params))


@pytest.mark.slow
def test_lm_export_adapters_of_a_character_level_lora_run(test_config, data_dir, tmp_path, capsys):
    """`lm export --adapters` of a character-level LoRA run (2 steps): a peft folder that names no base model,
    and says why."""
    from lm.cli.export import export_run
    from lm.cli.resolve import build_experiment
    from lm.train.loop import train

    test_config.model.lora.rank = 4
    test_config.train.update(num_steps=2, checkpoint_every=2)
    test_config.eval.every = 0
    train(test_config, str(tmp_path / "run"), build_experiment, devices=jax.devices()[:1])
    export_run(tmp_path / "run", tmp_path / "peft", "float32", adapters=True)
    assert "note: the folder names no base model (base_model_name_or_path null): this run's base is its own " \
           "initial weights" in capsys.readouterr().out
    adapter_config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] is None and adapter_config["r"] == 4
