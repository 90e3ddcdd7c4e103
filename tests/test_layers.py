"""Norms, MLPs, position schemes and attention against direct numpy implementations of their formulas."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm.layers.attention import MultiHeadAttention, combine_masks, padding_mask
from lm.layers.initializers import initializers
from lm.layers.mlp import Mlp, mlp_hidden_dim
from lm.layers.norms import Norm
from lm.layers.positions import alibi_bias, alibi_slopes, apply_rope, sincos_2d_table, sinusoidal_table

RNG = np.random.default_rng(0)


def random(*shape, scale=1.0):
    return (scale * RNG.standard_normal(shape)).astype(np.float32)


def init_params(module, *inputs, **kwargs):
    params = nn.unbox(module.init(jax.random.key(0), *inputs, **kwargs)["params"])
    # Random values everywhere (biases and norm scales too), so every term of the formula matters.
    leaves, tree = jax.tree.flatten(params)
    return jax.tree.unflatten(tree, [random(*leaf.shape, scale=0.5) for leaf in leaves])


# ---------------------------------------------------------------- norms


def test_layer_norm_matches_numpy():
    x = random(2, 5, 8, scale=3.0) + 1.0
    params = init_params(Norm("layer"), x)
    y = Norm("layer").apply({"params": params}, x)
    scale, bias = params["LayerNorm_0"]["scale"], params["LayerNorm_0"]["bias"]
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(y, (x - mean) / np.sqrt(var + 1e-5) * scale + bias, atol=1e-5)


def test_rms_norm_matches_numpy():
    x = random(2, 5, 8, scale=3.0) + 1.0
    params = init_params(Norm("rms"), x)
    y = Norm("rms").apply({"params": params}, x)
    assert set(params["RMSNorm_0"]) == {"scale"}  # no bias, no centring
    expected = x / np.sqrt(1e-5 + np.mean(x**2, -1, keepdims=True)) * params["RMSNorm_0"]["scale"]
    np.testing.assert_allclose(y, expected, atol=1e-5)


# ---------------------------------------------------------------- MLPs


def gelu_tanh(h):
    return 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))


def silu(h):
    return h / (1 + np.exp(-h))


def dense(params, x):
    return x @ params["kernel"] + params["bias"]


@pytest.mark.parametrize("kind", ["gelu", "relu", "swiglu"])
def test_mlp_matches_numpy(kind):
    x = random(2, 3, 8)
    module = Mlp(kind=kind, hidden_dim=12)
    params = init_params(module, x)
    y = module.apply({"params": params}, x)
    if kind == "swiglu":
        hidden = silu(dense(params["gate"], x)) * dense(params["up"], x)
    else:
        up = dense(params["up"], x)
        hidden = gelu_tanh(up) if kind == "gelu" else np.maximum(up, 0)
    np.testing.assert_allclose(y, dense(params["down"], hidden), atol=1e-5)


def mlp_param_count(kind, embed_dim, multiple):
    hidden = mlp_hidden_dim(kind, embed_dim, 4, multiple)
    x = jnp.zeros((1, 1, embed_dim))
    shapes = jax.eval_shape(lambda: Mlp(kind=kind, hidden_dim=hidden, use_bias=False).init(jax.random.key(0), x))
    return sum(math.prod(s.shape) for s in jax.tree.leaves(shapes))


@pytest.mark.parametrize("embed_dim, multiple", [(128, 8), (384, 64), (768, 64)])
def test_swiglu_parameter_count_within_one_percent_of_the_classic_mlp(embed_dim, multiple):
    classic = mlp_param_count("gelu", embed_dim, multiple)
    swiglu = mlp_param_count("swiglu", embed_dim, multiple)
    assert classic == 8 * embed_dim**2
    assert abs(swiglu - classic) / classic < 0.01, (swiglu, classic)
    assert mlp_hidden_dim("swiglu", embed_dim, 4, multiple) % multiple == 0


# ---------------------------------------------------------------- positions


def test_sinusoidal_table_matches_the_paper():
    positions, dim = np.arange(0, 50, 7), 16
    expected = np.zeros((len(positions), dim))
    for row, p in enumerate(positions):
        for i in range(dim // 2):
            expected[row, 2 * i] = np.sin(p / 10000 ** (2 * i / dim))
            expected[row, 2 * i + 1] = np.cos(p / 10000 ** (2 * i / dim))
    np.testing.assert_allclose(sinusoidal_table(jnp.asarray(positions), dim), expected, atol=1e-5)


def test_sincos_2d_table_encodes_row_and_column():
    height, width, dim = 3, 4, 16
    table = np.asarray(sincos_2d_table(height, width, dim))
    omega = 1 / 10000 ** (np.arange(dim // 4) / (dim // 4))
    for r in range(height):
        for c in range(width):
            expected = np.concatenate(
                [np.sin(r * omega), np.cos(r * omega), np.sin(c * omega), np.cos(c * omega)]
            )
            np.testing.assert_allclose(table[r * width + c], expected, atol=1e-6)


def rope_numpy(x, positions, base=10000.0):
    """x (B, T, H, Dh): rotate the channel pairs (i, i + Dh/2) by angle p * base^(-2i/Dh)."""
    out = np.empty_like(x)
    half = x.shape[-1] // 2
    for t, p in enumerate(positions):
        for i in range(half):
            angle = p * base ** (-2 * i / x.shape[-1])
            a, b = x[:, t, :, i], x[:, t, :, i + half]
            out[:, t, :, i] = a * np.cos(angle) - b * np.sin(angle)
            out[:, t, :, i + half] = a * np.sin(angle) + b * np.cos(angle)
    return out


def test_rope_matches_numpy():
    x = random(2, 5, 3, 8)
    positions = np.array([0, 1, 2, 10, 100])
    np.testing.assert_allclose(apply_rope(jnp.asarray(x), jnp.asarray(positions)), rope_numpy(x, positions),
                               atol=1e-4)


def test_rope_score_depends_only_on_the_relative_offset():
    q, k = random(1, 1, 1, 16), random(1, 1, 1, 16)

    def score(query_position, key_position):
        rq = apply_rope(jnp.asarray(q), jnp.array([query_position]))
        rk = apply_rope(jnp.asarray(k), jnp.array([key_position]))
        return float(jnp.sum(rq * rk))

    for shift in [1, 7, 250]:
        assert score(9, 4) == pytest.approx(score(9 + shift, 4 + shift), abs=1e-4)
        assert score(4, 9) == pytest.approx(score(4 + shift, 9 + shift), abs=1e-4)
    assert abs(score(9, 4) - score(9, 5)) > 1e-3  # and it does depend on the offset


def test_alibi_slopes_follow_the_paper():
    np.testing.assert_allclose(alibi_slopes(8), [2.0 ** -(i + 1) for i in range(8)])
    np.testing.assert_allclose(alibi_slopes(4), [2.0 ** -(2 * (i + 1)) for i in range(4)])
    # 6 heads: the 4-head slopes, then every other slope of 8 heads (1/2, 1/8).
    np.testing.assert_allclose(alibi_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])


def test_alibi_bias_is_minus_slope_times_distance():
    bias = np.asarray(alibi_bias(4, jnp.arange(3), jnp.arange(5), causal=True))
    slopes = alibi_slopes(4)
    for h in range(4):
        for i in range(3):
            for j in range(5):
                assert bias[0, h, i, j] == pytest.approx(-slopes[h] * (i - j))
    symmetric = np.asarray(alibi_bias(4, jnp.arange(3), jnp.arange(5), causal=False))
    assert symmetric[0, 0, 0, 4] == pytest.approx(-slopes[0] * 4)


# ---------------------------------------------------------------- attention


def attention_numpy(params, x, kv, num_heads, num_kv_heads, mask=None, bias=None, causal=False):
    """softmax(q k^T / sqrt(Dh) + bias, masked) v, each query head reading key head h // (H / K)."""
    def project(p, source):
        return np.einsum("bsd,dhk->bshk", source, p["kernel"]) + p["bias"]

    q, k, v = project(params["query"], x), project(params["key"], kv), project(params["value"], kv)
    batch, length, _, head_dim = q.shape
    keys = kv.shape[1]
    out = np.zeros_like(q)
    group = num_heads // num_kv_heads
    weights = np.zeros((batch, num_heads, length, keys))
    for b in range(batch):
        for h in range(num_heads):
            scores = q[b, :, h] @ k[b, :, h // group].T / np.sqrt(head_dim)  # (T, S)
            if bias is not None:
                scores = scores + bias[0, h]
            allowed = np.ones((length, keys), bool)
            if mask is not None:
                allowed &= np.broadcast_to(mask, (batch, num_heads, length, keys))[b, h]
            if causal:
                allowed &= np.tril(np.ones((length, keys), bool))
            scores = np.where(allowed, scores, -np.inf)
            w = np.exp(scores - scores.max(-1, keepdims=True))
            w /= w.sum(-1, keepdims=True)
            weights[b, h] = w
            out[b, :, h] = w @ v[b, :, h // group]
    y = np.einsum("bthk,hkd->btd", out, params["out"]["kernel"]) + params["out"]["bias"]
    return y, weights


def make_attention(**kwargs):
    return MultiHeadAttention(num_heads=4, num_kv_heads=kwargs.pop("num_kv_heads", 2), head_dim=4, **kwargs)


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])  # multi-head, grouped-query, multi-query
@pytest.mark.parametrize("capture_weights", [False, True])  # fused and explicit paths
def test_causal_self_attention_with_padding_matches_numpy(num_kv_heads, capture_weights):
    x = random(2, 6, 8)
    valid = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], bool)
    module = make_attention(num_kv_heads=num_kv_heads, causal=True)
    params = init_params(module, x)
    mask = padding_mask(jnp.asarray(valid))
    y, state = module.apply({"params": params}, x, mask=mask, capture_weights=capture_weights,
                            mutable=["intermediates"])
    expected, weights = attention_numpy(params, x, x, 4, num_kv_heads, mask=np.asarray(mask), causal=True)
    np.testing.assert_allclose(y, expected, atol=1e-4)
    if capture_weights:
        captured = state["intermediates"]["attention_weights"][0]
        np.testing.assert_allclose(captured, weights, atol=1e-5)
        assert np.all(np.asarray(captured)[1, :, :, 4:] == 0)  # padding keys get exactly zero weight
        assert np.all(np.asarray(captured)[:, :, np.triu_indices(6, 1)[0], np.triu_indices(6, 1)[1]] == 0)


