"""The Transformer encoder-decoder: masking invariants and cached decoding."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm.layers.transformer import MoeConfig, TransformerConfig
from lm.models.encoder_decoder import EncoderDecoder, EncoderDecoderConfig

BLOCKS = TransformerConfig(num_layers=2, embed_dim=16, num_heads=4, num_kv_heads=2)
CONFIG = EncoderDecoderConfig(source_vocab_size=13, target_vocab_size=11, max_length=16, transformer=BLOCKS)
VARIANTS = {
    "default": {},
    "post-rms-swiglu-rope-moe": dict(norm_position="post", norm="rms", mlp="swiglu", position="rope",
                                     moe=MoeConfig(num_experts=4, every=1, top_k=2, capacity_factor=4.0)),
    "alibi": dict(position="alibi"),
}


def build(**changes):
    model = EncoderDecoder(dataclasses.replace(CONFIG, transformer=dataclasses.replace(BLOCKS, **changes)))
    source, mask, target = example()
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), source, mask, target)["params"])
    return model, params


def example(seed=0):
    """source (2, 7) with the second row padded after 4 tokens; decoder inputs (2, 6)."""
    rng = np.random.default_rng(seed)
    source = rng.integers(4, 13, (2, 7))
    mask = np.ones((2, 7), np.int32)
    mask[1, 4:] = 0
    source[1, 4:] = 0
    return jnp.asarray(source), jnp.asarray(mask), jnp.asarray(rng.integers(4, 11, (2, 6)))


@functools.partial(jax.jit, static_argnames=("model",))
def forward(model, params, source, mask, target):
    return model.apply({"params": params}, source, mask, target)


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_source_padding_changes_nothing(variant):
    model, params = build(**VARIANTS[variant])
    source, mask, target = example()
    logits = forward(model, params, source, mask, target)
    # More padding, with other junk ids under the mask: the same logits.
    longer_source = jnp.concatenate([source.at[1, 4:].set(7), jnp.full((2, 3), 5)], axis=1)
    longer_mask = jnp.concatenate([mask, jnp.zeros((2, 3), jnp.int32)], axis=1)
    np.testing.assert_allclose(forward(model, params, longer_source, longer_mask, target), logits, atol=1e-5)
    # The real source tokens do matter, everywhere in the target (bidirectional encoder).
    changed = forward(model, params, source.at[0, 6].set(4 + (source[0, 6] - 3) % 9), mask, target)
    assert not np.allclose(changed[0], logits[0], atol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
def test_decoder_is_causal(variant):
    model, params = build(**VARIANTS[variant])
    source, mask, target = example()
    logits = forward(model, params, source, mask, target)
    changed = forward(model, params, source, mask, target.at[:, 3:].set(4))
    np.testing.assert_allclose(changed[:, :3], logits[:, :3], atol=1e-5)
    assert not np.allclose(changed[:, 3:], logits[:, 3:], atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_decoding_equals_teacher_forcing(variant):
    model, params = build(**VARIANTS[variant])
    source, mask, target = example()
    full = forward(model, params, source, mask, target)
    memory = jax.jit(functools.partial(model.apply, method=EncoderDecoder.encode))({"params": params}, source, mask)
    step = jax.jit(functools.partial(model.apply, decode=True, method=EncoderDecoder.decode, mutable=["cache"]))
    cache_shapes = jax.eval_shape(
        lambda: model.init(jax.random.key(0), target, memory, mask, decode=True, method=EncoderDecoder.decode)
    )["cache"]
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cache_shapes)
    steps = []
    for start, stop in [(0, 2), (2, 3), (3, 4), (4, 6)]:
        logits, variables = step({"params": params, "cache": cache}, target[:, start:stop], memory, mask)
        cache = variables["cache"]
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)


def test_only_decoder_blocks_cross_attend():
    _, params = build()
    assert "cross_attention" in params["decoder"]["stack"]["block_0"]
    assert "cross_attention" not in params["encoder"]["stack"]["block_0"]
    assert params["encoder"]["token_embed"]["embedding"].shape == (64, 16)  # 13 ids padded to 64


@pytest.mark.parametrize("scale", [True, False])
def test_embedding_is_scaled_tokens_plus_sinusoids(scale):
    """embed() = E[tokens] * sqrt(D) (Vaswani et al. 3.4; 1 without scale_embeddings) + the sinusoidal table."""
    from lm.layers.embedding import embed
    from lm.layers.positions import sinusoidal_table

    blocks = dataclasses.replace(BLOCKS, position="sinusoidal")

    class Embedding(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            return embed(tokens, jnp.arange(tokens.shape[1]), 13, 16, blocks, scale, train=False)[0]

    tokens = jnp.asarray([[4, 7, 12, 0, 5]])
    variables = Embedding().init(jax.random.key(0), tokens)
    table = np.asarray(nn.unbox(variables)["params"]["token_embed"]["embedding"])
    positions = np.asarray(sinusoidal_table(jnp.arange(5), 16))
    expected = table[np.asarray(tokens)] * (np.sqrt(16) if scale else 1) + positions
    np.testing.assert_allclose(Embedding().apply(variables, tokens), expected, rtol=1e-6, atol=1e-6)
