"""Recurrent pieces for the seq2seq models: cells with named axes, a masked bidirectional encoder, attention.

Notation: B batch, S source length, E embedding width, H recurrent state width, A attention width,
D memory width (2H for a bidirectional encoder).

- `masked_softmax(scores, mask)`: softmax over the last axis with masked scores set to the finite
  float32 minimum (never -inf): a row with some real position gives padding exactly zero weight
  (exp underflows to 0); a row with none (a dummy batch row) comes out uniform, never NaN.
- `AdditiveAttention` (Bahdanau et al. 2015):
      e_i = v^T tanh(W_s s + W_h h_i)        (no biases)
      a   = masked_softmax(e, mask)
      c   = sum_i a_i h_i
  `keys(h)` = W_h h_i is computed once per source sentence; `__call__` adds the per-step query W_s s.
- `LuongAttention` (Luong et al. 2015), query = the *current* decoder state s_t:
      dot:     e_i = s_t . k_i with k_i = h_i (the caller makes the widths match)
      general: e_i = s_t . (W_a h_i) = s_t^T W_a h_i, W_a: (D -> H), no bias
      a = masked_softmax(e, mask); c = sum_i a_i v_i
- `BidirectionalEncoder`: a forward and a backward `nn.RNN` (scans, no Python loop over time), both given
  `seq_lengths` = the number of real tokens, so with right padding the backward direction starts at each
  sentence's true last token and the final states are those after the last real token. Outputs at padding
  positions are zeroed.
"""

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm.errors import UserError
from lm.layers.partitioning import LogicalAxes, param_init

CELLS = ("gru", "lstm")
LUONG_KINDS = ("dot", "general")
MASKED = float(jnp.finfo(jnp.float32).min)  # finite "minus large" for masked scores


def masked_softmax(scores: jax.Array, mask: jax.Array) -> jax.Array:
    """softmax(scores) over the last axis where mask is nonzero; masked entries get exactly 0 weight."""
    scores = jnp.where(mask > 0, scores.astype(jnp.float32), MASKED)  # (..., S)
    return jax.nn.softmax(scores, axis=-1)  # (..., S)


def dense(features: int, axes: LogicalAxes, use_bias: bool = True, dtype: Any = jnp.float32, name: str | None = None):
    """nn.Dense whose kernel (and bias) carry logical axis names."""
    return nn.Dense(
        features,
        use_bias=use_bias,
        dtype=dtype,
        kernel_init=param_init(nn.initializers.lecun_normal(), axes),
        bias_init=param_init(nn.initializers.zeros, axes[-1:]),
        name=name,
    )


def make_cell(kind: str, features: int, dtype: Any = jnp.float32, name: str | None = None) -> nn.RNNCellBase:
    """A GRU or LSTM cell of width `features`; kernels named (input "embed", "mlp"), recurrent (None, "mlp").

    Carry: GRU h (B, H); LSTM (c, h), each (B, H). The cell's output is h."""
    kwargs: dict[str, Callable | Any] = dict(
        features=features,
        dtype=dtype,
        kernel_init=param_init(nn.initializers.lecun_normal(), ("embed", "mlp")),
        recurrent_kernel_init=param_init(nn.initializers.orthogonal(), (None, "mlp")),
        bias_init=param_init(nn.initializers.zeros, ("mlp",)),
        name=name,
    )
    if kind == "gru":
        return nn.GRUCell(**kwargs)
    if kind == "lstm":
        return nn.LSTMCell(**kwargs)
    raise UserError(f"model.cell={kind!r}: use one of {list(CELLS)}")


def carry_output(kind: str, carry: Any) -> jax.Array:
    """The state vector h (B, H) of a cell's carry (the LSTM carry is (c, h))."""
    return carry[1] if kind == "lstm" else carry


