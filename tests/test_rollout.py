"""Batched rollouts (lm/decode/rollout.py): ragged prompts, completions that stop at end_id, masks that
weight exactly the completion, the same program under a sharded mesh."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm import sharding
from lm.decode.generate import generate, smallest_of_nucleus, warped_logits
from lm.decode.rollout import draw, sample_completions, sampled_tokens
from lm.layers.transformer import TransformerConfig
from lm.models.gpt import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=13, context_length=40,
                   transformer=TransformerConfig(num_layers=2, embed_dim=16, num_heads=4, num_kv_heads=2))
MODEL = GPT(CONFIG)
NEW = 8


@pytest.fixture(scope="module")
def params():
    boxed = jax.jit(MODEL.init)(jax.random.key(0), jnp.zeros((1, CONFIG.context_length), jnp.int32))["params"]
    return jax.tree.map(lambda p: 8 * p, nn.unbox(boxed))  # sharper, context-dependent predictions


def ragged_prompts(lengths, width, seed=1):
    """Random prompts of those lengths, right-padded to width with random tokens (padding must not matter)."""
    prompts = np.random.default_rng(seed).integers(0, CONFIG.vocab_size, (len(lengths), width), dtype=np.int32)
    return prompts, np.asarray(lengths, np.int32)


def greedy(params, prompts, lengths, end_id=None):
    tokens, mask = sample_completions(MODEL, params, prompts, lengths, NEW, jax.random.key(0), 0.0, 0, 1.0, end_id)
    return np.asarray(tokens), np.asarray(mask)


def test_greedy_completions_of_equal_prompts_are_generates(params):
    prompts, lengths = ragged_prompts([17, 17, 17], 17)  # a 15-token prefill, then one at a time
    tokens, mask = greedy(params, prompts, lengths)
    expected = generate(MODEL, params, prompts, NEW, jax.random.key(0), temperature=0.0)
    np.testing.assert_array_equal(tokens, expected)
    np.testing.assert_array_equal(mask, np.repeat([[0] * 17 + [1] * NEW], 3, axis=0))


def test_each_ragged_row_is_what_it_samples_alone(params):
    prompts, lengths = ragged_prompts([17, 3, 9], 17)
    tokens, mask = greedy(params, prompts, lengths)
    assert tokens.shape == mask.shape == (3, 17 + NEW) and tokens.dtype == np.int32 and mask.dtype == np.float32
    for row, length in enumerate(lengths):  # alone, padded with zeros rather than the batch's random tokens
        alone, _ = greedy(params, np.where(np.arange(17) < length, prompts[row], 0)[None], lengths[row:row + 1])
        np.testing.assert_array_equal(tokens[row], alone[0])
        np.testing.assert_array_equal(tokens[row, length + NEW:], 0)
        np.testing.assert_array_equal(np.flatnonzero(mask[row]), np.arange(length, length + NEW))
    # The check can fail: another row's padding in place of this row's prompt changes its completion.
    leaked, _ = greedy(params, np.concatenate([prompts[1:2, :3], prompts[0:1, 3:17]], 1), np.int32([17]))
    assert not np.array_equal(leaked[0, 17:], tokens[1, 3:3 + NEW])


def test_rows_stop_at_end_id_and_the_mask_covers_it(params):
    prompts, lengths = ragged_prompts([5, 12, 7], 12, seed=2)
    free, _ = greedy(params, prompts, lengths)
    end_id = int(free[0, 5 + 3])  # row 0's fourth new token
    tokens, mask = greedy(params, prompts, lengths, end_id)
    stopped = 0
    for row, length in enumerate(lengths):
        completion = free[row, length:length + NEW]
        hits = np.flatnonzero(completion == end_id)
        kept = hits[0] + 1 if len(hits) else NEW
        stopped += kept < NEW
        expected = np.zeros(12 + NEW, np.int32)
        expected[:length + kept] = free[row, :length + kept]
        np.testing.assert_array_equal(tokens[row], expected)
        np.testing.assert_array_equal(np.flatnonzero(mask[row]), np.arange(length, length + kept))
    assert stopped and tokens[0, 5 + 3] == end_id and tokens[0, 5 + 4:].sum() == 0


def test_sampling_is_a_function_of_the_key_and_rows_differ(params):
    prompts, lengths = ragged_prompts([6] * 8, 6)
    prompts[:] = prompts[0]  # one prompt, G = 8 samples of it

    def sample(seed):
        tokens, _ = sample_completions(MODEL, params, prompts, lengths, NEW, jax.random.key(seed), 1.0, 8, 0.9, None)
        return np.asarray(tokens)

    first = sample(3)
    np.testing.assert_array_equal(first, sample(3))
    assert not np.array_equal(first, sample(4))
    assert len({tuple(row) for row in first[:, 6:]}) > 1
    np.testing.assert_array_equal(first[:, :6], prompts)


def test_prompts_and_completions_must_fit_the_context(params):
    prompts, lengths = ragged_prompts([3, 4], 33)
    with pytest.raises(ValueError, match=r"33 positions plus max_new_tokens=8 make 41 positions, more than the "
                                         r"model's context_length of 40"):
        greedy(params, prompts, lengths)
    with pytest.raises(ValueError, match="prompt lengths must be between 1 and the prompts' width 4"):
        greedy(params, prompts[:, :4], np.int32([0, 4]))


def test_a_sharded_model_samples_what_one_device_samples(params):
    """The trainer's set-up: params sharded over data, fsdp and tensor by the logical axis rules."""
    prompts, lengths = ragged_prompts([17, 3, 9, 20, 5, 20, 18, 11], 20)

    def sampled(params):
        return np.asarray(sample_completions(MODEL, params, prompts, lengths, NEW, jax.random.key(5), 1.0, 5, 0.9,
                                             None)[0])

    expected = sampled(params)
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "expert": 1, "tensor": 2})
    abstract = jax.eval_shape(MODEL.init, jax.random.key(0), jnp.zeros((1, CONFIG.context_length), jnp.int32))
    with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.DEFAULT_RULES):
        shardings = sharding.logical_shardings(abstract["params"], mesh, sharding.DEFAULT_RULES)
        sharded = jax.device_put(params, shardings)
        assert not sharded["token_embed"]["embedding"].sharding.is_fully_replicated
        tokens = sampled(sharded)
    np.testing.assert_array_equal(tokens, expected)


