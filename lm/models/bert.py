"""BERT (Devlin et al. 2019): a bidirectional Transformer encoder, and its pretraining heads.

Bert: tokens, segments (B, T) int32, mask (B, T) bool (True at real tokens)
    -> embeddings: token table + position table + segment table -> norm -> dropout    (B, T, D)
    -> encoder: TransformerStack, causal=False, padding keys never attended to        (B, T, D) hidden
    -> pooler: tanh(W h[:, 0] + b), the [CLS] token's output                          (B, D) pooled
BertForPretraining adds, on {"bert": ...}:
    mlm_head  the masked-LM head, only at the (B, P) gathered masked positions (BERT's
              max_predictions_per_seq, far cheaper than (B, T, V) logits):
              dense D -> D, exact GELU, norm, then the token table's transpose (tied) + a bias (V,)
    nsp_head  next-sentence prediction: a dense D -> 2 on the pooled output (class 0: B follows A)
Fine-tuning models keep Bert under "bert" beside their own head, so init_from loads it by name.

BERT's choices are the defaults of bert_options(): post-norm, erf GELU, LayerNorm eps 1e-12, N(0, 0.02)
initialisation, dropout 0.1, 512 learned positions, 2 segments. Every other TransformerConfig switch
applies: positions other than "learned" act through the stack (rope, alibi inside attention) or are
added here (sinusoidal, none); norm kind, MLP kind, MoE, scan, remat, dtype.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from lm.layers.attention import capped, padding_mask
from lm.layers.embedding import TokenEmbedding
from lm.layers.heads import LMHead, head_dense
from lm.layers.norms import Norm
from lm.layers.options import at_least, declare, option
from lm.layers.partitioning import constrain, param_init
from lm.layers.positions import PositionEmbedding
from lm.layers.transformer import TransformerConfig, TransformerStack, standard_only
from lm.models.config import transformer_config, transformer_options

# Published sizes: (num_layers, embed_dim, num_heads); mlp hidden 4 D.
BERT_SIZES = {
    "tiny": (2, 64, 2),  # for tests
    "mini": (4, 256, 4),  # Turc et al. 2019's BERT-Mini
    "small": (4, 512, 8),  # Turc et al. 2019's BERT-Small
    "base": (12, 768, 12),  # BERT-Base, 110M parameters
    "large": (24, 1024, 16),  # BERT-Large, 340M parameters
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    transformer: TransformerConfig
    max_positions: int = 512  # rows of the learned position table: the longest sequence
    type_vocab_size: int = 2  # segments (sentence A, sentence B)
    vocab_multiple: int = 64  # token table rows padded to a multiple, so 'vocab' can be sharded

    def __post_init__(self):
        standard_only(self.transformer, "BERT")

    @property
    def padded_vocab_size(self) -> int:
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple


def bert_options(size: str = "base", **overrides) -> ml_collections.ConfigDict:
    """A config's `model` section for BERT: every TransformerConfig option with BERT's defaults, the
    BERT_SIZES entry `size`, and max_positions, type_vocab_size, vocab_multiple; then the overrides."""
    num_layers, embed_dim, num_heads = BERT_SIZES[size]
    model = transformer_options(
        num_layers=num_layers, embed_dim=embed_dim, num_heads=num_heads, num_kv_heads=num_heads,
        norm_position="post", mlp="gelu_exact", norm_epsilon=1e-12, init="normal", dropout=0.1,
        attention_dropout=0.1,
    )
    declare(
        model,
        max_positions=option(512, "rows of the learned position table: the longest sequence",
                             bounds=at_least(1)),
        type_vocab_size=option(2, "segment (token type) embeddings: sentence A and B",
                               bounds=at_least(1)),
        vocab_multiple=option(64, "the token table's rows padded to a multiple, so 'vocab' can be sharded",
                              bounds=at_least(1)),
    )
    model.update(overrides)
    return model


def bert_config(model: ml_collections.ConfigDict, vocab_size: int) -> BertConfig:
    """The BertConfig of a config's `model` section (bert_options) for a vocabulary of vocab_size."""
    return BertConfig(vocab_size=vocab_size, transformer=transformer_config(model),
                      max_positions=model.max_positions, type_vocab_size=model.type_vocab_size,
                      vocab_multiple=model.vocab_multiple)


class BertEmbeddings(nn.Module):
    """tokens, segments (B, T) -> norm(token + position + segment embeddings), dropout: (B, T, D).
    `token_embed` is also the masked-LM head's (tied) output layer."""

    config: BertConfig

    def setup(self):
        cfg, blocks = self.config, self.config.transformer
        table_init = param_init(blocks.inits.embedding, ("vocab", "embed"))
        self.token_embed = TokenEmbedding(cfg.padded_vocab_size, blocks.embed_dim, blocks.dtype, table_init)
        self.position_embed = PositionEmbedding(blocks.position, cfg.max_positions, blocks.embed_dim,
                                                blocks.inits.embedding)  # zeros for rope, alibi, none
        self.segment_embed = TokenEmbedding(cfg.type_vocab_size, blocks.embed_dim, blocks.dtype,
                                            param_init(blocks.inits.embedding, (None, "embed")))
        self.norm = Norm(blocks.norm, dtype=blocks.dtype, epsilon=blocks.norm_epsilon)
        self.dropout = nn.Dropout(blocks.dropout)

    def __call__(self, tokens: jax.Array, segments: jax.Array, train: bool) -> jax.Array:
        positions = self.position_embed(jnp.arange(tokens.shape[1]))  # (T, D)
        x = self.token_embed(tokens) + positions[None].astype(self.config.transformer.dtype)
        x = self.norm(x + self.segment_embed(segments))
        x = self.dropout(x, deterministic=not train)
        return constrain(x, ("batch", "length", "embed"))