class BidirectionalEncoder(nn.Module):
    """Stacked bidirectional GRU/LSTM over right-padded sequences.

    x (B, S, E), mask (B, S) -> outputs (B, S, 2H) (zero at padding), final (B, 2H) = [h_fwd; h_bwd]
    of the top layer, final_cell (B, 2H) = [c_fwd; c_bwd] (LSTM; the same as final for GRU).
    Between layers, dropout with `dropout_rate` when not deterministic."""

    cell: str
    hidden_dim: int
    num_layers: int = 1
    dropout_rate: float = 0.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool = True):
        lengths = jnp.sum(mask > 0, axis=-1).astype(jnp.int32)  # (B,)
        keep = (mask > 0)[..., None]  # (B, S, 1)
        final = final_cell = None
        for layer in range(self.num_layers):
            if layer > 0:
                x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)  # (B, S, 2H)
            fwd = nn.RNN(make_cell(self.cell, self.hidden_dim, self.dtype, name=f"forward_{layer}"))
            bwd = nn.RNN(make_cell(self.cell, self.hidden_dim, self.dtype, name=f"backward_{layer}"))
            carry_f, out_f = fwd(x, seq_lengths=lengths, return_carry=True)  # out (B, S, H)
            carry_b, out_b = bwd(x, seq_lengths=lengths, return_carry=True, reverse=True, keep_order=True)
            x = jnp.where(keep, jnp.concatenate([out_f, out_b], axis=-1), 0.0)  # (B, S, 2H)
            final = jnp.concatenate([carry_output(self.cell, carry_f), carry_output(self.cell, carry_b)], -1)
            if self.cell == "lstm":
                final_cell = jnp.concatenate([carry_f[0], carry_b[0]], axis=-1)  # (B, 2H)
            else:
                final_cell = final  # (B, 2H)
        return x, final, final_cell


class AdditiveAttention(nn.Module):
    """Bahdanau attention: e_i = v^T tanh(W_s s + W_h h_i); a = masked softmax(e); c = sum_i a_i h_i.

    Parameters: query (H, A) = W_s, key (D, A) = W_h, energy (A, 1) = v; no biases."""

    attention_dim: int
    dtype: Any = jnp.float32

    def setup(self):
        self.query = dense(self.attention_dim, ("mlp", "kv"), use_bias=False, dtype=self.dtype)
        self.key = dense(self.attention_dim, ("embed", "kv"), use_bias=False, dtype=self.dtype)
        self.energy = dense(1, ("kv", None), use_bias=False, dtype=self.dtype)

    def keys(self, values: jax.Array) -> jax.Array:
        """W_h h_i: values (B, S, D) -> (B, S, A); computed once per source."""
        return self.key(values)  # (B, S, A)

    def __call__(self, query: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array):
        """query s (B, H), keys (B, S, A), values (B, S, D), mask (B, S) -> context (B, D), weights (B, S)."""
        hidden = jnp.tanh(self.query(query)[:, None, :] + keys)  # (B, S, A)
        scores = self.energy(hidden)[..., 0]  # (B, S)
        weights = masked_softmax(scores, mask)  # (B, S)
        context = jnp.einsum("bs,bsd->bd", weights.astype(values.dtype), values)  # (B, D)
        return context, weights


class LuongAttention(nn.Module):
    """Luong attention with the current state s_t as the query: dot (e_i = s_t . h_i) or general
    (e_i = s_t^T W_a h_i, computed as s_t . (W_a h_i)). a = masked softmax(e); c = sum_i a_i v_i."""

    kind: str  # dot | general
    query_dim: int  # H, the decoder state width
    dtype: Any = jnp.float32

    def setup(self):
        if self.kind not in LUONG_KINDS:
            raise UserError(f"Luong attention kind {self.kind!r}: use one of {list(LUONG_KINDS)}")
        if self.kind == "general":
            self.key = dense(self.query_dim, ("embed", "mlp"), use_bias=False, dtype=self.dtype)

    def keys(self, values: jax.Array) -> jax.Array:
        """dot: h_i itself (width must be H); general: W_a h_i. values (B, S, D) -> (B, S, H)."""
        if self.kind == "general":
            return self.key(values)  # (B, S, H)
        if values.shape[-1] != self.query_dim:
            raise ValueError(f"dot attention needs memory width {self.query_dim}, got {values.shape[-1]}")
        return values  # (B, S, H)

    def __call__(self, query: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array):
        """query s_t (B, H), keys (B, S, H), values (B, S, D), mask (B, S) -> context (B, D), weights (B, S)."""
        scores = jnp.einsum("bh,bsh->bs", query.astype(keys.dtype), keys)  # (B, S)
        weights = masked_softmax(scores, mask)  # (B, S)
        context = jnp.einsum("bs,bsd->bd", weights.astype(values.dtype), values)  # (B, D)
        return context, weights
