"""μP (model.parametrization=mup): the initialisation, the attention scale, the readout multiplier and the learning
rates scale with the width as Tensor Programs V (Table 3) says; at its base width a μP model is the standard one;
the coordinate check (benchmarks/coord_check.py) is flat under μP and not under the standard parametrization."""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from lm.errors import UserError
from lm.hf.export import hf_architecture
from lm.layers.attention import MultiHeadAttention, attention_weights
from lm.layers.initializers import INIT_SCHEMES, initializers
from lm.layers.lora import LoraConfig
from lm.layers.splash import splash_attention
from lm.layers.transformer import TransformerConfig
from lm.models.bert import BertConfig
from lm.models.config import transformer_config, transformer_options
from lm.models.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from lm.models.gpt import GPT, GPTConfig
from lm.models.vit import ViT, ViTConfig
from lm.train.optim import logged_learning_rates, make_optimizer, resolve_schedule
from lm.train.options import optimizer_options, train_options


def mup_blocks(**changes) -> TransformerConfig:
    return TransformerConfig(**{"num_layers": 2, "num_heads": 2, "num_kv_heads": 2, "embed_dim": 16,
                                "parametrization": "mup", "mup_base_width": 16, **changes})


def test_mup_without_a_base_width_or_with_a_switch_it_does_not_cover_is_one_line():
    with pytest.raises(UserError, match="parametrization=mup needs model.mup_base_width"):
        mup_blocks(mup_base_width=0)
    with pytest.raises(UserError, match="mup_base_width=10 is not divisible by model.num_heads=4"):
        mup_blocks(num_heads=4, num_kv_heads=4, mup_base_width=10)
    with pytest.raises(UserError, match="mlp_hidden_dim=24 fixes it"):
        mup_blocks(mlp_hidden_dim_override=24)
    with pytest.raises(UserError, match="not with LoRA adapters"):
        mup_blocks(lora=LoraConfig(rank=2))
    with pytest.raises(UserError, match="use one of"):
        TransformerConfig(parametrization="mu")
    with pytest.raises(UserError, match="not BERT"):
        BertConfig(100, mup_blocks())
    model = transformer_options(embed_dim=16, parametrization="mup", mup_base_width=16)
    with pytest.raises(UserError, match="no rule for optimizer.name='sgd'"):
        make_optimizer(resolved_optimizer(name="sgd"), model)
    assert mup_blocks(mup_base_width=0, parametrization="standard").width_ratio == 1  # a base width unread


@pytest.mark.parametrize("scheme", INIT_SCHEMES)
def test_mup_scales_hidden_matrices_as_one_over_fan_in_and_keeps_the_embeddings_and_the_readout(scheme):
    """At width 256 from base 64: a hidden matrix's std is half its base one (variance 1/fan_in), the embedding's
    and the readout's are the base's; at the base width every initialiser is the standard one."""
    base, wide, vocab = initializers(scheme, 64, 4), initializers(scheme, 256, 4, base_width=64), 1000
    key = jax.random.key(0)

    def std(init, shape):
        return float(jnp.std(init(key, shape, jnp.float32)))

    for kind, (fan_in, fan_out) in (("dense", (1, 4)), ("residual", (4, 1))):
        ratio = std(getattr(wide, kind), (256 * fan_in, 256 * fan_out)) / std(getattr(base, kind), (64 * fan_in,
                                                                                                   64 * fan_out))
        assert ratio == pytest.approx(0.5, rel=0.03), kind
    assert std(wide.embedding, (vocab, 256)) == pytest.approx(std(base.embedding, (vocab, 64)), rel=0.03)
    assert std(wide.readout, (256, vocab)) == pytest.approx(std(base.readout, (64, vocab)), rel=0.03)
    at_base = initializers(scheme, 64, 4, base_width=64)
    for kind in ("dense", "residual", "embedding", "readout"):
        np.testing.assert_array_equal(getattr(at_base, kind)(key, (64, 96)), getattr(base, kind)(key, (64, 96)))


def scaled_attention(length: int, scale: float):
    """q, k, v (1, length, 2, 8) and softmax(q.k * scale) v, causal, written out."""
    q, k, v = jax.random.normal(jax.random.key(0), (3, 1, length, 2, 8))
    causal = jnp.tril(jnp.ones((length, length), bool))
    weights = jax.nn.softmax(jnp.where(causal, jnp.einsum("bthd,bshd->bhts", q, k) * scale, -jnp.inf))
    return q, k, v, jnp.einsum("bhts,bshd->bthd", weights, v)


