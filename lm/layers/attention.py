"""Multi-head self-attention with grouped key/value heads and a KV cache for decoding."""

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm.layers.linear import Linear
from lm.layers.partitioning import constrain


class MultiHeadAttention(nn.Module):
    """Self-attention through `jax.nn.dot_product_attention` (fused kernels where available).

    `num_kv_heads` < `num_heads` gives grouped-query attention (1 = multi-query).
    Decoding (causal only): call with `cache_index` (a scalar, the absolute position of x[:, 0]); keys and values
    are written into a 'cache' collection of length `cache_length` (fixed when the cache is
    initialised, from the length of the input given to `init`).
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int
    causal: bool = True
    use_bias: bool = True
    dtype: Any = jnp.float32
    kernel_init: Callable = nn.initializers.normal(0.02)
    out_kernel_init: Callable = nn.initializers.normal(0.02)

    @nn.compact
    def __call__(self, x: jax.Array, cache_index: jax.Array | None = None) -> jax.Array:
        batch, length, embed_dim = x.shape
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )

        def projection(heads: int, name: str) -> jax.Array:  # (B, T, D) -> (B, T, heads, Dh)
            return Linear(
                (embed_dim,),
                (heads, self.head_dim),
                ("embed", "heads", "kv"),
                use_bias=self.use_bias,
                dtype=self.dtype,
                kernel_init=self.kernel_init,
                name=name,
            )(x)

        q = constrain(projection(self.num_heads, "query"), ("batch", "length", "heads", "kv"))
        k = constrain(projection(self.num_kv_heads, "key"), ("batch", "length", "heads", "kv"))
        v = constrain(projection(self.num_kv_heads, "value"), ("batch", "length", "heads", "kv"))

        if cache_index is None:
            out = jax.nn.dot_product_attention(q, k, v, is_causal=self.causal)
        else:
            k, v, mask = self._update_cache(k, v, cache_index)
            out = jax.nn.dot_product_attention(q, k, v, mask=mask)
        out = constrain(out, ("batch", "length", "heads", "kv"))  # (B, T, H, Dh)

        return Linear(  # (B, T, H, Dh) -> (B, T, D)
            (self.num_heads, self.head_dim),
            (embed_dim,),
            ("heads", "kv", "embed"),
            use_bias=self.use_bias,
            dtype=self.dtype,
            kernel_init=self.out_kernel_init,
            name="out",
        )(out)

    def _update_cache(self, k: jax.Array, v: jax.Array, cache_index: jax.Array):
        """Writes k, v (B, T, K, Dh) at cache_index; returns the full cache and its mask."""
        batch, length, kv_heads, head_dim = k.shape
        cached_k = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
        cached_v = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
        if self.is_initializing():  # the cache takes the shape of the input given to init
            return k, v, None
        cache_length = cached_k.value.shape[1]
        start = (0, cache_index, 0, 0)
        cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k.astype(cached_k.value.dtype), start)
        cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v.astype(cached_v.value.dtype), start)
        # Query i sits at absolute position cache_index + i and sees keys at positions <= that.
        query_pos = cache_index + jnp.arange(length)[:, None]  # (T, 1)
        key_pos = jnp.arange(cache_length)[None, :]  # (1, S)
        mask = (key_pos <= query_pos)[None, None]  # (1, 1, T, S)
        return cached_k.value, cached_v.value, jnp.broadcast_to(mask, (batch, 1, length, cache_length))
