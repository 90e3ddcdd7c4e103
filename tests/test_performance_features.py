"""The performance switches change how the model is computed, not what: scan over layers, remat
policies, the attention implementation, chunked cross-entropy and bf16 compute, each against the
plain path."""

import dataclasses
import functools

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm.cli.resolve import build_experiment
from lm.errors import UserError
from lm.layers.attention import attention_implementation
from lm.layers.transformer import SCANNED_NAME, MoeConfig, TransformerConfig, sown_per_layer, stack_layers
from lm.models.gpt import GPT, GPTConfig

BLOCKS = TransformerConfig(num_layers=4, embed_dim=16, num_heads=4, num_kv_heads=2)
CONFIG = GPTConfig(vocab_size=11, context_length=12, transformer=BLOCKS)
MOE = MoeConfig(num_experts=2, every=2, top_k=1, capacity_factor=2.0)


def gpt(**changes) -> GPTConfig:
    gpt_changes = {k: changes.pop(k) for k in list(changes) if k in ("tie_embeddings", "loss_chunk")}
    return dataclasses.replace(CONFIG, transformer=dataclasses.replace(BLOCKS, **changes), **gpt_changes)


def init(config: GPTConfig, seed=0):
    tokens = jnp.zeros((1, config.context_length), jnp.int32)
    return nn.unbox(jax.jit(GPT(config).init)(jax.random.key(seed), tokens)["params"])


def scanned_layout(params: dict, config: TransformerConfig) -> dict:
    """A GPT's params (or gradients, a mask) with the decoder stack in the scanned layout."""
    return {**params, "decoder": stack_layers(params["decoder"], config.layer_period)}


def tokens(shape=(3, 12), seed=1):
    return jax.random.randint(jax.random.key(seed), shape, 0, CONFIG.vocab_size)


@functools.partial(jax.jit, static_argnames=("config", "capture_weights"))
def forward(config: GPTConfig, params, inputs, capture_weights=False):
    """Logits, and with capture_weights the sown 'intermediates' too (jitted: eager Flax is slow)."""
    return GPT(config).apply({"params": params}, inputs, capture_weights=capture_weights, mutable=["intermediates"])


def loss_of(config: GPTConfig, params, inputs, targets):
    """Mean cross-entropy plus 0.01 x the summed MoE load-balance losses (of every layer)."""
    token_losses, collections = GPT(config).apply({"params": params}, inputs, targets=targets, mutable=["moe"])
    moe = sum(jnp.sum(s["load_balance_loss"]) for s in jax.tree.leaves(
        collections, is_leaf=lambda n: isinstance(n, dict) and "load_balance_loss" in n))
    return token_losses.mean() + 0.01 * moe


@functools.partial(jax.jit, static_argnames="config")
def loss_and_grads(config: GPTConfig, params, inputs, targets):
    return jax.value_and_grad(functools.partial(loss_of, config))(params, inputs, targets)


@pytest.mark.slow
@pytest.mark.parametrize("moe", [MoeConfig(), MOE], ids=["dense", "moe_every_2"])
def test_scanned_stack_equals_the_unrolled_one(moe):
    """The same weights, stacked: the same loss with the MoE auxiliary loss (the scanned groups of
    blocks) and, for the dense model, the same gradients (MoE gradients: the same scan code path)."""
    unrolled = gpt(moe=moe)
    scanned = gpt(moe=moe, scan_layers=True)
    params = init(unrolled)
    stacked = scanned_layout(params, unrolled.transformer)
    scanned_shapes = jax.eval_shape(GPT(scanned).init, jax.random.key(0), jnp.zeros((1, 12), jnp.int32))["params"]
    assert jax.tree.map(jnp.shape, stacked) == jax.tree.map(jnp.shape, nn.unbox(scanned_shapes))
    x, y = tokens(), tokens(seed=2)
    if moe.num_experts:
        np.testing.assert_allclose(jax.jit(loss_of, static_argnums=0)(scanned, stacked, x, y),
                                   jax.jit(loss_of, static_argnums=0)(unrolled, params, x, y), rtol=1e-6)
        return
    loss, grads = loss_and_grads(unrolled, params, x, y)
    scanned_loss, scanned_grads = loss_and_grads(scanned, stacked, x, y)
    np.testing.assert_allclose(scanned_loss, loss, rtol=1e-6)
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-7),
                 scanned_grads, scanned_layout(grads, unrolled.transformer))


@pytest.mark.slow
@pytest.mark.parametrize("remat, scan", [("full", False), ("dots_no_batch", True)])
def test_remat_policies_leave_loss_and_gradients_unchanged(remat, scan):
    reference = gpt(scan_layers=scan)
    params = init(reference)
    expected = loss_and_grads(reference, params, tokens(), tokens(seed=2))
    got = loss_and_grads(gpt(scan_layers=scan, remat=remat), params, tokens(), tokens(seed=2))
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-7), got, expected)


