"""The stability switches: QK-norm, soft-capped attention scores and output logits, the parallel block and the
output z-loss, each against a direct numpy formula, with causality, both layer layouts and KV-cached decoding
kept; the fused-attention choice and the one-line errors of bad values and of exports that cannot hold them."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm.decode.generate import empty_cache
from lm.errors import UserError
from lm.layers.attention import MultiHeadAttention, attention_implementation, capped, fallback_note
from lm.layers.mlp import Mlp
from lm.layers.norms import Norm
from lm.layers.transformer import TransformerBlock, TransformerConfig, stack_layers
from lm.losses import cross_entropy_and_logsumexp
from lm.models.gpt import GPT, GPTConfig

RNG = np.random.default_rng(0)
SWITCHES = dict(qk_norm=True, attention_softcap=2.0, logit_softcap=3.0, parallel_block=True)


def random(*shape, scale=1.0):
    return (scale * RNG.standard_normal(shape)).astype(np.float32)


def randomised(params):
    """Every leaf random (norm scales and biases too), so every term of a formula matters."""
    leaves, tree = jax.tree.flatten(nn.unbox(params))
    return jax.tree.unflatten(tree, [random(*leaf.shape, scale=0.5) for leaf in leaves])


def softmax(scores):
    w = np.exp(scores - scores.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True)


def rms_normed(x, scale, eps):  # over the last axis
    return x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + eps) * scale


def test_capped_is_cap_tanh_of_x_over_cap_and_off_at_zero():
    x = random(50, scale=40.0)
    np.testing.assert_allclose(capped(jnp.asarray(x), 30.0), 30.0 * np.tanh(x / 30.0), rtol=1e-6)
    assert np.all(np.abs(np.asarray(capped(jnp.asarray(x), 5.0))) <= 5.0)  # (tanh saturates in float32)
    np.testing.assert_array_equal(capped(jnp.asarray(x), 0.0), x)


@pytest.mark.parametrize("capture_weights", [False, True])  # the XLA path and the explicit one
def test_attention_with_qk_norm_and_a_softcap_matches_numpy(capture_weights):
    """Per head: q and k RMS-normed over their Dh channels (each projection's own scale), scores
    cap * tanh(q.k / sqrt(Dh) / cap), causal softmax; 4 query heads over 2 key/value heads."""
    x = random(2, 6, 8)
    module = MultiHeadAttention(num_heads=4, num_kv_heads=2, head_dim=4, causal=True, qk_norm=True,
                                norm_epsilon=1e-6, softcap=1.5)
    params = randomised(jax.eval_shape(module.init, jax.random.key(0), x)["params"])
    y, _ = jax.jit(functools.partial(module.apply, capture_weights=capture_weights, mutable=["intermediates"]))(
        {"params": params}, x)

    def project(p):
        return np.einsum("bsd,dhk->bshk", x, p["kernel"]) + p["bias"]

    q = rms_normed(project(params["query"]), params["query_norm"]["scale"], 1e-6)  # (B, T, H, Dh)
    k = rms_normed(project(params["key"]), params["key_norm"]["scale"], 1e-6)  # (B, S, K, Dh)
    v = project(params["value"])
    out = np.zeros_like(q)
    for h in range(4):
        scores = np.einsum("btd,bsd->bts", q[:, :, h], k[:, :, h // 2]) / 2.0  # sqrt(Dh) = 2
        scores = np.where(np.tril(np.ones((6, 6), bool)), 1.5 * np.tanh(scores / 1.5), -np.inf)
        out[:, :, h] = softmax(scores) @ v[:, :, h // 2]
    expected = np.einsum("bthk,hkd->btd", out, params["out"]["kernel"]) + params["out"]["bias"]
    np.testing.assert_allclose(y, expected, atol=1e-5)
    assert params["query_norm"]["scale"].shape == (4,)  # one scale over Dh, shared by the heads


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_parallel_block_is_x_plus_attention_plus_mlp_of_one_norm(norm_position):
    """pre: x + attn(norm(x)) + mlp(norm(x)); post: norm(x + attn(x) + mlp(x)); one norm, no norm_mlp."""
    config = TransformerConfig(num_layers=1, num_heads=2, num_kv_heads=2, embed_dim=8, parallel_block=True,
                               norm_position=norm_position)
    x = random(2, 5, 8)
    block = TransformerBlock(config, causal=True)
    params = randomised(jax.eval_shape(block.init, jax.random.key(0), x)["params"])
    assert set(params) == {"attention", "mlp", "norm"}
    attention = MultiHeadAttention(num_heads=2, num_kv_heads=2, head_dim=4, causal=True)
    mlp = Mlp(kind=config.mlp, hidden_dim=config.mlp_hidden_dim)
    norm = Norm(config.norm, epsilon=config.norm_epsilon)

    def sublayers(h):
        return (attention.apply({"params": params["attention"]}, h) + mlp.apply({"params": params["mlp"]}, h))

    if norm_position == "pre":
        expected = x + sublayers(norm.apply({"params": params["norm"]}, x))
    else:
        expected = norm.apply({"params": params["norm"]}, x + sublayers(x))
    np.testing.assert_allclose(block.apply({"params": params}, x), expected, atol=1e-5)


@functools.partial(jax.jit, static_argnames=("model", "decode", "mutable"))
def apply(model, variables, ids, decode=False, mutable=False):
    """model.apply, jitted: compiled once per shape, not run op by op."""
    return model.apply(variables, ids, decode=decode, mutable=mutable)


def gpt(scan_layers=False, **switches):
    blocks = TransformerConfig(num_layers=2, num_heads=2, num_kv_heads=1, embed_dim=16, position="rope",
                               scan_layers=scan_layers, **switches)
    return GPT(GPTConfig(vocab_size=13, context_length=8, transformer=blocks))


def tokens(batch=2, length=8):
    return jnp.asarray(RNG.integers(0, 13, (batch, length)), jnp.int32)


def test_gpt_with_every_switch_is_causal_agrees_across_layouts_and_caps_its_logits():
    model = gpt(**SWITCHES)
    params = randomised(jax.eval_shape(model.init, jax.random.key(0), tokens(1))["params"])
    ids = tokens()
    logits = apply(model, {"params": params}, ids)
    assert np.all(np.abs(np.asarray(logits)) <= SWITCHES["logit_softcap"])
    changed = apply(model, {"params": params}, ids.at[:, 5].set((ids[:, 5] + 1) % 13))  # a later token
    np.testing.assert_allclose(changed[:, :5], logits[:, :5], atol=1e-6)  # changes no earlier logit
    assert not np.allclose(changed[:, 5:], logits[:, 5:])
    scanned = {**params, "decoder": stack_layers(params["decoder"])}
    np.testing.assert_allclose(apply(gpt(scan_layers=True, **SWITCHES), {"params": scanned}, ids), logits, atol=1e-5)


def test_kv_cached_decoding_with_every_switch_equals_the_full_forward():
    model = gpt(**SWITCHES)
    params = randomised(jax.eval_shape(model.init, jax.random.key(0), tokens(1))["params"])
    ids = tokens()
    full = apply(model, {"params": params}, ids)
    cache = empty_cache(model, batch_size=2)  # as sampling makes it
    steps = []
    for start, stop in [(0, 3), (3, 4), (4, 8)]:  # a prompt, then one token, then several
        out, variables = apply(model, {"params": params, "cache": cache}, ids[:, start:stop], decode=True,
                               mutable=("cache",))
        cache = variables["cache"]
        steps.append(out)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)


def test_cross_entropy_and_logsumexp_match_numpy():
    logits, targets = random(3, 4, 7, scale=3.0), RNG.integers(0, 7, (3, 4))
    got = cross_entropy_and_logsumexp(jnp.asarray(logits), jnp.asarray(targets))
    lse = np.log(np.exp(logits).sum(-1))
    np.testing.assert_allclose(got["logsumexp"], lse, rtol=1e-5)
    np.testing.assert_allclose(got["cross_entropy"], lse - np.take_along_axis(logits, targets[..., None], -1)[..., 0],
                               rtol=1e-5)


@pytest.mark.parametrize("loss_chunk", [0, 4])
def test_language_model_loss_adds_the_weighted_z_loss_over_the_loss_tokens(test_config, loss_chunk):
    """loss = mean CE + w * mean(logsumexp^2) over the tokens of weight 1 (numpy, from the model's logits);
    z_loss and logsumexp logged unweighted; the same whole or in chunks of loss_chunk positions."""
    from experiments.language_model import LanguageModel

    test_config.data.vocab_size = 13
    test_config.data.context_length = 8
    test_config.train.z_loss = 0.25
    test_config.model.loss_chunk = loss_chunk
    test_config.model.update(SWITCHES)
    experiment = LanguageModel(test_config, None)
    params = randomised(jax.eval_shape(experiment.init, jax.random.key(0))["params"])
    inputs, targets = tokens(), tokens()
    weights = np.ones((2, 8), np.float32)
    weights[1, 6:] = 0
    batch = {"inputs": inputs, "targets": targets, "weights": weights, "segment_ids": jnp.asarray(weights, jnp.int32),
             "positions": jnp.broadcast_to(jnp.arange(8), (2, 8))}
    loss, metrics = jax.jit(experiment.loss, static_argnames="train")(params, batch, jax.random.key(1), train=False)
    logits = np.asarray(apply(experiment.model, {"params": params}, inputs), np.float64)
    lse = np.log(np.exp(logits).sum(-1))
    ce = lse - np.take_along_axis(logits, np.asarray(targets)[..., None], -1)[..., 0]
    real = weights.astype(bool)
    z = np.mean(lse[real] ** 2)
    np.testing.assert_allclose(metrics["z_loss"], z, rtol=1e-5)
    np.testing.assert_allclose(metrics["logsumexp"], np.mean(lse[real]), rtol=1e-5)
    np.testing.assert_allclose(loss, np.mean(ce[real]) + 0.25 * z, rtol=1e-5)


def test_train_steps_with_every_switch_and_z_loss_lower_the_loss_and_reach_every_new_parameter(test_config):
    """Adam steps on one batch of the GPT with every switch on: the objective falls, and the QK-norm scales get
    gradients."""
    import optax

    from experiments.language_model import LanguageModel

    test_config.data.vocab_size = 13
    test_config.model.update(SWITCHES)
    test_config.train.z_loss = 1e-3
    experiment = LanguageModel(test_config, None)
    params = randomised(jax.eval_shape(experiment.init, jax.random.key(0))["params"])
    optimizer = optax.adam(1e-2)
    batch = {"inputs": tokens(4, 16), "targets": tokens(4, 16)}

    @jax.jit
    def step(params, state):
        (loss, metrics), grads = jax.value_and_grad(experiment.loss, has_aux=True)(params, batch, jax.random.key(1),
                                                                                  train=True)
        updates, state = optimizer.update(grads, state)
        return optax.apply_updates(params, updates), state, loss, grads

    state = optimizer.init(params)
    losses = []
    for _ in range(3):
        params, state, loss, grads = step(params, state)
        losses.append(float(loss))
    assert losses[-1] < losses[0]
    attention = grads["decoder"]["block_0"]["attention"]
    assert all(np.abs(attention[name]["scale"]).sum() > 0 for name in ("query_norm", "key_norm"))


def test_cudnn_takes_no_softcap_and_auto_on_a_gpu_says_it_runs_xla():
    bf16 = jnp.bfloat16
    assert attention_implementation("auto", "gpu", bf16, 64, (256, 256), False) == "cudnn"
    assert attention_implementation("auto", "gpu", bf16, 64, (256, 256), False, softcap=50.0) == "xla"
    assert attention_implementation("auto", "tpu", bf16, 64, (256, 256), False, softcap=50.0) == "splash"
    with pytest.raises(UserError, match="without a soft-cap"):
        attention_implementation("cudnn", "gpu", bf16, 64, (256, 256), False, softcap=50.0)
    note = fallback_note("auto", "gpu", 50.0)
    assert "\n" not in note and "XLA, not cuDNN" in note and "attention_softcap=50.0" in note
    assert fallback_note("auto", "tpu", 50.0) is None and fallback_note("auto", "gpu", 0.0) is None
    with pytest.raises(UserError, match="attention_impl=cudnn .*attention_softcap=50"):
        TransformerConfig(attention_impl="cudnn", attention_softcap=50.0)


def test_splash_caps_the_scores_as_the_explicit_path_does():
    """The Pallas kernel (interpreted on CPU) with its attn_logits_soft_cap against the XLA path's cap."""
    x = jax.random.normal(jax.random.key(0), (1, 128, 16), jnp.float32) * 4
    outputs = {}
    for implementation in ("xla", "splash"):
        layer = MultiHeadAttention(num_heads=2, num_kv_heads=1, head_dim=8, causal=True, softcap=0.5,
                                   implementation=implementation)
        outputs[implementation] = layer.apply(layer.init(jax.random.key(1), x), x)
    np.testing.assert_allclose(outputs["splash"], outputs["xla"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("key, value, message", [
    ("model.attention_softcap", -1.0, "model.attention_softcap=-1.0 is out of range: use 0 or more"),
    ("model.logit_softcap", float("nan"), "model.logit_softcap=nan is out of range"),
    ("train.z_loss", -0.1, "train.z_loss=-0.1 is out of range: use 0 or more"),
])
def test_bad_switch_values_are_one_line(test_config, key, value, message):
    from lm.layers.options import check_declared

    section, field = key.split(".")
    test_config[section][field] = value
    with pytest.raises(UserError) as error:
        check_declared(test_config)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("switch, value", [("qk_norm", True), ("attention_softcap", 50.0), ("logit_softcap", 30.0),
                                           ("parallel_block", True)])
def test_export_of_a_model_with_a_switch_no_architecture_has_is_one_line(test_config, switch, value):
    from lm.hf.export import hf_architecture

    test_config.model[switch] = value
    with pytest.raises(UserError) as error:
        hf_architecture(test_config, 65)
    text = str(error.value)
    assert "\n" not in text and f"GPT2LMHeadModel needs model.{switch}=" in text and "LlamaForCausalLM needs" in text