def test_the_nucleus_found_without_a_sort_is_the_sorted_definition():
    """Against numpy on tied logits and masked-out ones: sorted by probability, a token is kept while the mass
    ranked above it is < top_p; the smallest kept logit (and so all its ties) is the threshold."""
    rng = np.random.default_rng(0)
    logits = np.round(rng.normal(0, 2, (64, 300)), 1).astype(np.float32)  # many ties
    logits[8:16] = 1 + np.arange(300, dtype=np.float32) * np.spacing(np.float32(1))  # neighbouring floats
    logits[:16, ::3] = -np.inf
    probs = np.asarray(jax.nn.softmax(logits, axis=-1), np.float64)
    for top_p in (0.05, 0.5, 0.9, 0.999):
        found = np.asarray(smallest_of_nucleus(jnp.asarray(logits), top_p))[:, 0]
        for row in range(len(logits)):
            order = np.argsort(-logits[row], kind="stable")
            above = np.cumsum(probs[row][order]) - probs[row][order]
            assert found[row] == logits[row][order][above < top_p].min(), (top_p, row)


def test_the_inverse_cdf_draw_follows_the_softmax():
    """20,000 draws from 10 tokens scattered over a vocabulary of 600 (three blocks, the last padded; the rest
    -inf): only those tokens, at their probabilities."""
    rng = np.random.default_rng(0)
    logits = np.full(600, -np.inf, np.float32)
    tokens = np.array([0, 3, 255, 256, 257, 400, 511, 512, 598, 599])
    logits[tokens] = rng.normal(0, 1, len(tokens))
    drawn = np.asarray(draw(jnp.broadcast_to(jnp.asarray(logits), (20_000, 600)), rng.random((20_000, 1))))
    assert set(drawn.tolist()) <= set(tokens.tolist())
    expected = np.asarray(jax.nn.softmax(logits[tokens]))
    observed = np.array([np.mean(drawn == t) for t in tokens])
    assert np.abs(observed - expected).sum() / 2 < 0.02, (observed, expected)


def test_drawing_a_few_rows_at_a_time_draws_what_all_at_once_would():
    """On a CPU the rows are warped and drawn 8 at a time (10 rows: a padded second chunk): the same tokens."""
    logits = jax.random.normal(jax.random.key(0), (10, 300)) * 3
    key = jax.random.key(1)
    whole = draw(warped_logits(logits, 0.7, 50, 0.8), jax.random.uniform(key, (10, 1)))
    np.testing.assert_array_equal(sampled_tokens(logits, key, 0.7, 50, 0.8), whole)
