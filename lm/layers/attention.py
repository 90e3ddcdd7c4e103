"""Multi-head attention: self or cross, grouped key/value heads, masks, RoPE/ALiBi, KV cache.

One module serves every model. The fused path runs the implementation `attention_implementation`
picks: cuDNN's flash attention on GPU and the Pallas splash kernel on TPU where they apply (causal or
full attention without a mask array), XLA's otherwise. Rows of packed documents carry segment ids:
splash takes them as they are, cuDNN, XLA and the explicit path as a (B, 1, T, T) mask. The explicit
path computes the softmax weights itself; it runs when they are needed: dropout on the weights during
training, or `capture_weights=True`, which sows them as 'intermediates'/'attention_weights' (B, H, T, S)
for visualisation; and for soft-capped scores (softcap > 0: s -> softcap * tanh(s / softcap), Gemma 2) on
the XLA path, since jax.nn.dot_product_attention takes no cap (splash caps in its kernel, cuDNN cannot).
qk_norm: RMSNorm over each head's queries and keys (one scale of Dh per projection), before RoPE.
All paths give the same output.

Context parallel (a mesh whose 'context' axis the rules give the activations' sequence dimension, 'length'):
each device holds a chunk of every row's queries, keys and values, and self-attention takes one of three forms
(CONTEXT_PARALLEL). all_gather: the keys and values are gathered over the axis (Llama 3's form), so each device
attends from its queries to the whole row. ring: the blocks of keys and values go round the axis (ppermute),
each device merging its queries' scores over the blocks with an online softmax (ring_attention). ring_zigzag:
the ring over the zig-zag layout (layout_order), in which device i holds the chunks i and 2n-1-i of the row's 2n,
so that under a causal mask every device needs half of each other device's block (ZIGZAG_QUARTERS), the same
work everywhere; the model puts its tokens in that order at its entry (context_order) and back at its exit.
Masks, biases and positions are those of the whole row, so the output is one device's. All run on XLA.
"""

import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lm.errors import UserError
from lm.layers.linear import Linear
from lm.layers.lora import LoraConfig
from lm.layers.partitioning import constrain, mesh_axes, param_init
from lm.layers.positions import RopeScaling, alibi_bias, apply_rope
from lm.layers.splash import splash_attention

ACTIVATION_AXES = ("batch", "length", "heads", "kv")
GATHERED_AXES = ("batch", None, "heads", "kv")  # keys and values under context parallelism: the whole row
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "splash")
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
CONTEXT_PARALLEL = ("all_gather", "ring", "ring_zigzag")  # the forms of self-attention over a split sequence
RING_LAYOUTS = {"ring": "contiguous", "ring_zigzag": "zigzag"}  # the ring forms' layouts of the row (layout_order)
# Under a causal mask, the quarters (query half, key half) of the block from another device that the zig-zag ring
# computes, the others being masked throughout: (from an earlier device, from a later one). Device i holds chunks i
# and 2n-1-i; an earlier device's chunk j < i comes before both of them (its chunk 2n-1-j after both), and a later
# device's chunks j > i and 2n-1-j both come before 2n-1-i and after i. The block from the device itself is computed
# whole, and so is every block of the contiguous ring: its hops run in lockstep and each has a device with a whole
# block to compute, so skipping would save no time.
ZIGZAG_QUARTERS = ({(0, 0), (1, 0)}, {(1, 0), (1, 1)})


SOFTCAP_NEED = "attention scores without a soft-cap (jax.nn.dot_product_attention's cuDNN path takes none)"
CONTEXT_NEED = "a mesh without a context axis (a sequence split over devices runs on XLA)"


def context_shards() -> int:
    """The number of devices the activations' sequence dimension ('length') is split over under the mesh and
    logical rules in scope; 1: none."""
    mesh = jax.sharding.get_abstract_mesh()
    if not nn.get_logical_axis_rules() or mesh.empty:
        return 1
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))
    (axes,) = mesh_axes(("length",))
    return math.prod(sizes[axis] for axis in axes)


def chunks_per_device(form: str) -> int:
    """The pieces of the row each device of the context axis holds under model.context_parallel=form: 2 for the
    zig-zag layout, else 1 (the sequence length must be a multiple of this times the devices)."""
    return 2 if RING_LAYOUTS.get(form) == "zigzag" else 1


