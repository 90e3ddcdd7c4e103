"""Splash attention: the Pallas flash-attention kernel for TPU (jax.experimental.pallas.ops.tpu).

The kernel never builds the (T, S) score matrix: it walks blocks of 128 queries and keys, skipping
the blocks a causal mask hides entirely. It takes one example's (H, T, Dh) heads at a time and no
mask or bias array (the mask is a static causal or full pattern), so lengths must be multiples of
the block. Under a mesh it runs per device in a shard_map over the batch and head shards, the
layout the logical rules give the activations. Off TPU the same kernel runs in Pallas' interpret
mode (slow; what the CPU tests check it with).
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel, splash_attention_mask

BLOCK = 128  # query and key block of the kernel: sequence lengths must be multiples of it
HEADS_MAJOR_AXES = ("batch", "heads", "length", "kv")  # the (B, H, T, Dh) layout the kernel takes


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool, interpret: bool) -> jax.Array:
    """softmax(q.k / sqrt(Dh)) v per head: q (B, T, H, Dh), k and v (B, S, K, Dh), K dividing H
    (grouped-query heads are repeated) -> (B, T, H, Dh)."""
    groups = q.shape[2] // k.shape[2]
    k, v = (jnp.repeat(x, groups, axis=2) for x in (k, v))  # (B, S, H, Dh)
    q = q * jnp.asarray(1 / np.sqrt(q.shape[-1]), q.dtype)
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))  # (B, H, L, Dh)

    def per_device(q, k, v):  # this device's shard: (b, h, T, Dh), (b, h, S, Dh)
        heads, length, keys = q.shape[1], q.shape[2], k.shape[2]
        head_mask = (splash_attention_mask.CausalMask if causal else splash_attention_mask.FullMask)((length, keys))
        kernel = splash_attention_kernel.make_splash_mha(
            splash_attention_mask.MultiHeadMask([head_mask] * heads), head_shards=1, q_seq_shards=1,
            interpret=interpret,
        )
        return jax.vmap(kernel)(q, k, v)  # over the examples

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        out = per_device(q, k, v)
    else:
        spec = nn.logical_to_mesh_axes(HEADS_MAJOR_AXES)
        out = jax.shard_map(per_device, in_specs=(spec,) * 3, out_specs=spec, check_vma=False)(q, k, v)
    return out.transpose(0, 2, 1, 3)  # (B, T, H, Dh)
