"""GPT invariants: causality, KV-cache decoding, norm placement, logical axis names."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm.decode.generate import empty_cache, generate
from lm.layers.transformer import MoeConfig, TransformerConfig
from lm.models.gpt import GPT, GPTConfig

BLOCKS = TransformerConfig(num_layers=2, embed_dim=16, num_heads=4, num_kv_heads=2)
CONFIG = GPTConfig(vocab_size=11, context_length=12, transformer=BLOCKS)


def with_blocks(**changes) -> GPTConfig:
    return dataclasses.replace(CONFIG, transformer=dataclasses.replace(BLOCKS, **changes))


def init(config=CONFIG, seed=0):
    model = GPT(config)
    tokens = jnp.zeros((1, config.context_length), jnp.int32)
    return model, nn.unbox(jax.jit(model.init)(jax.random.key(seed), tokens)["params"])


@functools.partial(jax.jit, static_argnames=("model", "decode", "mutable"))
def apply(model, variables, tokens, decode=False, mutable=False):
    """model.apply, jitted: these tests call it many times."""
    return model.apply(variables, tokens, decode=decode, mutable=mutable)


def random_tokens(shape, seed=1, vocab=CONFIG.vocab_size):
    return jax.random.randint(jax.random.key(seed), shape, 0, vocab)


@pytest.mark.parametrize(
    "changes", [{}, {"moe": MoeConfig(num_experts=4, every=1, top_k=2, capacity_factor=0.5)}], ids=["dense", "moe"]
)
def test_changing_later_tokens_leaves_earlier_logits_unchanged(changes):
    model, params = init(with_blocks(**changes))  # the MoE's capacity drops tokens, still causally
    tokens = random_tokens((3, 12))
    t = 5
    changed = tokens.at[:, t + 1 :].set((tokens[:, t + 1 :] + 3) % CONFIG.vocab_size)
    logits = apply(model, {"params": params}, tokens)
    logits_changed = apply(model, {"params": params}, changed)
    np.testing.assert_allclose(logits[:, : t + 1], logits_changed[:, : t + 1], atol=1e-6)
    assert not np.allclose(logits[:, t + 1 :], logits_changed[:, t + 1 :], atol=1e-3)


@pytest.mark.parametrize(
    "changes",
    [{}, {"position": "rope"}, {"position": "alibi", "norm": "rms", "mlp": "swiglu"},
     {"position": "sinusoidal", "moe": MoeConfig(num_experts=4, top_k=2, capacity_factor=4.0)}],
)
def test_kv_cache_decoding_equals_full_recomputation(changes):
    model, params = init(with_blocks(**changes))
    tokens = random_tokens((2, 12))
    full = apply(model, {"params": params}, tokens)  # (B, T, V)
    cache = empty_cache(model, batch_size=2)
    # A 5-token prefill, then one token at a time.
    step_logits = []
    for start, stop in [(0, 5)] + [(i, i + 1) for i in range(5, 12)]:
        logits, variables = apply(
            model, {"params": params, "cache": cache}, tokens[:, start:stop], decode=True, mutable=("cache",)
        )
        cache = variables["cache"]
        step_logits.append(logits)
    np.testing.assert_allclose(jnp.concatenate(step_logits, axis=1), full, atol=1e-5)


def greedy_reference(model, params, out, window_start):
    """Token p recomputed from scratch: argmax of the model on out[window_start(p):p]."""
    return np.stack(
        [np.argmax(apply(model, {"params": params}, jnp.asarray(out[:, window_start(p) : p]))[:, -1], -1)
         for p in range(3, out.shape[1])],
        axis=1,
    )


@pytest.mark.slow
def test_greedy_generation_matches_recomputation_over_its_windows():
    model, params = init()
    params = jax.tree.map(lambda p: 8 * p, params)  # sharper, context-dependent predictions
    prompt = np.asarray(random_tokens((2, 3)))
    out = generate(model, params, prompt, max_new_tokens=20, rng=jax.random.key(0), temperature=0.0)
    assert out.shape == (2, 23)
    np.testing.assert_array_equal(out[:, :3], prompt)
    # Context 12: tokens up to 12 see everything before them; then the cache is rebuilt from the
    # last half context (6 tokens) each time it fills: tokens 13-19 see from 7, 20-22 from 14.
    def window_start(p):
        return 0 if p <= 12 else 7 if p <= 19 else 14

    np.testing.assert_array_equal(out[:, 3:], greedy_reference(model, params, out, window_start))
    # The check can fail: a model that always sees the whole context predicts differently.
    assert not np.array_equal(out[:, 3:], greedy_reference(model, params, out, lambda p: max(0, p - 12)))


@pytest.mark.parametrize("position", ["none", "sinusoidal", "rope", "alibi"])
def test_functional_positions_run_past_the_training_length(position):
    model, params = init(with_blocks(position=position))  # context_length 12
    tokens = random_tokens((2, 30))
    logits = apply(model, {"params": params}, tokens)
    assert logits.shape == (2, 30, CONFIG.vocab_size) and np.all(np.isfinite(logits))
    # Still causal, and the first 12 positions are what the model computes on 12 tokens.
    np.testing.assert_allclose(logits[:, :12], apply(model, {"params": params}, tokens[:, :12]), atol=1e-5)


def test_learned_positions_refuse_sequences_past_their_table():
    model, params = init()
    with pytest.raises(ValueError, match="learned positions cover 12 tokens, got a sequence of 13"):
        apply(model, {"params": params}, random_tokens((1, 13)))


def test_pre_and_post_norm_build_different_graphs():
    pre_model, pre_params = init(CONFIG)
    post_model, post_params = init(with_blocks(norm_position="post"))
    assert "norm_final" in pre_params["decoder"] and "norm_final" not in post_params["decoder"]
    tokens = random_tokens((1, 12))
    pre = apply(pre_model, {"params": pre_params}, tokens)
    # Same weights for the shared parameters, different placement: different outputs.
    shared = dict(pre_params, decoder={k: v for k, v in pre_params["decoder"].items() if k != "norm_final"})
    post = apply(post_model, {"params": shared}, tokens)
    assert not np.allclose(pre, post, atol=1e-3)


def test_untied_head_adds_an_output_matrix():
    tied_model, tied = init()
    untied_model, untied = init(dataclasses.replace(CONFIG, tie_embeddings=False))
    assert "lm_head" in untied and "lm_head" not in tied
    assert untied["lm_head"]["kernel"].shape == (16, 64)  # vocab padded to a multiple of 64


def test_every_parameter_carries_logical_axis_names():
    model = GPT(CONFIG)
    boxed = model.init(jax.random.key(0), jnp.zeros((1, 12), jnp.int32))["params"]
    leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    assert leaves and all(isinstance(leaf, nn.LogicallyPartitioned) for leaf in leaves)
    for leaf in leaves:
        assert len(leaf.names) == leaf.value.ndim
    specs = nn.get_partition_spec(boxed)
    assert tuple(specs["decoder"]["block_0"]["mlp"]["up"]["kernel"]) == ("embed", "mlp")
    assert tuple(specs["decoder"]["block_0"]["attention"]["query"]["kernel"]) == ("embed", "heads", "kv")


def test_bfloat16_compute_keeps_float32_params():
    model, params = init(with_blocks(dtype=jnp.bfloat16))
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
    logits = apply(model, {"params": params}, random_tokens((1, 12)))
    assert logits.dtype == jnp.float32
    _, params32 = init()
    logits32 = GPT(CONFIG).apply({"params": params32}, random_tokens((1, 12)))
    np.testing.assert_allclose(logits, logits32, atol=0.05)


def test_scaled_embeddings_equal_a_table_scaled_by_sqrt_d():
    """scale_embeddings multiplies the token embeddings (not the untied output layer) by sqrt(D): the
    same logits as the unscaled model with its token table times sqrt(16) = 4."""
    untied = dataclasses.replace(with_blocks(position="sinusoidal"), tie_embeddings=False)
    model, params = init(untied)
    scaled = GPT(dataclasses.replace(untied, scale_embeddings=True))
    tokens = random_tokens((2, 12))
    bigger = {**params, "token_embed": {"embedding": params["token_embed"]["embedding"] * 4.0}}
    np.testing.assert_allclose(apply(scaled, {"params": params}, tokens),
                               apply(model, {"params": bigger}, tokens), rtol=1e-5, atol=1e-5)
    assert not np.allclose(apply(scaled, {"params": params}, tokens), apply(model, {"params": params}, tokens))
