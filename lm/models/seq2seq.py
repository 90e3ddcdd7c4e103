"""Recurrent encoder-decoder translation models: the no-attention bottleneck, Bahdanau and Luong attention.

Notation: x source ids (B, S), y target ids, E embed_dim, H hidden_dim, L num_layers, V vocab sizes.

Encoder (all variants): embeddings (B, S, E) -> L stacked bidirectional GRU/LSTM layers (`nn.RNN` scans with
`seq_lengths`, so right padding never enters a state) -> h_i = [h_fwd_i; h_bwd_i] (B, S, 2H), zero at padding,
and the summary  z = [h_fwd_last; h_bwd_first] (B, 2H) of the top layer (each direction's final state).

Decoder initial state (Bahdanau et al. 2015): for every decoder layer l, s_0^l = tanh(W_init^l z + b);
an LSTM's cell state starts at zero. The decoder has L unidirectional cells of width H; s_t is the top one.

The per-step function (`DecoderStep`, one code path shared by teacher forcing and `decode_step`), with
e_{t-1} = embedding(y_{t-1}) (B, E):
- attention="none" (Cho et al. 2014): the fixed summary c = z is the only view of the source. It initialises
      the decoder and is fed at every step:  s_t = cell(s_{t-1}, [e_{t-1}; z]),
      o_t = tanh(W_o [s_t; z; e_{t-1}] + b_o) (B, E),  logits_t = W_v o_t + b_v.
  The step reads nothing of the memory but z and the mask's shape (its attention weights are all zero).
- attention="bahdanau": the same model with z replaced by a per-step context
      e_ti = v^T tanh(W_s s_{t-1} + W_h h_i),  a_t = masked softmax_i(e_t),  c_t = sum_i a_ti h_i (B, 2H),
      s_t = cell(s_{t-1}, [e_{t-1}; c_t]),  o_t = tanh(W_o [s_t; c_t; e_{t-1}] + b_o),  logits_t = W_v o_t + b_v
  (Bahdanau's deep output with tanh in place of maxout). W_h h_i is computed once per sentence (memory.keys).
- attention="luong_dot" | "luong_general" (Luong et al. 2015, with input feeding): the state is updated
  first, then attends with the *current* s_t:
      s_t = cell(s_{t-1}, [e_{t-1}; h~_{t-1}])   (h~_0 = 0)
      luong_dot:     m_i = W_m h_i (B, S, H) (the memory projected to the decoder width, once per sentence),
                     e_ti = s_t . m_i,  c_t = sum_i a_ti m_i (B, H)
      luong_general: e_ti = s_t^T W_a h_i,  c_t = sum_i a_ti h_i (B, 2H)
      h~_t = tanh(W_c [c_t; s_t]) (B, H),  logits_t = W_v h~_t + b_v.
Masked softmax puts the finite float32 minimum (never -inf) at source padding, so padding gets exactly zero
weight and an all-padding dummy row stays finite. Dropout (train=True) acts on the source and target
embeddings, between encoder layers, and on o_t / h~_t before the vocabulary projection; none of it is inside
the scanned step, so the step needs no random numbers.

Decoder state: a dict whose every leaf has leading axis B: {"hidden": tuple over layers of the cell carry
(GRU h (B, H); LSTM (c, h))} plus "feed" h~_{t-1} (B, H) for Luong. Beam search reorders beams with
`jax.tree.map(lambda x: x[rows], state)` and tiles memory the same way.
"""

import dataclasses
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from lm.errors import UserError
from lm.layers.embedding import TokenEmbedding
from lm.layers.partitioning import param_init
from lm.layers.rnn import (
    CELLS,
    AdditiveAttention,
    BidirectionalEncoder,
    LuongAttention,
    carry_output,
    dense,
    make_cell,
)

ATTENTIONS = ("none", "bahdanau", "luong_dot", "luong_general")