class Bert(nn.Module):
    """tokens (B, T) int32, segments (B, T) int32, mask (B, T) bool (True at real tokens)
    -> hidden (B, T, D), pooled (B, D)."""

    config: BertConfig

    def setup(self):
        blocks = self.config.transformer
        self.embeddings = BertEmbeddings(self.config)
        self.encoder = TransformerStack(blocks, causal=False)
        self.pooler = head_dense(blocks.embed_dim, blocks.embed_dim, blocks.dtype, blocks.inits.dense, "pooler")

    def __call__(self, tokens: jax.Array, segments: jax.Array, mask: jax.Array,
                 train: bool = False) -> tuple[jax.Array, jax.Array]:
        x = self.embeddings(tokens, segments, train)
        hidden = self.encoder(x, mask=padding_mask(mask.astype(bool)), positions=jnp.arange(tokens.shape[1]),
                              train=train)  # (B, T, D)
        pooled = jnp.tanh(self.pooler(hidden[:, 0]))  # (B, D)
        return hidden, pooled


class MaskedLMHead(nn.Module):
    """hidden (B, P, D) at the masked positions -> logits (B, P, V) float32:
    norm(gelu(W h + b)) . E^T + bias, E the token table (tied)."""

    config: BertConfig

    @nn.compact
    def __call__(self, hidden: jax.Array, token_embed: TokenEmbedding) -> jax.Array:
        cfg, blocks = self.config, self.config.transformer
        dim = blocks.embed_dim
        h = nn.gelu(head_dense(dim, dim, blocks.dtype, blocks.inits.dense, "dense")(hidden), approximate=False)
        h = Norm(blocks.norm, dtype=blocks.dtype, epsilon=blocks.norm_epsilon, name="norm")(h)
        logits = LMHead(cfg.vocab_size, cfg.padded_vocab_size, token_embed, blocks.dtype, name="output")(h)
        # (V,), unpadded, so unsharded: V need not divide the 'tensor' axis
        bias = self.param("bias", param_init(nn.initializers.zeros, (None,)), (cfg.vocab_size,), jnp.float32)
        return capped(logits + bias, blocks.logit_softcap)  # (B, P, V)


class BertForPretraining(nn.Module):
    """tokens, segments (B, T) int32, mask (B, T) bool, masked_positions (B, P) int32 (the indices
    whose tokens the masked LM predicts; padding slots may point anywhere, their loss weight is 0)
    -> masked-LM logits (B, P, V) float32, next-sentence logits (B, 2) float32."""

    config: BertConfig

    def setup(self):
        blocks = self.config.transformer
        self.bert = Bert(self.config)
        self.mlm_head = MaskedLMHead(self.config)
        self.nsp_head = head_dense(blocks.embed_dim, 2, blocks.dtype, blocks.inits.dense, "nsp_head")

    def __call__(self, tokens: jax.Array, segments: jax.Array, mask: jax.Array, masked_positions: jax.Array,
                 train: bool = False) -> tuple[jax.Array, jax.Array]:
        hidden, pooled = self.bert(tokens, segments, mask, train)
        at_masks = jnp.take_along_axis(hidden, masked_positions[..., None], axis=1)  # (B, P, D)
        mlm_logits = self.mlm_head(at_masks, self.bert.embeddings.token_embed)
        return mlm_logits, self.nsp_head(pooled).astype(jnp.float32)


def flops_per_sequence(config: BertConfig, active_params: int, length: int, predictions: int) -> float:
    """Pretraining FLOPs (forward + backward) for one sequence of `length` tokens with `predictions`
    masked positions: 6 N per token for the encoder's matmuls (N: the active parameters less the
    embedding tables, the norms' handful aside, and the heads), 12 L T D per token for attention,
    and 6 (D^2 + D V) per prediction for the masked-LM head (its dense and the tied output layer)."""
    blocks = config.transformer
    dim = blocks.embed_dim
    tables = (config.padded_vocab_size + config.type_vocab_size) * dim
    tables += config.max_positions * dim if blocks.position == "learned" else 0
    heads = (dim * dim + dim) * 2 + 2 * dim + 2 * dim + 2 + config.vocab_size  # mlm dense + norm + bias, pooler, nsp
    encoder = active_params - tables - heads
    per_prediction = dim * dim + dim * config.padded_vocab_size
    return 6 * encoder * length + 12 * blocks.num_layers * length * length * dim + 6 * per_prediction * predictions
