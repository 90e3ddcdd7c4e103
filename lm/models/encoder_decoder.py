"""The Transformer encoder-decoder (Vaswani et al. 2017) from the shared blocks.

source (B, S) -> embedding [+ positions] -> encoder stack (bidirectional, source padding masked)
    -> memory (B, S, D)
decoder_inputs (B, T) -> embedding [+ positions] -> decoder stack (causal self-attention,
    cross-attention to memory) -> logits (B, T, V_target), the output layer tied to the target
    embedding.
Every TransformerConfig switch (norm, placement, MLP, positions, MoE, init) applies to both stacks.
Decoding: `decode(..., decode=True)` feeds target tokens a few at a time through a KV cache.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm.layers.attention import padding_mask
from lm.layers.embedding import embed
from lm.layers.heads import LMHead
from lm.layers.transformer import TransformerConfig, TransformerStack


@dataclasses.dataclass(frozen=True)
class EncoderDecoderConfig:
    source_vocab_size: int
    target_vocab_size: int
    max_length: int  # rows of learned position tables
    transformer: TransformerConfig  # num_layers each for the encoder and the decoder
    vocab_multiple: int = 64  # embedding rows padded to a multiple, so 'vocab' can be sharded
    scale_embeddings: bool = True  # token embeddings times sqrt(D), as in Vaswani et al. (section 3.4)

    def padded(self, vocab_size: int) -> int:
        return -(-vocab_size // self.vocab_multiple) * self.vocab_multiple


class Encoder(nn.Module):
    config: EncoderDecoderConfig

    @nn.compact
    def __call__(self, source: jax.Array, source_mask: jax.Array, train: bool, capture_weights: bool) -> jax.Array:
        """source, source_mask (B, S) -> memory (B, S, D); padding keys are never attended to."""
        cfg = self.config
        x, _ = embed(source, jnp.arange(source.shape[1]), cfg.padded(cfg.source_vocab_size), cfg.max_length,
                     cfg.transformer, cfg.scale_embeddings, train)
        return TransformerStack(cfg.transformer, causal=False, name="stack")(
            x, mask=padding_mask(source_mask.astype(bool)), train=train, capture_weights=capture_weights
        )


class Decoder(nn.Module):
    config: EncoderDecoderConfig

    @nn.compact
    def __call__(self, decoder_inputs: jax.Array, memory: jax.Array, source_mask: jax.Array, train: bool,
                 decode: bool, capture_weights: bool) -> jax.Array:
        """decoder_inputs (B, T) -> logits (B, T, V). decode=True: the inputs continue the cached ones."""
        cfg = self.config
        length = decoder_inputs.shape[1]
        cache_index = None
        positions = jnp.arange(length)
        if decode:
            index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
            cache_index = index.value
            positions = cache_index + positions
            if not self.is_initializing():
                index.value = cache_index + length
        x, table = embed(decoder_inputs, positions, cfg.padded(cfg.target_vocab_size), cfg.max_length,
                         cfg.transformer, cfg.scale_embeddings, train)
        x = TransformerStack(cfg.transformer, causal=True, cross_attention=True, name="stack")(
            x, positions=positions, cache_index=cache_index, memory=memory,
            memory_mask=padding_mask(source_mask.astype(bool)), train=train, capture_weights=capture_weights,
        )
        padded_vocab_size = cfg.padded(cfg.target_vocab_size)
        return LMHead(cfg.target_vocab_size, padded_vocab_size, table, softcap=cfg.transformer.logit_softcap,
                      multiplier=cfg.transformer.width_ratio, name="head")(x)  # tied output layer


class EncoderDecoder(nn.Module):
    """Call for teacher forcing; `encode` and `decode` (via apply(..., method=...)) for generation."""

    config: EncoderDecoderConfig

    def setup(self):
        self.encoder = Encoder(self.config)
        self.decoder = Decoder(self.config)

    def encode(self, source: jax.Array, source_mask: jax.Array, train: bool = False,
               capture_weights: bool = False) -> jax.Array:
        return self.encoder(source, source_mask, train, capture_weights)

    def decode(self, decoder_inputs: jax.Array, memory: jax.Array, source_mask: jax.Array, train: bool = False,
               decode: bool = False, capture_weights: bool = False) -> jax.Array:
        return self.decoder(decoder_inputs, memory, source_mask, train, decode, capture_weights)

    def __call__(self, source: jax.Array, source_mask: jax.Array, decoder_inputs: jax.Array,
                 train: bool = False, capture_weights: bool = False) -> jax.Array:
        """Teacher forcing: (B, S), (B, S), (B, T) -> logits (B, T, V)."""
        memory = self.encode(source, source_mask, train, capture_weights)
        return self.decode(decoder_inputs, memory, source_mask, train, capture_weights=capture_weights)