@dataclasses.dataclass(frozen=True)
class Seq2SeqConfig:
    source_vocab_size: int
    target_vocab_size: int
    embed_dim: int = 256
    hidden_dim: int = 512  # per direction in the encoder; the decoder state size
    cell: str = "gru"  # gru | lstm
    attention: str = "bahdanau"  # none | bahdanau | luong_dot | luong_general
    num_layers: int = 1  # encoder (bidirectional) and decoder layers
    dropout: float = 0.0
    dtype: Any = jnp.float32

    def __post_init__(self):
        if self.cell not in CELLS:
            raise UserError(f"model.cell={self.cell!r}: use one of {list(CELLS)}")
        if self.attention not in ATTENTIONS:
            raise UserError(f"model.attention={self.attention!r}: use one of {list(ATTENTIONS)}")
        for name in ("source_vocab_size", "target_vocab_size", "embed_dim", "hidden_dim", "num_layers"):
            if getattr(self, name) < 1:
                raise UserError(f"model.{name}={getattr(self, name)!r}: must be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"model.dropout={self.dropout!r}: must be in [0, 1)")


@flax.struct.dataclass
class Memory:
    """What the decoder may read of an encoded source; every leaf has leading axis B."""

    outputs: jax.Array  # (B, S, 2H) bidirectional encoder states h_i, zero at padding
    mask: jax.Array  # (B, S) 1 = real source token
    final: jax.Array  # (B, 2H) z = [h_fwd_last; h_bwd_first], the summary
    initial: Any  # the decoder's initial state (see the module docstring)
    keys: jax.Array | None = None  # (B, S, A) attention keys: W_h h_i, W_a h_i or W_m h_i; None without attention


class DecoderStep(nn.Module):
    """One decoder step: (state, e_{t-1} (B, E), memory) -> (state, (o_t (B, O), weights (B, S))).

    O = E for none/bahdanau (deep output), H for Luong (h~_t). The vocabulary projection is outside."""

    config: Seq2SeqConfig

    def setup(self):
        cfg = self.config
        self.cells = [make_cell(cfg.cell, cfg.hidden_dim, cfg.dtype) for _ in range(cfg.num_layers)]
        if cfg.attention == "bahdanau":
            self.attention = AdditiveAttention(cfg.hidden_dim, dtype=cfg.dtype)
        elif cfg.attention.startswith("luong"):
            self.attention = LuongAttention(cfg.attention.removeprefix("luong_"), cfg.hidden_dim, dtype=cfg.dtype)
        if cfg.attention == "luong_dot":
            self.memory_proj = dense(cfg.hidden_dim, ("embed", "mlp"), use_bias=False, dtype=cfg.dtype)
        if cfg.attention.startswith("luong"):
            self.combine = dense(cfg.hidden_dim, ("embed", "mlp"), use_bias=False, dtype=cfg.dtype)  # W_c
        else:
            self.deep_output = dense(cfg.embed_dim, ("mlp", "embed"), dtype=cfg.dtype)  # W_o

    def keys(self, outputs: jax.Array) -> jax.Array | None:
        """Per-sentence attention keys from the encoder outputs (B, S, 2H) -> (B, S, A), or None."""
        cfg = self.config
        if cfg.attention == "none":
            return None
        if cfg.attention == "luong_dot":
            outputs = self.memory_proj(outputs)  # (B, S, H) m_i = W_m h_i
        return self.attention.keys(outputs)  # (B, S, A)

    def _cells(self, hidden: tuple, x: jax.Array) -> tuple[tuple, jax.Array]:
        new_hidden = []
        for cell, carry in zip(self.cells, hidden, strict=True):
            carry, x = cell(carry, x)  # x (B, H)
            new_hidden.append(carry)
        return tuple(new_hidden), x

    def __call__(self, state: dict, embedded: jax.Array, memory: Memory):
        cfg = self.config
        batch, source_length = memory.mask.shape
        if cfg.attention in ("none", "bahdanau"):
            if cfg.attention == "none":
                context = memory.final  # (B, 2H) the only context
                weights = jnp.zeros((batch, source_length), jnp.float32)  # (B, S)
            else:
                query = carry_output(cfg.cell, state["hidden"][-1])  # (B, H) s_{t-1}
                context, weights = self.attention(query, memory.keys, memory.outputs, memory.mask)  # (B, 2H), (B, S)
            context = context.astype(embedded.dtype)
            hidden, s = self._cells(state["hidden"], jnp.concatenate([embedded, context], axis=-1))  # s (B, H)
            out = jnp.tanh(self.deep_output(jnp.concatenate([s, context, embedded], axis=-1)))  # (B, E)
            return {"hidden": hidden}, (out, weights)
        x = jnp.concatenate([embedded, state["feed"].astype(embedded.dtype)], axis=-1)  # (B, E + H)
        hidden, s = self._cells(state["hidden"], x)  # s (B, H) s_t
        values = memory.keys if cfg.attention == "luong_dot" else memory.outputs  # (B, S, H) | (B, S, 2H)
        context, weights = self.attention(s, memory.keys, values, memory.mask)  # (B, D), (B, S)
        out = jnp.tanh(self.combine(jnp.concatenate([context.astype(s.dtype), s], axis=-1)))  # (B, H) h~_t
        return {"hidden": hidden, "feed": out}, (out, weights)


def _scan_body(step: DecoderStep, state: dict, embedded: jax.Array, memory: Memory):
    return step(state, embedded, memory)


class Seq2Seq(nn.Module):
    """Bidirectional-RNN encoder, attention (or none) RNN decoder. See the module docstring for the formulas.

    Methods (call separately with `model.apply(variables, ..., method=...)`):
      encode(source (B, S), source_mask (B, S), train) -> Memory
      initial_state(memory) -> state
      decode_step(memory, state, tokens (B,)) -> (logits (B, V), state, attention weights (B, S))
      decode(memory, decoder_inputs (B, T), train, capture_weights) -> logits (B, T, V)
      __call__(source, source_mask, decoder_inputs, train, capture_weights) -> logits (B, T, V)
    With capture_weights=True the teacher-forced attention weights (B, T, S) are sown into
    'intermediates' as "attention_weights" (apply with mutable=["intermediates"])."""

    config: Seq2SeqConfig

    def setup(self):
        cfg = self.config
        embed_init = nn.initializers.normal(1.0)
        self.source_embed = TokenEmbedding(cfg.source_vocab_size, cfg.embed_dim, dtype=cfg.dtype,
                                           embedding_init=param_init(embed_init, ("vocab", "embed")))
        self.target_embed = TokenEmbedding(cfg.target_vocab_size, cfg.embed_dim, dtype=cfg.dtype,
                                           embedding_init=param_init(embed_init, ("vocab", "embed")))
        self.encoder = BidirectionalEncoder(cfg.cell, cfg.hidden_dim, cfg.num_layers, cfg.dropout, dtype=cfg.dtype)
        self.bridge = [dense(cfg.hidden_dim, ("embed", "mlp"), dtype=cfg.dtype) for _ in range(cfg.num_layers)]
        self.step = DecoderStep(cfg)
        self.project = dense(cfg.target_vocab_size, ("embed", "vocab"), dtype=cfg.dtype)
        self.dropout = nn.Dropout(cfg.dropout)

    def encode(self, source: jax.Array, source_mask: jax.Array, train: bool = False) -> Memory:
        cfg = self.config
        x = self.dropout(self.source_embed(source), deterministic=not train)  # (B, S, E)
        outputs, final, _ = self.encoder(x, source_mask, deterministic=not train)  # (B, S, 2H), (B, 2H)
        hidden = []
        for bridge in self.bridge:
            h0 = jnp.tanh(bridge(final))  # (B, H) s_0 = tanh(W_init z + b)
            hidden.append((jnp.zeros_like(h0), h0) if cfg.cell == "lstm" else h0)
        initial = {"hidden": tuple(hidden)}
        if cfg.attention.startswith("luong"):
            initial["feed"] = jnp.zeros((source.shape[0], cfg.hidden_dim), cfg.dtype)  # (B, H) h~_0
        return Memory(outputs=outputs, mask=source_mask, final=final, initial=initial, keys=self.step.keys(outputs))

    def initial_state(self, memory: Memory) -> dict:
        return memory.initial

    def _logits(self, out: jax.Array, train: bool) -> jax.Array:
        out = self.dropout(out, deterministic=not train)  # (..., O)
        return self.project(out).astype(jnp.float32)  # (..., V)

    def decode_step(self, memory: Memory, state: dict, tokens: jax.Array):
        """One greedy/beam step: tokens y_{t-1} (B,) -> logits for y_t (B, V), new state, weights a_t (B, S)."""
        embedded = self.target_embed(tokens)  # (B, E)
        state, (out, weights) = self.step(state, embedded, memory)  # out (B, O)
        return self._logits(out, train=False), state, weights

    def decode(
        self, memory: Memory, decoder_inputs: jax.Array, train: bool = False, capture_weights: bool = False
    ) -> jax.Array:
        """Teacher forcing: decoder_inputs (B, T) = [bos] + y[:-1] -> logits (B, T, V), one scan over T."""
        embedded = self.dropout(self.target_embed(decoder_inputs), deterministic=not train)  # (B, T, E)
        scan = nn.scan(
            _scan_body,
            variable_broadcast="params",
            split_rngs={"params": False},
            in_axes=(1, nn.broadcast),
            out_axes=1,
        )
        _, (out, weights) = scan(self.step, self.initial_state(memory), embedded, memory)  # (B, T, O), (B, T, S)
        if capture_weights:
            self.sow("intermediates", "attention_weights", weights)
        return self._logits(out, train)  # (B, T, V)

    def __call__(
        self,
        source: jax.Array,
        source_mask: jax.Array,
        decoder_inputs: jax.Array,
        train: bool = False,
        capture_weights: bool = False,
    ) -> jax.Array:
        memory = self.encode(source, source_mask, train=train)
        return self.decode(memory, decoder_inputs, train=train, capture_weights=capture_weights)
