"""Autoregressive sampling from a GPT with a KV cache.

Each new token costs one position of the cache, not a re-run of the prefix. The learned position
table is as long as the context, so when the cache fills, it is rebuilt from the last half of the
context (one pass over context/2 tokens) and decoding carries on: the model always sees between
context/2 and context previous tokens.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from lm.models.gpt import GPT


def sample_logits(logits: jax.Array, rng: jax.Array, temperature: float, top_k: int, top_p: float = 1.0) -> jax.Array:
    """logits (B, V) -> token ids (B,): greedy at temperature 0, else softmax sampling at the temperature
    from the top_k most likely tokens (0: all), then from the smallest set of the most likely of those
    whose probabilities add up to top_p or more (nucleus sampling; 1: all), as transformers' warpers do."""
    if temperature == 0:
        return jnp.argmax(logits, axis=-1)
    return jax.random.categorical(rng, warped_logits(logits, temperature, top_k, top_p), axis=-1)


def warped_logits(logits: jax.Array, temperature: float, top_k: int, top_p: float) -> jax.Array:
    """logits (B, V) -> (B, V): divided by the temperature (> 0), -inf outside the top_k and then outside the
    nucleus of top_p (sample_logits)."""
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth_largest = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth_largest, -jnp.inf, logits)
    if top_p < 1:
        logits = jnp.where(logits < smallest_of_nucleus(logits, top_p), -jnp.inf, logits)
    return logits


def smallest_of_nucleus(logits: jax.Array, top_p: float) -> jax.Array:
    """logits (B, V) -> (B, 1): the smallest logit v whose tokens and those more likely hold top_p of the
    probability or more, the largest such v. It is the smallest logit of the nucleus: of the tokens sorted by
    probability, those with less than top_p ranked above them (ties with it included). Found without a sort
    (on a CPU a sort of the vocabulary costs more than the model's step): a bisection over the logits' 32-bit
    keys, which order as the floats do."""
    probs = jax.nn.softmax(logits, axis=-1)
    bits = jax.lax.bitcast_convert_type(logits, jnp.uint32)
    keys = jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(1 << 31))  # (B, V) float order as uint32 order

    def halve(_, bounds):  # invariant: the mass at keys >= low is >= top_p, at keys >= high it is not
        low, high = bounds
        middle = low + (high - low) // 2
        enough = jnp.sum(jnp.where(keys >= middle, probs, 0), axis=-1, keepdims=True) >= top_p
        return jnp.where(enough, middle, low), jnp.where(enough, high, middle)

    bounds = jnp.min(keys, axis=-1, keepdims=True), jnp.max(keys, axis=-1, keepdims=True) + 1
    low, _ = jax.lax.fori_loop(0, 32, halve, bounds)  # 32 halvings close any gap of uint32 keys
    return jnp.min(jnp.where(keys >= low, logits, jnp.inf), axis=-1, keepdims=True)


def empty_cache(model: GPT, batch_size: int, length: int | None = None):
    """Zeroed KV cache variables for batch_size sequences of `length` positions (None: the model's context
    length)."""
    tokens = jnp.zeros((batch_size, length or model.config.context_length), jnp.int32)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), tokens, decode=True)["cache"])
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


@functools.partial(jax.jit, static_argnames=("model", "temperature", "top_k", "top_p"))
def decode_segment(model: GPT, params, buffer, start, stop, known, rng, temperature, top_k, top_p):
    """Feeds buffer[:, start:stop] one token at a time into a fresh cache; the token after each
    fed position i is kept from the buffer if i + 1 < known, else sampled. buffer: (B, L) int32."""
    cache = empty_cache(model, buffer.shape[0])

    def body(i, carry):
        buffer, cache = carry
        token = jax.lax.dynamic_slice_in_dim(buffer, i, 1, axis=1)  # (B, 1)
        logits, variables = model.apply(
            {"params": params, "cache": cache}, token, decode=True, mutable=["cache"]
        )
        sampled = sample_logits(logits[:, -1], jax.random.fold_in(rng, i), temperature, top_k, top_p)
        given = jax.lax.dynamic_index_in_dim(buffer, i + 1, axis=1, keepdims=False)
        following = jnp.where(i + 1 < known, given, sampled).astype(buffer.dtype)
        buffer = jax.lax.dynamic_update_index_in_dim(buffer, following, i + 1, axis=1)
        return buffer, variables["cache"]

    buffer, _ = jax.lax.fori_loop(start, stop, body, (buffer, cache))
    return buffer


def generate(
    model: GPT,
    params,
    prompt: np.ndarray,
    max_new_tokens: int,
    rng: jax.Array,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> np.ndarray:
    """prompt (B, P) int32, P >= 1 -> (B, P + max_new_tokens) int32."""
    batch, prompt_length = prompt.shape
    if prompt_length < 1:
        raise ValueError("the prompt needs at least one token")
    context = model.config.context_length
    total = prompt_length + max_new_tokens
    buffer = jnp.zeros((batch, total), jnp.int32).at[:, :prompt_length].set(prompt)
    known = prompt_length
    start = max(0, prompt_length - context)
    while known < total:
        stop = min(start + context, total - 1)
        buffer = decode_segment(
            model, params, buffer, start, stop, known, jax.random.fold_in(rng, start),
            temperature, top_k, top_p,
        )
        known = stop + 1
        start = known - max(1, context // 2)  # re-feed the last half context, then go on
    return np.asarray(buffer)