def check_split(length: int, shards: int, form: str) -> None:
    """UserError where a row of `length` tokens does not split over the `shards` devices of the context axis in
    the layout of model.context_parallel=form."""
    per_device = chunks_per_device(form)
    if length % (shards * per_device):
        layout = f" as {per_device} chunks each (model.context_parallel={form})" if per_device > 1 else ""
        raise UserError(f"a sequence of {length} tokens cannot be split over the {shards} devices of mesh.context"
                        f"{layout}; make the sequence length a multiple of {shards * per_device} or change "
                        "mesh.context")


def layout_order(length: int, shards: int, layout: str) -> np.ndarray:
    """(length,) the index in the row of the token at each place of the layout; device d of the `shards` holds
    places [d * length / shards, (d + 1) * length / shards). contiguous: the row as it is. zigzag: the row cut
    into 2 * shards chunks, device d holding chunk d then chunk 2 * shards - 1 - d (under a causal mask every
    device then has the same work: an early chunk with little to attend to and a late one with much)."""
    if layout == "contiguous":
        return np.arange(length)
    pieces = 2 * shards
    chunks = np.arange(length).reshape(pieces, length // pieces)
    return np.concatenate([chunks[[d, pieces - 1 - d]].ravel() for d in range(shards)])


def context_order(length: int, form: str) -> np.ndarray | None:
    """The order a model puts its row of `length` tokens in before its Transformer for model.context_parallel=form
    under the mesh in scope (layout_order), or None: the row's own (no zig-zag layout, or no context axis)."""
    shards = context_shards()
    if chunks_per_device(form) == 1 or shards == 1:
        return None
    check_split(length, shards, form)
    return layout_order(length, shards, RING_LAYOUTS[form])


def attention_implementation(requested: str, platform: str, dtype, head_dim: int, lengths: tuple[int, int],
                             has_mask_or_bias: bool, has_segments: bool = False, softcap: float = 0.0,
                             context_split: bool = False) -> str:
    """The fused attention for a call with query and key lengths (T, S): 'cudnn', 'splash' or 'xla'.
    has_segments: the rows are packed documents whose segment ids confine attention. softcap: the scores'
    soft-cap (0: none). context_split: the sequence is split over a context axis of the mesh (XLA only).

    cudnn   cuDNN flash attention (jax.nn.dot_product_attention): GPU, bf16/fp16, head_dim % 8 == 0 and
            <= 128, no mask or bias array (causal or full attention), no soft-cap. Packed rows go to it with
            their segment ids as a dense mask (the public call takes no segment ids; its cuDNN path adds the
            mask as a bias), which its training kernel takes for even T and S only.
    splash  the Pallas TPU kernel (lm/layers/splash.py): T and S multiples of 128, no mask or bias array
            (segment ids are fine); off TPU it runs interpreted (slow: for tests).
    xla     XLA's attention (jax.nn.dot_product_attention; with a soft-cap, the explicit path): anything, anywhere.
    auto    cudnn on GPU and splash on TPU where they apply, else xla. Asking for cudnn or splash where
            it does not apply is a UserError saying why.
    """
    no_array = ("attention without a mask or bias array (padding masks, ALiBi and KV-cache decoding have one)",
                has_mask_or_bias)
    needs = {
        "cudnn": [
            (f"even sequence lengths for packed rows (cuDNN takes their documents as a mask, added as a bias; "
             f"they are {lengths[0]} and {lengths[1]})", has_segments and any(n % 2 for n in lengths)),
            (f"a GPU (this is {platform})", platform != "gpu"),
            (f"bfloat16 or float16 compute (model.compute_dtype is {jnp.dtype(dtype).name})",
             jnp.dtype(dtype) not in CUDNN_DTYPES),
            (f"a head dimension that is a multiple of 8 up to 128 (it is {head_dim})", head_dim % 8 or head_dim > 128),
            no_array,
            (SOFTCAP_NEED, softcap > 0),
            (CONTEXT_NEED, context_split),
        ],
        "splash": [
            (f"sequence lengths that are multiples of 128 (they are {lengths[0]} and {lengths[1]})",
             any(n % 128 for n in lengths)),
            no_array,
            (CONTEXT_NEED, context_split),
        ],
    }
    if requested == "auto":
        preferred = {"gpu": "cudnn", "tpu": "splash"}.get(platform)
        return preferred if preferred and not any(failed for _, failed in needs[preferred]) else "xla"
    unmet = [reason for reason, failed in needs.get(requested, []) if failed]
    if unmet:
        raise UserError(f"model.attention_impl={requested} needs {unmet[0]}; use attention_impl=auto or xla")
    return requested


def fallback_note(requested: str, platform: str, softcap: float) -> str | None:
    """One line saying that attention runs on XLA, not the fused kernel `auto` prefers on this platform,
    because of the scores' soft-cap; None where the soft-cap changes nothing (no cap, a kernel that caps, or
    an explicit choice, which attention_implementation checks)."""
    if requested == "auto" and platform == "gpu" and softcap > 0:
        return (f"attention: XLA, not cuDNN: model.attention_softcap={softcap} needs {SOFTCAP_NEED}; "
                "set attention_softcap=0 for the fused kernel")
    return None


def capped(scores: jax.Array, softcap: float) -> jax.Array:
    """softcap * tanh(scores / softcap): scores squashed into (-softcap, softcap), near-identity well inside
    it; softcap 0: scores unchanged."""
    return softcap * jnp.tanh(scores / softcap) if softcap else scores


def padding_mask(key_valid: jax.Array) -> jax.Array:
    """key_valid (B, S) bool -> (B, 1, 1, S): no query attends to a padding key."""
    return key_valid[:, None, None, :]


def causal_mask(query_positions: jax.Array, key_positions: jax.Array) -> jax.Array:
    """(T,), (S,) absolute positions -> (1, 1, T, S): a query sees keys at its position or before."""
    return (key_positions[None, :] <= query_positions[:, None])[None, None]


def segment_mask(segment_ids: jax.Array) -> jax.Array:
    """segment_ids (B, T) -> (B, 1, T, T): a query sees only the keys of its own segment (document)."""
    return (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]


def combine_masks(*masks: jax.Array | None) -> jax.Array | None:
    """Logical AND of the masks given (None = no constraint), broadcast together."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    combined = present[0]
    for mask in present[1:]:
        combined = jnp.logical_and(combined, mask)
    return combined


def attention_scores(q: jax.Array, k: jax.Array, bias: jax.Array | None, mask: jax.Array | None,
                     softcap: float = 0.0, scale: float | None = None) -> jax.Array:
    """capped(q.k / sqrt(Dh), softcap) + bias in float32, masked to the float32 minimum: q (B, T, H, Dh),
    k (B, S, K, Dh) -> (B, H, T, S). scale: q.k times scale instead of / sqrt(Dh)."""
    batch, length, num_heads, head_dim = q.shape
    kv_heads = k.shape[2]
    grouped = q.reshape(batch, length, kv_heads, num_heads // kv_heads, head_dim)  # (B, T, K, G, Dh)
    logits = jnp.einsum("btkgd,bskd->bkgts", grouped, k, preferred_element_type=jnp.float32)
    logits = logits.reshape(batch, num_heads, length, k.shape[1])
    logits = logits / jnp.sqrt(head_dim).astype(jnp.float32) if scale is None else logits * scale
    logits = capped(logits, softcap)
    if bias is not None:
        logits = logits + bias
    if mask is not None:  # a fully masked row comes out uniform, as in the fused path
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    return logits


def attention_weights(q: jax.Array, k: jax.Array, bias: jax.Array | None, mask: jax.Array | None,
                      softcap: float = 0.0, scale: float | None = None) -> jax.Array:
    """softmax(capped(q.k / sqrt(Dh), softcap) + bias) over keys, masked: q (B, T, H, Dh), k (B, S, K, Dh) ->
    (B, H, T, S). scale: q.k times scale instead of / sqrt(Dh)."""
    return jax.nn.softmax(attention_scores(q, k, bias, mask, softcap, scale), axis=-1)


def weighted_values(weights: jax.Array, v: jax.Array) -> jax.Array:
    """weights (B, H, T, S), v (B, S, K, Dh) -> (B, T, H, Dh)."""
    batch, num_heads, length, keys = weights.shape
    kv_heads = v.shape[2]
    grouped = weights.reshape(batch, kv_heads, num_heads // kv_heads, length, keys).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", grouped, v)  # (B, T, K, G, Dh)
    return out.reshape(batch, length, num_heads, v.shape[-1])


def ring_attention(q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array, segment_ids: jax.Array | None,
                   causal: bool, alibi: bool, softcap: float = 0.0, scale: float | None = None,
                   layout: str = "contiguous") -> jax.Array:
    """Self-attention with the sequence split over the mesh axes of 'length' (the context axis), by ring:
    q (B, T, H, Dh), k and v (B, T, K, Dh), positions (T,) or (B, T), segment_ids (B, T) or None -> (B, T, H, Dh),
    the tokens in the order of `layout` (layout_order: contiguous, or zigzag). Each device keeps its chunk of
    queries; the chunks of keys and values (with their positions and segment ids) go round the axis, one step per
    device, and each block's scores merge into a running maximum, denominator and weighted sum (the online
    softmax). causal masks by index within the row, as the fused path; in the zig-zag layout only the two quarters
    of another device's block that ZIGZAG_QUARTERS names are computed, half the block: one the same whichever
    device it is, the other picked (jnp.where) by whether that device comes before this one. alibi biases the
    scores by the query and key positions. The other mesh axes stay with XLA."""
    (axes,) = mesh_axes(("length",))
    shards = context_shards()
    batch, length, num_heads = q.shape[:3]
    rows = (batch, length)
    positions = jnp.broadcast_to(positions, rows)
    segments = jnp.zeros(rows, jnp.int32) if segment_ids is None else segment_ids
    order = jnp.asarray(layout_order(length, shards, layout))  # the index in the row of each place
    chunk = length // shards
    balanced = causal and layout == "zigzag"

    def half(tree, which: int):  # the first (0) or second (1) half of the chunk: every leaf's axis 1
        return jax.tree.map(lambda a: a[:, which * chunk // 2:(which + 1) * chunk // 2], tree)

    def with_half(tree, which: int, new):
        return jax.tree.map(lambda a, b: a.at[:, which * chunk // 2:(which + 1) * chunk // 2].set(b), tree, new)

    def merge(state, queries, keys):
        """The running (maximum, denominator, sum) (B, t', H), (B, t', H), (B, t', H, Dh) of the queries (q, positions,
        segments, indices in the row) with the scores against the keys (k, v, positions, segments, indices)."""
        (q, query_positions, query_segments, query_index), (k, v, key_positions, key_segments, key_index) = \
            queries, keys
        mask = query_segments[:, :, None] == key_segments[:, None, :]  # (B, t', s')
        if causal:
            mask = jnp.logical_and(mask, key_index[:, None, :] <= query_index[:, :, None])
        bias = alibi_bias(num_heads, query_positions, key_positions, causal) if alibi else None
        logits = attention_scores(q, k, bias, mask[:, None], softcap, scale)  # (B, H, t', s')
        peak, total, out = state
        new_peak = jnp.maximum(peak, logits.max(axis=-1).transpose(0, 2, 1))
        weights = jnp.exp(logits - new_peak.transpose(0, 2, 1)[..., None])
        rescale = jnp.exp(peak - new_peak)
        out = out * rescale[..., None] + weighted_values(weights, v).astype(jnp.float32)
        return new_peak, total * rescale + weights.sum(axis=-1).transpose(0, 2, 1), out

    def merge_half(state, queries, keys, before):
        """merge of the half of the keys' block that ZIGZAG_QUARTERS names, from a device before this one or not:
        the quarters both cases need, then one of each case's own, picked."""
        earlier, later = ZIGZAG_QUARTERS
        for part_q, part_k in sorted(earlier & later):
            state = with_half(state, part_q, merge(half(state, part_q), half(queries, part_q), half(keys, part_k)))

        def pick(if_before, if_after):
            return jax.tree.map(lambda a, b: jnp.where(before, a, b), if_before, if_after)

        for (q_before, k_before), (q_after, k_after) in zip(sorted(earlier - later), sorted(later - earlier),
                                                              strict=True):
            merged = merge(pick(half(state, q_before), half(state, q_after)),
                           pick(half(queries, q_before), half(queries, q_after)),
                           pick(half(keys, k_before), half(keys, k_after)))
            state = with_half(state, q_before, pick(merged, half(state, q_before)))
            state = with_half(state, q_after, pick(half(state, q_after), merged))
        return state

    def per_device(q, k, v, positions, segments):  # this device's chunk of t tokens
        here = jax.lax.axis_index(axes)

        def index(device):  # (B, t): the index in the row of the device's tokens
            return jnp.broadcast_to(jax.lax.dynamic_slice_in_dim(order, device * chunk, chunk), segments.shape)

        queries = (q, positions, segments, index(here))
        state = (jnp.full((batch, chunk, num_heads), jnp.finfo(jnp.float32).min),  # running maximum
                 jnp.zeros((batch, chunk, num_heads)),  # denominator
                 jnp.zeros(q.shape, jnp.float32))  # weighted sum of the values
        block = (k, v, positions, segments)
        for step in range(shards):  # the block of device here - step
            source = (here - step) % shards
            keys = (*block, index(source))
            if step == 0 or not balanced:
                state = merge(state, queries, keys)
            else:
                state = merge_half(state, queries, keys, source < here)
            if step + 1 < shards:
                block = jax.lax.ppermute(block, axes, [(j, (j + 1) % shards) for j in range(shards)])
        _, total, out = state
        return (out / total[..., None]).astype(q.dtype)

    spec = jax.sharding.PartitionSpec(None, axes)
    return jax.shard_map(per_device, in_specs=(spec,) * 5, out_specs=spec, axis_names=set(axes),
                         check_vma=False)(q, k, v, positions, segments)


