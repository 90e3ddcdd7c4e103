"""lm/layers/heads.py against direct numpy formulas (shapes, masking, pooling), and the parameter
names the models kept when their heads became these modules (old checkpoints load)."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm.layers.heads import (
    MASKED_LOGIT,
    LMHead,
    PooledClassifier,
    RegressionHead,
    SpanHead,
    TokenTagger,
    pool,
)
from lm.layers.transformer import TransformerConfig
from lm.models.gpt import GPT, GPTConfig
from lm.models.vit import ViT, ViTConfig

RNG = np.random.default_rng(0)
HIDDEN = RNG.standard_normal((2, 5, 8)).astype(np.float32)  # (B, T, D)
MASK = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)


def init_apply(module: nn.Module, *args):
    """(params, output) with random (not zero-initialised) parameters."""
    params = module.init(jax.random.key(0), *args)["params"]
    params = jax.tree.map(lambda p: jnp.asarray(RNG.standard_normal(p.shape), p.dtype), nn.unbox(params))
    return jax.tree.map(np.asarray, params), module.apply({"params": params}, *args)


def test_pool_cls_and_masked_mean():
    x = jnp.asarray(HIDDEN)
    np.testing.assert_array_equal(pool(x, "cls"), HIDDEN[:, 0])
    expected = np.stack([HIDDEN[b][MASK[b]].mean(0) for b in range(2)])
    np.testing.assert_allclose(pool(x, "mean", jnp.asarray(MASK)), expected, rtol=1e-6)
    np.testing.assert_allclose(pool(x, "mean"), HIDDEN.mean(1), rtol=1e-6)
    with pytest.raises(ValueError, match="pool 'max'"):
        pool(x, "max")


@pytest.mark.parametrize("pooler", [False, True])
@pytest.mark.parametrize("kind", ["cls", "mean"])
def test_pooled_classifier(kind, pooler):
    params, logits = init_apply(PooledClassifier(3, kind, pooler), jnp.asarray(HIDDEN), jnp.asarray(MASK))
    assert logits.shape == (2, 3) and logits.dtype == jnp.float32
    pooled = HIDDEN[:, 0] if kind == "cls" else np.stack([HIDDEN[b][MASK[b]].mean(0) for b in range(2)])
    if pooler:  # BERT: tanh(W_p pooled + b_p)
        pooled = np.tanh(pooled @ params["pooler"]["kernel"] + params["pooler"]["bias"])
    else:
        assert "pooler" not in params
    np.testing.assert_allclose(logits, pooled @ params["head"]["kernel"] + params["head"]["bias"], rtol=1e-5,
                               atol=1e-5)


def test_pooled_classifier_ignores_masked_positions():
    module = PooledClassifier(3, "mean", pooler=True)
    params = module.init(jax.random.key(0), jnp.asarray(HIDDEN))
    changed = np.where(MASK[..., None], HIDDEN, 100.0)
    np.testing.assert_allclose(module.apply(params, jnp.asarray(changed), jnp.asarray(MASK)),
                               module.apply(params, jnp.asarray(HIDDEN), jnp.asarray(MASK)), rtol=1e-6)


def test_token_tagger():
    params, logits = init_apply(TokenTagger(4), jnp.asarray(HIDDEN))
    assert logits.shape == (2, 5, 4)
    np.testing.assert_allclose(logits, HIDDEN @ params["tagger"]["kernel"] + params["tagger"]["bias"], rtol=1e-5,
                               atol=1e-5)


def test_span_head_masks_positions():
    params, (start, end) = init_apply(SpanHead(), jnp.asarray(HIDDEN), jnp.asarray(MASK))
    assert start.shape == end.shape == (2, 5)
    both = HIDDEN @ params["span"]["kernel"] + params["span"]["bias"]  # (B, T, 2)
    for logits, column in ((start, 0), (end, 1)):
        np.testing.assert_allclose(np.asarray(logits)[MASK], both[..., column][MASK], rtol=1e-5, atol=1e-5)
        assert np.all(np.asarray(logits)[~MASK] == MASKED_LOGIT)
        probs = np.asarray(jax.nn.softmax(logits, axis=-1))  # over positions
        assert np.all(probs[~MASK] == 0.0) and np.allclose(probs.sum(-1), 1.0)


def test_regression_head():
    pooled = HIDDEN[:, 0]  # (B, D)
    params, values = init_apply(RegressionHead(), jnp.asarray(pooled))
    assert values.shape == (2,)
    expected = pooled @ params["regression"]["kernel"][:, 0] + params["regression"]["bias"][0]
    np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tied", [True, False])
def test_lm_head_cuts_the_padded_vocabulary(tied):
    class Model(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            table = nn.Embed(16, 8, name="token_embed")
            return LMHead(11, 16, table if tied else None, name="head")(table(tokens))

    tokens = jnp.asarray(RNG.integers(0, 11, (2, 5)))
    params, logits = init_apply(Model(), tokens)
    assert logits.shape == (2, 5, 11) and logits.dtype == jnp.float32
    hidden = params["token_embed"]["embedding"][np.asarray(tokens)]  # (B, T, D)
    weights = params["token_embed"]["embedding"].T if tied else params["head"]["lm_head"]["kernel"]  # (D, 16)
    assert ("head" in params) != tied  # tied: no parameters of its own
    np.testing.assert_allclose(logits, (hidden @ weights)[..., :11], rtol=1e-5, atol=1e-5)


def test_models_keep_their_head_parameter_names():
    blocks = TransformerConfig(num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=2)
    tokens = jnp.zeros((1, 8), jnp.int32)
    untied = nn.unbox(jax.eval_shape(GPT(GPTConfig(30, 8, blocks, tie_embeddings=False)).init, jax.random.key(0),
                                     tokens))
    assert untied["params"]["lm_head"]["kernel"].shape == (16, 64)  # vocabulary padded to 64
    tied = jax.eval_shape(GPT(GPTConfig(30, 8, blocks)).init, jax.random.key(0), tokens)
    assert set(tied["params"]) == {"token_embed", "position_embed", "decoder"}
    vit = ViT(ViTConfig(dataclasses.replace(blocks, position="none"), patch_size=8, pool="cls"))
    params = jax.eval_shape(vit.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))["params"]
    assert set(params["head"]) == {"kernel", "bias"} and "classifier" not in params
