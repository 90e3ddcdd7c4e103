"""Batched completions of ragged prompts for online RL (G samples per prompt, batched over prompts x G).

One jitted program with a KV cache as long as the rows: the first tokens that every prompt has are fed in
one chunk (prefill), then one position at a time for all rows together. A row keeps its own prompt token at
a position its prompt still covers and samples past it, so its completion starts right after its prompt and
the other rows' padding never enters it. The loop stops once every row has emitted end_id or its
max_new_tokens. Each output row is a training row as it is: inputs tokens[:, :-1], targets tokens[:, 1:],
weights completion_mask[:, 1:].

All of it is jnp: under a mesh (jax.set_mesh and flax's logical axis rules) it runs with the params
sharded as the trainer shards them.
"""

import functools

import jax
import jax.numpy as jnp

from lm.decode.generate import empty_cache, warped_logits
from lm.models.gpt import GPT

PREFILL_MULTIPLE = 16  # the prefill's length is a multiple of this, minus one: few shapes, few compiles
DRAW_BLOCK = 256  # tokens per block of the inverse-CDF draw (draw)
CPU_SAMPLE_ROWS = 8  # rows warped and drawn at a time on a CPU (sampled_tokens)


def sample_completions(
    model: GPT,
    params,
    prompts: jax.Array,
    prompt_lengths: jax.Array,
    max_new_tokens: int,
    rng: jax.Array,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    end_id: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """prompts (B, P) int32, right-padded (row b's prompt is prompts[b, :prompt_lengths[b]], lengths 1..P),
    prompt_lengths (B,) int32 -> tokens (B, P + max_new_tokens) int32 and completion_mask (same shape,
    float32).

    Row b of tokens is its prompt, then its completion from position prompt_lengths[b] (max_new_tokens
    tokens, or fewer: up to and including the first end_id), then zeros; completion_mask is 1 on the
    completion's tokens and 0 elsewhere. Temperature 0 is greedy; else the token at position i is drawn
    (sampled_tokens) from the logits as lm.decode.generate.sample_logits warps them (temperature, top_k, top_p)
    with the key fold_in(rng, i - 1), so the result is a function of rng.
    """
    batch, width = prompts.shape
    total = width + max_new_tokens
    context = model.config.context_length
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1 (it is {max_new_tokens})")
    if total > context:
        raise ValueError(f"prompts of {width} positions plus max_new_tokens={max_new_tokens} make {total} "
                         f"positions, more than the model's context_length of {context}; shorten the prompts "
                         "or the completions")
    shortest, longest = (int(n) for n in jnp.stack([jnp.min(prompt_lengths), jnp.max(prompt_lengths)]))
    if shortest < 1 or longest > width:
        raise ValueError(f"prompt lengths must be between 1 and the prompts' width {width} "
                         f"(they are {shortest} to {longest})")
    prefill = max(0, shortest // PREFILL_MULTIPLE * PREFILL_MULTIPLE - 1)
    return _rollout(model, params, jnp.asarray(prompts, jnp.int32), jnp.asarray(prompt_lengths, jnp.int32), rng,
                    jnp.int32(-1 if end_id is None else end_id), max_new_tokens=max_new_tokens, prefill=prefill,
                    temperature=temperature, top_k=top_k, top_p=top_p)


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "prefill", "temperature", "top_k", "top_p"))
def _rollout(model: GPT, params, prompts, prompt_lengths, rng, end_id, *, max_new_tokens: int, prefill: int,
             temperature: float, top_k: int, top_p: float) -> tuple[jax.Array, jax.Array]:
    """sample_completions' program: feed tokens[:, :prefill] in one chunk, then position i = prefill, ... one
    at a time; the token after position i is the row's prompt token while i + 1 < its prompt length, else
    sampled (zero once the row is done). end_id -1: no end token."""
    batch, width = prompts.shape
    total = width + max_new_tokens
    positions = jnp.arange(total)[None]  # (1, T)
    tokens = jnp.where(positions < prompt_lengths[:, None], jnp.pad(prompts, ((0, 0), (0, max_new_tokens))), 0)
    last = prompt_lengths + max_new_tokens - 1  # (B,) the position of each row's last possible token

    cache = empty_cache(model, batch, total)
    if prefill:  # its logits go unused (the loop recomputes position prefill - 1's), so XLA drops the head
        _, variables = model.apply({"params": params, "cache": cache}, tokens[:, :prefill], decode=True,
                                   mutable=["cache"])
        cache = variables["cache"]

    def step(carry):
        i, tokens, cache, done = carry
        token = jax.lax.dynamic_slice_in_dim(tokens, i, 1, axis=1)  # (B, 1)
        logits, variables = model.apply({"params": params, "cache": cache}, token, decode=True, mutable=["cache"])
        sampled = sampled_tokens(logits[:, -1], jax.random.fold_in(rng, i), temperature, top_k, top_p)
        in_prompt = i + 1 < prompt_lengths  # (B,)
        given = jax.lax.dynamic_index_in_dim(tokens, i + 1, axis=1, keepdims=False)
        following = jnp.where(in_prompt, given, jnp.where(done, 0, sampled)).astype(jnp.int32)
        tokens = jax.lax.dynamic_update_index_in_dim(tokens, following, i + 1, axis=1)
        done = done | (~in_prompt & ((following == end_id) | (i + 1 >= last)))
        return i + 1, tokens, variables["cache"], done

    def running(carry):  # every row is done by position total - 1 (its last is at most P + N - 1)
        return ~jnp.all(carry[-1])

    start = (jnp.int32(prefill), tokens, cache, jnp.zeros((batch,), bool))
    _, tokens, _, _ = jax.lax.while_loop(running, step, start)
    return tokens, completion_mask(tokens, prompt_lengths, last, end_id)