def test_the_attention_scale_reaches_every_implementation():
    """Scores q.k * scale on the explicit path and XLA's fused call (cuDNN is that call's with the same scale);
    μP's scale is sqrt(Dh0) / Dh: 1 / sqrt(Dh) at the base width."""
    scale = 0.05
    q, k, v, reference = scaled_attention(16, scale)
    np.testing.assert_allclose(jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True), reference,
                               atol=1e-5)
    weights = attention_weights(q, k, None, jnp.tril(jnp.ones((16, 16), bool))[None, None], scale=scale)
    np.testing.assert_allclose(jnp.einsum("bhts,bshd->bthd", weights, v), reference, atol=1e-5)

    module = MultiHeadAttention(num_heads=2, num_kv_heads=2, head_dim=8, causal=True, scale=scale)
    x = jax.random.normal(jax.random.key(1), (1, 16, 16))
    params = module.init(jax.random.key(2), x)
    fused, explicit = module.apply(params, x), module.apply(params, x, capture_weights=True)
    np.testing.assert_allclose(fused, explicit, atol=1e-5)
    assert np.abs(fused - module.clone(scale=None).apply(params, x)).max() > 1e-5

    assert mup_blocks(embed_dim=64, mup_base_width=16).attention_scale == pytest.approx(math.sqrt(8) / 32)
    assert mup_blocks(embed_dim=64, mup_base_width=16, mup_base_head_dim=32).attention_scale == pytest.approx(
        math.sqrt(32) / 32)
    assert mup_blocks().attention_scale == pytest.approx(1 / math.sqrt(8))
    assert dataclasses.replace(mup_blocks(), parametrization="standard").attention_scale is None


def test_the_splash_kernel_takes_the_attention_scale():
    q, k, v, reference = scaled_attention(128, 0.05)
    np.testing.assert_allclose(splash_attention(q, k, v, True, None, interpret=True, scale=0.05), reference,
                               atol=1e-4)


def resolved_optimizer(**changes) -> ml_collections.ConfigDict:
    optimizer = optimizer_options(learning_rate=1e-2, schedule="constant", warmup_steps=0, **changes)
    config = ml_collections.ConfigDict({"optimizer": optimizer, "train": train_options(num_steps=10)})
    return resolve_schedule(config).optimizer


