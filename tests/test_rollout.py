"""Batched rollouts (lm/decode/rollout.py): ragged prompts, completions that stop at end_id, masks that
weight exactly the completion, the same program under a sharded mesh."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm import sharding
from lm.decode.generate import generate
from lm.decode.rollout import sample_completions
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
    prompts, lengths = ragged_prompts([17, 3, 9, 20, 5, 20, 18, 11], 20)
    expected, _ = greedy(params, prompts, lengths)
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "expert": 1, "tensor": 2})
    abstract = jax.eval_shape(MODEL.init, jax.random.key(0), jnp.zeros((1, CONFIG.context_length), jnp.int32))
    with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.DEFAULT_RULES):
        shardings = sharding.logical_shardings(abstract["params"], mesh, sharding.DEFAULT_RULES)
        sharded = jax.device_put(params, shardings)
        assert not sharded["token_embed"]["embedding"].sharding.is_fully_replicated
        tokens, _ = greedy(sharded, prompts, lengths)
    np.testing.assert_array_equal(tokens, expected)