def test_cross_attention_with_padding_and_an_arbitrary_mask_matches_numpy():
    x, memory = random(2, 3, 8), random(2, 5, 8)
    valid = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], bool)
    pattern = RNG.random((2, 4, 3, 5)) < 0.7  # any per-head pattern, combined with the padding
    pattern[..., 0] = True  # every query keeps at least one key
    module = make_attention()
    params = init_params(module, x, memory)
    mask = combine_masks(padding_mask(jnp.asarray(valid)), jnp.asarray(pattern))
    for capture in [False, True]:
        y, state = module.apply({"params": params}, x, memory, mask=mask, capture_weights=capture,
                                mutable=["intermediates"])
        expected, weights = attention_numpy(params, x, memory, 4, 2, mask=np.asarray(mask))
        np.testing.assert_allclose(y, expected, atol=1e-4)
    captured = np.asarray(state["intermediates"]["attention_weights"][0])
    assert np.all(captured[1, :, :, 2:] == 0) and np.all(captured[~np.broadcast_to(pattern, captured.shape)] == 0)


@pytest.mark.parametrize("causal", [True, False])
def test_alibi_attention_matches_numpy_on_both_paths(causal):
    x = random(2, 6, 8)
    module = make_attention(causal=causal, position="alibi")
    params = init_params(module, x)
    bias = np.asarray(alibi_bias(4, jnp.arange(6), jnp.arange(6), causal))
    expected, _ = attention_numpy(params, x, x, 4, 2, bias=bias, causal=causal)
    for capture in [False, True]:
        y, _ = module.apply({"params": params}, x, capture_weights=capture, mutable=["intermediates"])
        np.testing.assert_allclose(y, expected, atol=1e-4)