def first_update(name: str, parametrization: str, width: int):
    """The first update of an optimizer on a block kernel, a block bias, a norm scale and the token table."""
    params = {"decoder": {"block_0": {"attention": {"query": {"kernel": jnp.ones((width, 2, width // 2)),
                                                              "bias": jnp.ones((2, width // 2))}},
                                      "norm_mlp": {"scale": jnp.ones(width)}}},
              "token_embed": {"embedding": jnp.ones((10, width))}}
    grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(0), p.shape), params)
    model = transformer_options(embed_dim=width, parametrization=parametrization, mup_base_width=16)
    optimizer = make_optimizer(resolved_optimizer(name=name, weight_decay=0.1), model)
    return jax.jit(optimizer.update)(grads, optimizer.init(params), params)[0]


@pytest.mark.parametrize("name", ["adamw", "lion", "adafactor", "muon"])
def test_mup_scales_the_hidden_matrices_learning_rate_by_base_width_over_width(name):
    """Adam-like updates of the blocks' kernels shrink by 16 / 64 under μP, weight decay included; the biases,
    norms and embeddings keep theirs. Muon's matrices keep theirs too: orthogonalised and scaled by
    sqrt(fan_out / fan_in), their effect is width-independent already."""
    standard, mup = first_update(name, "standard", 64), first_update(name, "mup", 64)
    ratio = 1.0 if name == "muon" else 0.25
    kernel = ("decoder", "block_0", "attention", "query", "kernel")
    for path, update in jax.tree_util.tree_flatten_with_path(mup)[0]:
        names = tuple(key.key for key in path)
        expected = jax.tree.leaves(standard)[[tuple(k.key for k in p) for p, _ in
                                               jax.tree_util.tree_flatten_with_path(standard)[0]].index(names)]
        np.testing.assert_allclose(update, expected * (ratio if names == kernel else 1.0), rtol=1e-6, err_msg=names)
    rates = logged_learning_rates(resolved_optimizer(name=name), transformer_options(
        embed_dim=64, parametrization="mup", mup_base_width=16))
    if name != "muon":
        assert float(rates["hidden_learning_rate"](3)) == pytest.approx(0.25 * float(rates["learning_rate"](3)))
    at_base = first_update(name, "mup", 16)
    jax.tree.map(np.testing.assert_array_equal, at_base, first_update(name, "standard", 16))


def gpt_at(parametrization: str, width: int, tie: bool) -> tuple[GPT, ml_collections.ConfigDict]:
    model = transformer_options(num_layers=2, num_heads=2, num_kv_heads=2, embed_dim=width, init="xavier",
                                parametrization=parametrization, mup_base_width=32)
    return GPT(GPTConfig(50, 8, transformer_config(model), tie_embeddings=tie, scale_embeddings=True)), model


@pytest.mark.slow
@pytest.mark.parametrize("tie", [True, False])
def test_at_its_base_width_a_mup_gpt_is_the_standard_one_and_trains_the_same(tie):
    tokens = jax.random.randint(jax.random.key(0), (2, 9), 0, 50)
    runs = {}
    for parametrization in ("standard", "mup"):
        model, section = gpt_at(parametrization, 32, tie)
        optimizer = make_optimizer(resolved_optimizer(weight_decay=0.1), section)
        params = nn.unbox(model.init(jax.random.key(1), tokens[:, :-1])["params"])
        logits = model.apply({"params": params}, tokens[:, :-1])
        state = optimizer.init(params)
        for _ in range(2):
            grads = jax.grad(lambda p, m=model: m.apply({"params": p}, tokens[:, :-1], targets=tokens[:, 1:]).mean())(
                params)
            updates, state = optimizer.update(grads, state, params)
            params = optax.apply_updates(params, updates)
        runs[parametrization] = logits, params
    np.testing.assert_allclose(runs["mup"][0], runs["standard"][0], atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), runs["mup"][1], runs["standard"][1])
    wide, _ = gpt_at("mup", 128, tie)  # and away from it, the readout's logits shrink by 32 / 128
    assert wide.config.transformer.width_ratio == 0.25


def test_at_its_base_width_a_mup_encoder_decoder_is_the_standard_one():
    source, target = jnp.arange(1, 8)[None], jnp.arange(2, 8)[None]
    outputs = []
    for blocks in (mup_blocks(num_layers=1, parametrization="standard"), mup_blocks(num_layers=1)):
        model = EncoderDecoder(EncoderDecoderConfig(13, 11, 16, blocks))
        params = jax.jit(model.init)(jax.random.key(0), source, jnp.ones_like(source), target)
        outputs.append(jax.jit(model.apply)(params, source, jnp.ones_like(source), target))
    np.testing.assert_allclose(outputs[1], outputs[0], atol=1e-6)


def test_a_mup_run_has_no_hugging_face_export(test_config):
    """Hugging Face's GPT-2 and Llama have no place for μP's attention scale and readout multiplier."""
    test_config.model.update(parametrization="mup", mup_base_width=16)
    with pytest.raises(UserError, match="model.parametrization=standard \\(this run: mup\\)"):
        hf_architecture(test_config, 65)


def test_a_mup_vit_multiplies_its_classifier_logits_by_base_width_over_width():
    """The classifier is ViT's readout (zero-initialised, as big_vision's): with the same weights, a μP ViT at twice
    its base width (the base head dimension kept, so the attention is the same) gives half the standard logits."""
    images = jax.random.normal(jax.random.key(0), (2, 8, 8, 3))

    def vit(**changes) -> ViT:
        return ViT(ViTConfig(mup_blocks(num_layers=1, position="none", **changes), image_size=8, patch_size=4))

    standard = vit(parametrization="standard")
    params = nn.unbox(jax.jit(standard.init)(jax.random.key(1), images)["params"])
    params["head"]["kernel"] = jax.random.normal(jax.random.key(2), params["head"]["kernel"].shape)
    logits = standard.apply({"params": params}, images)
    np.testing.assert_allclose(vit().apply({"params": params}, images), logits, atol=1e-6)
    half = vit(mup_base_width=8, mup_base_head_dim=8).apply({"params": params}, images)
    np.testing.assert_allclose(half, logits / 2, atol=1e-6)


@pytest.mark.slow
def test_the_coordinate_check_is_flat_under_mup_and_not_under_the_standard_parametrization():
    """benchmarks/coord_check.py at widths 64, 256 and 1024, 5 Adam steps: under μP every layer's slope of log RMS
    against log width is within 0.1 of 0 at every step; under the standard parametrization the logits' is clearly
    positive."""
    from benchmarks.coord_check import LEARNING_RATE, coord_check

    result = coord_check([64, 256, 1024], steps=5, learning_rate=LEARNING_RATE)
    assert len(result["mup"]["slopes"]) == 6  # the embedding, two blocks' attention and MLP, the logits
    for layer, per_step in result["mup"]["slopes"].items():
        assert max(map(abs, per_step)) < 0.1, (layer, per_step)
    assert min(result["standard"]["slopes"]["logits"]) > 0.4, result["standard"]["slopes"]["logits"]