def test_scanned_kv_cache_decoding_equals_full_recomputation():
    """The KV cache of a scanned stack decodes token by token to the logits of the whole sequence. Its
    layers are stacked behind the rows, (B, layers, ...), since beam search reorders rows along the
    leading axis (lm/search.py)."""
    config = gpt(scan_layers=True)
    params = init(config)
    model, x = GPT(config), tokens((2, 12))
    full, _ = forward(config, params, x)
    cache = jax.eval_shape(functools.partial(model.init, decode=True), jax.random.key(0),
                           jnp.zeros((2, 12), jnp.int32))["cache"]
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cache)
    assert jax.tree.leaves(cache["decoder"])[0].shape[:2] == (2, BLOCKS.num_layers)  # rows first, then layers
    decode_step = jax.jit(lambda c, t: model.apply({"params": params, "cache": c}, t, decode=True, mutable=["cache"]))
    step_logits = []
    for t in range(12):
        logits, mutated = decode_step(cache, x[:, t:t + 1])
        cache = mutated["cache"]
        step_logits.append(logits)
    np.testing.assert_allclose(jnp.concatenate(step_logits, axis=1), full, rtol=1e-5, atol=1e-5)


def test_scanned_params_carry_a_layers_axis_and_shard_like_the_unrolled_ones():
    from lm import sharding

    boxed = jax.eval_shape(GPT(gpt(scan_layers=True)).init, jax.random.key(0), jnp.zeros((1, 12), jnp.int32))
    specs = flax.traverse_util.flatten_dict(nn.get_partition_spec(boxed)["params"])
    assert specs[("decoder", SCANNED_NAME, "block_0", "attention", "query", "kernel")] == \
        jax.sharding.PartitionSpec("layers", "embed", "heads", "kv")
    mesh = sharding.make_mesh({"data": 1, "fsdp": 2, "expert": 1, "tensor": 2}, jax.devices()[:4])
    named = sharding.logical_shardings(boxed, mesh, sharding.DEFAULT_RULES)
    query = named["params"]["decoder"][SCANNED_NAME]["block_0"]["attention"]["query"]["kernel"]
    assert query.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)  # layers: replicated


def test_scan_needs_whole_groups_of_moe_blocks():
    with pytest.raises(UserError, match="multiple of model.moe.every=3"):
        dataclasses.replace(BLOCKS, moe=dataclasses.replace(MOE, every=3), scan_layers=True)


def test_sown_attention_weights_come_out_per_layer_in_either_layout():
    """What the ViT rollout and the translation attention maps read: the same weights per layer."""
    unrolled, scanned = gpt(), gpt(scan_layers=True)
    params = init(unrolled)

    def per_layer(config, p):
        _, sown = forward(config, p, tokens(), capture_weights=True)
        flat = flax.traverse_util.flatten_dict(sown["intermediates"])
        return dict(item for path, (w,) in flat.items() for item in sown_per_layer(path, w, config.transformer))

    expected, got = per_layer(unrolled, params), per_layer(scanned, scanned_layout(params, unrolled.transformer))
    assert sorted(got) == sorted(expected) == list(range(BLOCKS.num_layers))
    for layer in expected:
        np.testing.assert_allclose(got[layer], expected[layer], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_chunked_cross_entropy_equals_the_full_logits_one(tie):
    """Per-token losses and gradients from chunks of 4 positions equal optax's cross-entropy of the
    full (B, T, V) logits."""
    import optax

    full, chunked = gpt(tie_embeddings=tie), gpt(tie_embeddings=tie, loss_chunk=4)
    params = init(full)
    x, y = tokens(), tokens(seed=2)

    def reference(p):
        logits = GPT(full).apply({"params": p}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    assert jax.eval_shape(lambda p: GPT(chunked).apply({"params": p}, x, targets=y), params).shape == x.shape
    expected_loss, expected_grads = jax.jit(jax.value_and_grad(reference))(params)
    loss, grads = loss_and_grads(chunked, params, x, y)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-7), grads, expected_grads)


def test_chunk_must_divide_the_sequence():
    with pytest.raises(UserError, match="loss_chunk=5"):
        jax.eval_shape(functools.partial(GPT(gpt(loss_chunk=5)).init, targets=tokens((1, 12))), jax.random.key(0),
                       tokens((1, 12)))


@pytest.mark.parametrize(
    "requested, platform, dtype, head_dim, lengths, masked, expected",
    [
        ("auto", "gpu", jnp.bfloat16, 64, (1024, 1024), False, "cudnn"),
        ("auto", "gpu", jnp.float32, 64, (1024, 1024), False, "xla"),  # cuDNN flash attention: half precision
        ("auto", "gpu", jnp.bfloat16, 64, (1024, 1024), True, "xla"),  # a padding mask, ALiBi or the KV cache
        ("auto", "gpu", jnp.bfloat16, 160, (1024, 1024), False, "xla"),
        ("auto", "tpu", jnp.float32, 64, (1024, 1024), False, "splash"),
        ("auto", "tpu", jnp.bfloat16, 64, (1000, 1000), False, "xla"),  # not whole blocks of 128
        ("auto", "tpu", jnp.bfloat16, 64, (1024, 1024), True, "xla"),
        ("auto", "cpu", jnp.bfloat16, 64, (1024, 1024), False, "xla"),
        ("cudnn", "gpu", jnp.float16, 128, (64, 64), False, "cudnn"),
        ("splash", "cpu", jnp.float32, 64, (128, 256), False, "splash"),  # interpreted off TPU
        ("xla", "gpu", jnp.bfloat16, 64, (1024, 1024), False, "xla"),
    ],
)
def test_attention_implementation_choice(requested, platform, dtype, head_dim, lengths, masked, expected):
    assert attention_implementation(requested, platform, dtype, head_dim, lengths, masked) == expected