def test_rope_attention_is_invariant_to_shifting_all_positions():
    x = random(1, 6, 8)
    module = make_attention(causal=True, position="rope")
    params = init_params(module, x)
    y = module.apply({"params": params}, x)
    shifted = module.apply({"params": params}, x, positions=jnp.arange(6) + 37)
    np.testing.assert_allclose(y, shifted, atol=1e-4)
    no_rope = make_attention(causal=True).apply({"params": params}, x)
    assert not np.allclose(y, no_rope, atol=1e-3)


def test_attention_dropout_acts_on_the_weights_only_in_training():
    x = random(2, 6, 8)
    module = make_attention(causal=True, dropout=0.5)
    params = init_params(module, x)
    plain = module.apply({"params": params}, x)
    np.testing.assert_allclose(plain, make_attention(causal=True).apply({"params": params}, x), atol=1e-6)
    a = module.apply({"params": params}, x, train=True, rngs={"dropout": jax.random.key(1)})
    b = module.apply({"params": params}, x, train=True, rngs={"dropout": jax.random.key(1)})
    c = module.apply({"params": params}, x, train=True, rngs={"dropout": jax.random.key(2)})
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, plain, atol=1e-3) and not np.allclose(a, c, atol=1e-3)


@pytest.mark.parametrize("position", ["none", "rope", "alibi"])
def test_kv_cache_decoding_equals_full_attention(position):
    x = random(2, 8, 8)
    module = make_attention(causal=True, position=position)
    params = init_params(module, x)
    full = module.apply({"params": params}, x)
    cache = jax.tree.map(jnp.zeros_like, module.init(jax.random.key(0), x, cache_index=0)["cache"])
    outputs = []
    for start, stop in [(0, 3), (3, 4), (4, 5), (5, 8)]:
        y, variables = module.apply({"params": params, "cache": cache}, x[:, start:stop],
                                    cache_index=jnp.asarray(start), mutable=["cache"])
        cache = variables["cache"]
        outputs.append(y)
    np.testing.assert_allclose(jnp.concatenate(outputs, axis=1), full, atol=1e-5)


# ---------------------------------------------------------------- initialisation


@pytest.mark.parametrize(
    "scheme, dense_std, residual_std, embedding_std",
    [
        ("gpt2", 0.02, 0.02 / math.sqrt(2 * 6), 0.02),
        ("normal", 0.02, 0.02, 0.02),
        ("xavier", math.sqrt(2 / (256 + 1024)), math.sqrt(2 / (256 + 1024)), 1 / 16),
        ("small", math.sqrt(2 / (5 * 256)), 2 / (6 * 16), math.sqrt(2 / (5 * 256))),
    ],
)
def test_init_schemes_give_their_documented_scales(scheme, dense_std, residual_std, embedding_std):
    inits = initializers(scheme, embed_dim=256, num_layers=6)
    key = jax.random.key(0)
    assert np.std(inits.dense(key, (256, 1024))) == pytest.approx(dense_std, rel=0.03)
    assert np.std(inits.residual(key, (1024, 256))) == pytest.approx(residual_std, rel=0.03)
    assert np.std(inits.embedding(key, (1000, 256))) == pytest.approx(embedding_std, rel=0.03)