class MultiHeadAttention(nn.Module):
    """Attention from x (B, T, D) to kv (B, S, D) (kv=None: self-attention) -> (B, T, D).

    num_kv_heads < num_heads gives grouped-query attention (1 = multi-query).
    causal: query i sees keys at positions <= i. mask: bool, broadcastable to (B, H, T, S), True
    where a query may attend (padding via `padding_mask`, or any pattern); combined with causal.
    position: 'rope' rotates q and k, 'alibi' biases the scores, anything else does nothing here
    (positions in self-attention only). positions: (T,) absolute positions of x, default 0..T-1, or
    (B, T) per row. segment_ids (self-attention, not decoding): (B, T) ids of the documents packed in
    each row; a query sees only keys of its own segment (with causal, the earlier ones of its document).
    Decoding (self-attention): pass cache_index, the absolute position of x[:, 0]; keys and values
    go into a 'cache' collection whose length is fixed by the input given to `init`.
    lora: the LoRA adapters of the projections query, key, value and out that its targets name.
    qk_norm: RMSNorm (epsilon norm_epsilon) over each head's queries and keys. softcap > 0: the scores q.k / sqrt(Dh)
    are capped to softcap * tanh(. / softcap) before bias and mask. scale: the scores are q.k * scale, not
    q.k / sqrt(Dh) (None), on every path (μP's sqrt(Dh0) / Dh: TransformerConfig.attention_scale).
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int
    causal: bool = False
    position: str = "none"
    rope_base: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()  # how RoPE's frequencies are stretched (lm/layers/positions.py)
    dropout: float = 0.0  # on the attention weights
    use_bias: bool = True
    dtype: Any = jnp.float32
    implementation: str = "auto"  # of the fused path: see attention_implementation
    kernel_init: Callable = nn.initializers.normal(0.02)
    out_kernel_init: Callable = nn.initializers.normal(0.02)
    lora: LoraConfig = LoraConfig()
    qk_norm: bool = False
    norm_epsilon: float = 1e-6  # of qk_norm
    softcap: float = 0.0
    scale: float | None = None  # of the scores q.k; None: 1 / sqrt(head_dim)
    # Self-attention over a sequence split over devices: CONTEXT_PARALLEL. With ring_zigzag the caller gives the
    # tokens (x, positions, segment_ids) in the order of context_order.
    context_parallel: str = "all_gather"

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        kv: jax.Array | None = None,
        *,
        mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        cache_index: jax.Array | None = None,
        train: bool = False,
        capture_weights: bool = False,
    ) -> jax.Array:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")
        self_attention = kv is None
        if cache_index is not None and not self_attention:
            raise ValueError("the KV cache is for self-attention; pass kv=None when decoding")
        if segment_ids is not None and not (self_attention and cache_index is None):
            raise ValueError("segment_ids are for self-attention over packed rows, not cross-attention or decoding")
        kv = x if self_attention else kv
        embed_dim = x.shape[-1]

        def projection(source: jax.Array, heads: int, name: str) -> jax.Array:  # (B, L, D) -> (B, L, heads, Dh)
            y = Linear(
                (embed_dim,),
                (heads, self.head_dim),
                ("embed", "heads", "kv"),
                use_bias=self.use_bias,
                dtype=self.dtype,
                kernel_init=self.kernel_init,
                adapter=self.lora.adapter(name, train),
                name=name,
            )(source)
            return constrain(y, ACTIVATION_AXES)

        q = projection(x, self.num_heads, "query")  # (B, T, H, Dh)
        k = projection(kv, self.num_kv_heads, "key")  # (B, S, K, Dh)
        v = projection(kv, self.num_kv_heads, "value")  # (B, S, K, Dh)
        if self.qk_norm:  # over Dh, per head
            q, k = (nn.RMSNorm(epsilon=self.norm_epsilon, dtype=self.dtype, name=f"{name}_norm",
                               scale_init=param_init(nn.initializers.ones, ("kv",)))(y)
                    for y, name in ((q, "query"), (k, "key")))

        length = x.shape[1]
        if positions is None:
            positions = jnp.arange(length) if cache_index is None else cache_index + jnp.arange(length)
        if self_attention and self.position == "rope":
            q = apply_rope(q, positions, self.rope_base, self.rope_scaling)
            k = apply_rope(k, positions, self.rope_base, self.rope_scaling)

        use_causal_flag = self.causal and cache_index is None
        key_positions = positions if self_attention else jnp.arange(kv.shape[1])
        if cache_index is not None:
            k, v = self._update_cache(k, v, cache_index)
            key_positions = jnp.arange(k.shape[1])
            mask = combine_masks(mask, causal_mask(positions, key_positions))
        bias = None
        if self_attention and self.position == "alibi":
            bias = alibi_bias(self.num_heads, positions, key_positions, self.causal)

        shards = context_shards()
        layout = RING_LAYOUTS.get(self.context_parallel)
        ring = shards > 1 and layout is not None and self_attention and cache_index is None
        if shards > 1:
            if cache_index is None:
                check_split(length, shards, self.context_parallel)
            if not ring:  # the all-gather form: this device's queries see the whole row's keys and values
                k, v = (constrain(y, GATHERED_AXES) for y in (k, v))

        segments = None if segment_ids is None else segment_mask(segment_ids)
        platform = jax.default_backend()
        explicit = capture_weights or (train and self.dropout > 0)
        implementation = "xla" if explicit else attention_implementation(
            self.implementation, platform, q.dtype, self.head_dim, (length, k.shape[1]),
            mask is not None or bias is not None, segment_ids is not None, self.softcap, shards > 1,
        )
        if ring:
            if explicit or mask is not None:
                raise UserError(f"model.context_parallel={self.context_parallel} takes no attention dropout, captured "
                                "weights or mask array (padding); use model.context_parallel=all_gather")
            out = ring_attention(q, k, v, positions, segment_ids, use_causal_flag, self.position == "alibi",
                                 self.softcap, self.scale, layout)
        elif explicit or (self.softcap and implementation == "xla"):  # jax.nn.dot_product_attention takes no cap
            if use_causal_flag:  # by index, as the fused path's is_causal (packed rows restart their positions)
                mask = combine_masks(mask, causal_mask(jnp.arange(length), jnp.arange(k.shape[1])))
            mask = combine_masks(mask, segments)
            weights = attention_weights(q, k, bias, mask, self.softcap, self.scale)  # (B, H, T, S)
            if capture_weights:
                self.sow("intermediates", "attention_weights", weights)
            weights = nn.Dropout(self.dropout, deterministic=not train)(weights)
            out = weighted_values(weights, v)
        else:
            if implementation == "splash":
                out = splash_attention(q, k, v, use_causal_flag, segment_ids, interpret=platform != "tpu",
                                       softcap=self.softcap, scale=self.scale)
            else:
                mask = combine_masks(mask, segments)
                if mask is not None:
                    mask = jnp.broadcast_to(mask, (mask.shape[0], mask.shape[1], length, k.shape[1]))
                out = jax.nn.dot_product_attention(
                    q, k, v, bias=None if bias is None else bias.astype(q.dtype), mask=mask,
                    scale=self.scale, is_causal=use_causal_flag, implementation=implementation,
                )
        out = constrain(out, ACTIVATION_AXES)  # (B, T, H, Dh)

        return Linear(  # (B, T, H, Dh) -> (B, T, D)
            (self.num_heads, self.head_dim),
            (embed_dim,),
            ("heads", "kv", "embed"),
            use_bias=self.use_bias,
            dtype=self.dtype,
            kernel_init=self.out_kernel_init,
            adapter=self.lora.adapter("out", train),
            name="out",
        )(out)

    def _update_cache(self, k: jax.Array, v: jax.Array, cache_index: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Writes k, v (B, T, K, Dh) at cache_index; returns the whole cache (B, S, K, Dh) each."""
        cached_k = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
        cached_v = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
        if self.is_initializing():  # the cache takes the shape of the input given to init
            return k, v
        start = (0, cache_index, 0, 0)
        cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k.astype(cached_k.value.dtype), start)
        cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v.astype(cached_v.value.dtype), start)
        return cached_k.value, cached_v.value