@pytest.mark.parametrize("requested, message", [("cudnn", "cudnn needs a GPU"),
                                                ("splash", "splash needs sequence lengths that are multiples of 128")])
def test_a_fused_attention_that_does_not_apply_is_a_clear_error(requested, message):
    with pytest.raises(UserError, match=message):
        jax.eval_shape(GPT(gpt(attention_impl=requested)).init, jax.random.key(0), tokens((1, 12)))


@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_splash_attention_equals_xla_attention_on_a_sharded_mesh(causal):
    """The Pallas kernel (interpreted on CPU) inside its shard_map over a data 2 x fsdp 2 x tensor 2 mesh,
    with grouped-query heads: the output and the gradients of XLA's attention."""
    from lm import sharding
    from lm.layers.attention import MultiHeadAttention

    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "expert": 1, "tensor": 2}, jax.devices()[:8])
    x = jax.random.normal(jax.random.key(0), (4, 128, 32))

    def loss_and_grads(implementation):
        layer = MultiHeadAttention(num_heads=4, num_kv_heads=2, head_dim=8, causal=causal,
                                   implementation=implementation)
        params = layer.init(jax.random.key(1), x)
        return jax.jit(jax.value_and_grad(lambda p, x: jnp.sum(layer.apply(p, x) ** 2), argnums=(0, 1)))(params, x)

    expected = loss_and_grads("xla")
    with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.DEFAULT_RULES):
        got = loss_and_grads("splash")
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-5), got, expected)


def test_xla_attention_equals_the_explicit_softmax():
    """attention_impl=xla (the fused call) against capture_weights (the explicit softmax path)."""
    config = gpt(attention_impl="xla")
    params = init(config)
    fused, _ = forward(config, params, tokens())
    explicit, _ = forward(config, params, tokens(), capture_weights=True)
    np.testing.assert_allclose(fused, explicit, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_gpt2_test_config_trains_in_bf16_and_keeps_float32_master_weights(tmp_path):
    """configs/gpt2.py:test end to end (bf16 compute, scanned layers, chunked loss, synthetic ids): the
    checkpointed params are float32 and the loss sits at ln(vocab) = ln(500), the entropy of random ids."""
    import math

    from configs.gpt2 import get_config
    from experiments.language_model import build
    from lm.train.loop import train
    from lm.train.setup import restore_params

    config = get_config("test")
    config.train.update(num_steps=4, checkpoint_every=4)
    config.eval.every = 4
    summary = train(config, str(tmp_path), build_experiment, devices=jax.devices()[:1])
    assert summary["step"] == 4 and abs(summary["eval_loss"] - math.log(500)) < 0.1
    params = restore_params(config, build(config), tmp_path)
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype("float32")}
    assert params["decoder"][SCANNED_NAME]["block_0"]["mlp"]["up"]["kernel"].shape == (2, 64, 256)


def test_weight_decay_skips_biases_and_scales_stacked_over_layers_or_experts():
    """The decay mask of the scanned model is the unrolled model's, stacked; expert biases are not decayed."""
    from lm.train.optim import decay_mask

    unrolled, scanned = gpt(moe=MOE), gpt(moe=MOE, scan_layers=True)
    shapes = nn.unbox(jax.eval_shape(GPT(unrolled).init, jax.random.key(0), jnp.zeros((1, 12), jnp.int32))["params"])
    scanned_shapes = jax.eval_shape(GPT(scanned).init, jax.random.key(0), jnp.zeros((1, 12), jnp.int32))["params"]
    mask = decay_mask(shapes)
    stacked, scanned_mask = scanned_layout(mask, unrolled.transformer), decay_mask(nn.unbox(scanned_shapes))
    assert jax.tree.structure(stacked) == jax.tree.structure(scanned_mask)
    for per_layer, scanned_value in zip(jax.tree.leaves(stacked), jax.tree.leaves(scanned_mask), strict=True):
        assert np.all(np.asarray(per_layer) == scanned_value)
    experts = mask["decoder"]["block_1"]["moe"]["experts"]
    assert experts["up"]["kernel"] and not experts["up"]["bias"]
    query = mask["decoder"]["block_0"]["attention"]["query"]  # its bias is heads x head size: two axes
    assert shapes["decoder"]["block_0"]["attention"]["query"]["bias"].ndim == 2
    assert query["kernel"] and not query["bias"]
