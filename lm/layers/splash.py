"""Splash attention: the Pallas flash-attention kernel for TPU (jax.experimental.pallas.ops.tpu).

The kernel never builds the (T, S) score matrix: it walks blocks of 128 queries and keys, skipping
the blocks a causal mask hides entirely. It takes one example's (H, T, Dh) heads at a time and no
mask or bias array (the mask is a static causal or full pattern, and-ed with the example's segment
ids for rows of packed documents), so lengths must be multiples of the block. Under a mesh it runs
per device in a shard_map over the batch and head shards, the layout the logical rules give the
activations. Off TPU the same kernel runs in Pallas' interpret mode (slow; what the CPU tests check
it with).
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel, splash_attention_mask

BLOCK = 128  # query and key block of the kernel: sequence lengths must be multiples of it
HEADS_MAJOR_AXES = ("batch", "heads", "length", "kv")  # the (B, H, T, Dh) layout the kernel takes


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool, segment_ids: jax.Array | None,
                     interpret: bool, softcap: float = 0.0, scale: float | None = None) -> jax.Array:
    """softmax(q.k / sqrt(Dh)) v per head: q (B, T, H, Dh), k and v (B, S, K, Dh), K dividing H
    (grouped-query heads are repeated) -> (B, T, H, Dh). segment_ids (B, T) of self-attention over packed
    rows (T = S): a query sees only the keys of its own segment; None: no segments. softcap > 0: the scores
    are softcap * tanh(q.k / sqrt(Dh) / softcap) (the kernel's attn_logits_soft_cap). scale: q.k times scale
    instead of / sqrt(Dh) (None)."""
    groups = q.shape[2] // k.shape[2]
    k, v = (jnp.repeat(x, groups, axis=2) for x in (k, v))  # (B, S, H, Dh)
    q = q * jnp.asarray(1 / np.sqrt(q.shape[-1]) if scale is None else scale, q.dtype)
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))  # (B, H, L, Dh)

    def per_device(q, k, v, segment_ids):  # this device's shard: (b, h, T, Dh), (b, h, S, Dh), (b, T) or None
        heads, length, keys = q.shape[1], q.shape[2], k.shape[2]
        head_mask = (splash_attention_mask.CausalMask if causal else splash_attention_mask.FullMask)((length, keys))
        kernel = splash_attention_kernel.make_splash_mha(
            splash_attention_mask.MultiHeadMask([head_mask] * heads), head_shards=1, q_seq_shards=1,
            interpret=interpret, attn_logits_soft_cap=softcap or None,
        )
        segments = None if segment_ids is None else splash_attention_kernel.SegmentIds(segment_ids, segment_ids)
        return jax.vmap(kernel)(q, k, v, segments)  # over the examples

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        out = per_device(q, k, v, segment_ids)
    else:
        spec = nn.logical_to_mesh_axes(HEADS_MAJOR_AXES)
        segment_spec = None if segment_ids is None else nn.logical_to_mesh_axes(("batch", "length"))
        out = jax.shard_map(per_device, in_specs=(spec,) * 3 + (segment_spec,), out_specs=spec,
                            check_vma=False)(q, k, v, segment_ids)
    return out.transpose(0, 2, 1, 3)  # (B, T, H, Dh)