def completion_mask(tokens: jax.Array, prompt_lengths: jax.Array, last: jax.Array, end_id: jax.Array) -> jax.Array:
    """(B, T) float32: 1 from each row's prompt length to its first end_id (included) or, without one, to its
    last position `last` (B,); 0 elsewhere."""
    positions = jnp.arange(tokens.shape[1])[None]  # (1, T)
    completion = (positions >= prompt_lengths[:, None]) & (positions <= last[:, None])
    ends = completion & (tokens == end_id)
    first_end = jnp.where(jnp.any(ends, axis=1), jnp.argmax(ends, axis=1), last)  # (B,)
    return (completion & (positions <= first_end[:, None])).astype(jnp.float32)


def sampled_tokens(logits: jax.Array, rng: jax.Array, temperature: float, top_k: int, top_p: float) -> jax.Array:
    """logits (B, V) -> token ids (B,): the most likely at temperature 0, else drawn (draw, one uniform number of
    rng a row) from the logits as lm.decode.generate.sample_logits warps them. On a CPU, CPU_SAMPLE_ROWS rows at a
    time, so that the passes over their vocabulary-wide arrays run in the cache (at 256 rows of GPT-2's
    vocabulary, ten times faster than all rows at once); elsewhere all at once."""
    if temperature == 0:
        return jnp.argmax(logits, axis=-1)
    batch, vocab = logits.shape
    uniform = jax.random.uniform(rng, (batch, 1))
    rows = CPU_SAMPLE_ROWS if jax.default_backend() == "cpu" else batch
    padding = ((0, -batch % rows), (0, 0))
    chunks = (jnp.pad(logits, padding).reshape(-1, rows, vocab), jnp.pad(uniform, padding).reshape(-1, rows, 1))
    tokens = jax.lax.map(lambda chunk: draw(warped_logits(chunk[0], temperature, top_k, top_p), chunk[1]), chunks)
    return tokens.reshape(-1)[:batch]


def draw(logits: jax.Array, uniform: jax.Array) -> jax.Array:
    """logits (B, V), uniform (B, 1) numbers in [0, 1) -> token ids (B,), each drawn from its row's softmax by the
    inverse of its cumulative distribution at its number: one random number a row rather than
    jax.random.categorical's V (generating those costs a CPU more than the model's step). The cumulative sums
    are taken in blocks of DRAW_BLOCK tokens: over the blocks' totals, then within the block the number falls
    in."""
    batch, vocab = logits.shape
    weights = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))  # (B, V), 0 where the logit is -inf
    blocks = jnp.pad(weights, ((0, 0), (0, -vocab % DRAW_BLOCK))).reshape(batch, -1, DRAW_BLOCK)  # (B, N, K)
    through_block = jnp.cumsum(jnp.sum(blocks, axis=-1), axis=-1)  # (B, N)
    total = through_block[:, -1:]
    target = jnp.minimum(uniform * total, jnp.nextafter(total, 0))  # in [0, total)
    block = jnp.sum(through_block <= target, axis=-1)  # (B,) the first block whose running total passes it
    before = jnp.where(block > 0, jnp.take_along_axis(through_block, block[:, None] - 1, axis=-1)[:, 0], 0)
    within = jnp.cumsum(jnp.take_along_axis(blocks, block[:, None, None], axis=1)[:, 0], axis=-1)  # (B, K)
    rest = jnp.minimum(target[:, 0] - before, jnp.nextafter(within[:, -1], 0))  # rounding kept inside the block
    return block * DRAW_BLOCK + jnp.sum(within <= rest[:, None], axis=-1)
