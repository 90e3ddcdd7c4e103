"""The Transformer block and stack shared by GPT, ViT and the encoder-decoder.

Every ablation switch lives in TransformerConfig: norm kind and placement, MLP kind, position
scheme, attention heads (grouped-query), dropout, initialisation and mixture-of-experts layers. Each
is one field declared with `option` (lm/layers/options.py): its default, description and allowed
values, from which the configs' `model` section and its checks are generated (lm/models/config.py).

  pre-norm   x = x + f(norm(x)) per sub-layer, one final norm after the last block (GPT-2)
  post-norm  x = norm(x + f(x)) per sub-layer, no final norm (Vaswani et al. 2017)
  parallel   x = x + attention(h) + mlp(h), h = norm(x): the sub-layers side by side from one norm (GPT-J,
             PaLM); post-norm: x = norm(x + attention(x) + mlp(x)). Cross-attention joins them the same way.

Stability switches: qk_norm (RMSNorm over each head's queries and keys), attention_softcap and logit_softcap
(scores and output logits squashed to cap * tanh(s / cap); the output heads of lm/layers/heads.py cap theirs).

parametrization=mup (Tensor Programs V, Yang et al. 2022): the hidden matrices' initial variance goes as 1/fan_in
from its value at mup_base_width (lm/layers/initializers.py), the attention scores are scaled by sqrt(Dh0) / Dh
(attention_scale), the readout's logits by mup_base_width / embed_dim (width_ratio, lm/layers/heads.py), and the
Adam-like optimizers' learning rate of the hidden matrices by the same ratio (lm/train/optim.py): a learning rate
tuned at the base width then holds at every width. At embed_dim = mup_base_width the model is the standard one.

How the stack is compiled is a config choice too, with the same numerics either way:
  scan_layers=False  one block_<i> module per layer: XLA sees (and compiles) every layer
  scan_layers=True   one `nn.scan` over layers: the parameters of all layers stacked on a leading
                     'layers' axis under 'blocks', one layer body compiled (compile time grows little
                     with depth). With mixture-of-experts every `moe.every` blocks, the scanned
                     unit is that group of blocks (block_0 .. block_<every-1> under 'blocks'). The KV
                     cache is stacked behind the rows, (B, layers, ...), so beam search can reorder rows.
  remat              what the backward pass keeps of each block's forward activations and what it
                     recomputes (jax.checkpoint policies), trading step time for memory:
                     none (keep all), dots (keep matmul outputs), dots_no_batch (keep the matmuls
                     with weights, recompute attention scores), full (keep only block inputs).
"""

import dataclasses
from collections.abc import Iterator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lm.errors import UserError
from lm.layers.attention import ATTENTION_IMPLS, CONTEXT_PARALLEL, SOFTCAP_NEED, MultiHeadAttention
from lm.layers.initializers import INIT_SCHEMES, initializers
from lm.layers.lora import ATTENTION_TARGETS, LoraConfig
from lm.layers.mlp import MLP_KINDS, Mlp, mlp_hidden_dim
from lm.layers.moe import MoeMlp
from lm.layers.norms import NORM_KINDS, Norm
from lm.layers.options import SHARE_BELOW_ONE, above, at_least, check_options, option
from lm.layers.partitioning import constrain
from lm.layers.positions import POSITION_KINDS, ROPE_SCALINGS, RopeScaling

NORM_POSITIONS = ("pre", "post")
PARAMETRIZATIONS = ("standard", "mup")
REMAT_POLICIES = {
    "none": None,
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "full": jax.checkpoint_policies.nothing_saveable,
}
SCANNED_NAME = "blocks"  # the scanned stack's module; its parameters have a leading 'layers' axis
COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}  # model.compute_dtype -> dtype


@dataclasses.dataclass(frozen=True)
class MoeConfig:
    """The mixture-of-experts options (config section model.moe)."""

    num_experts: int = option(0, "0: a dense MLP in every block; E >= 2: experts replace every `every`-th MLP",
                              bounds=at_least(0))
    every: int = option(2, "experts replace the MLP of blocks every-1, 2*every-1, ... (1: all blocks)",
                        bounds=at_least(1))
    top_k: int = option(2, "experts per token: 1 (Switch) or 2 (GShard)", bounds=at_least(1))
    capacity_factor: float = option(1.25, "slots per expert = capacity_factor * top_k * tokens / experts",
                                    bounds=above(0))
    load_balance_weight: float = option(0.01, "weight of the Switch/GShard load-balancing loss (lm/losses.py)",
                                        bounds=at_least(0))
    router_z_weight: float = option(0.001, "weight of the ST-MoE router z-loss (lm/losses.py)", bounds=at_least(0))

    def __post_init__(self):
        check_options(self, "model.moe.")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Every block option, declared once: the config's `model` section is generated from these fields
    (lm/models/config.py), with each field's default, description and allowed values."""

    num_layers: int = option(4, "blocks in the stack (each stack of an encoder-decoder)", bounds=at_least(1))
    num_heads: int = option(4, "attention (query) heads; embed_dim must be a multiple", bounds=at_least(1))
    num_kv_heads: int = option(4, "key/value heads, dividing num_heads: equal for multi-head attention, fewer for "
                                  "grouped-query attention, 1 for multi-query", bounds=at_least(1))
    embed_dim: int = option(128, "the model width D", bounds=at_least(1))
    mlp: str = option("gelu", "the MLP kind (lm/layers/mlp.py)", choices=MLP_KINDS)
    mlp_ratio: float = option(4.0, "classic MLP hidden width = mlp_ratio * embed_dim; SwiGLU 2/3 of it",
                              bounds=above(0))
    mlp_multiple: int = option(8, "SwiGLU hidden width rounded to a multiple of this", bounds=at_least(1))
    mlp_hidden_dim_override: int = option(0, "the MLP hidden width itself (0: from mlp_ratio and mlp_multiple), "
                                             "e.g. a pretrained model's intermediate size", key="mlp_hidden_dim",
                                       bounds=at_least(0))
    norm: str = option("layer", "LayerNorm or RMSNorm (lm/layers/norms.py)", choices=NORM_KINDS)
    norm_position: str = option("pre", "pre-norm x + f(norm(x)), or post-norm norm(x + f(x))",
                                choices=NORM_POSITIONS)
    norm_epsilon: float = option(1e-5, "the eps added to the variance (LayerNorm) or mean square (RMSNorm)",
                                  bounds=at_least(0))
    position: str = option("learned", "position scheme (lm/layers/positions.py)", choices=POSITION_KINDS)
    rope_base: float = option(10000.0, "RoPE frequency base", bounds=above(0))
    # RoPE scaling for a context longer than the one trained on (RopeScaling in lm/layers/positions.py).
    rope_scaling: str = option("none", "RoPE's frequencies stretched: linear (positions / factor), ntk (the base "
                                       "times factor^(Dh/(Dh-2))), yarn or llama3 (per channel)",
                               choices=ROPE_SCALINGS)
    rope_scaling_factor: float = option(1.0, "how many times the original context the scaled RoPE covers",
                                        bounds=at_least(1))
    rope_original_context: int = option(0, "yarn, llama3: the context length the model was trained on "
                                           "(transformers' original_max_position_embeddings)", bounds=at_least(0))
    rope_yarn_beta_fast: float = option(32.0, "yarn: channels turning more than this often over the original "
                                              "context keep their frequency", bounds=above(0))
    rope_yarn_beta_slow: float = option(1.0, "yarn: channels turning less than this often are divided by the factor",
                                        bounds=above(0))
    rope_yarn_attention_factor: float = option(0.0, "yarn: cos and sin multiplied by this (0: 0.1 ln(factor) + 1)",
                                               bounds=at_least(0))
    rope_yarn_truncate: bool = option(True, "yarn: the ramp's ends rounded outwards to whole channels")
    rope_llama3_low_freq_factor: float = option(1.0, "llama3: wavelengths over original context / this are divided "
                                                     "by the factor", bounds=above(0))
    rope_llama3_high_freq_factor: float = option(4.0, "llama3: wavelengths under original context / this keep "
                                                      "their frequency", bounds=above(0))
    dropout: float = option(0.0, "dropout on embeddings and sub-layer outputs", bounds=SHARE_BELOW_ONE)
    attention_dropout: float = option(0.0, "dropout on attention weights", bounds=SHARE_BELOW_ONE)
    use_bias: bool = option(True, "biases in the attention and MLP projections")
    init: str = option("gpt2", "initialisation scheme (lm/layers/initializers.py)", choices=INIT_SCHEMES)
    qk_norm: bool = option(False, "RMSNorm over each head's queries and keys, before RoPE (OLMo 2, Qwen 3)")
    attention_softcap: float = option(0.0, "attention scores s capped to cap * tanh(s / cap) (Gemma 2: 50); 0: off",
                                      bounds=at_least(0))
    logit_softcap: float = option(0.0, "output logits z capped to cap * tanh(z / cap) (Gemma 2: 30); 0: off",
                                  bounds=at_least(0))
    parallel_block: bool = option(False, "attention and MLP side by side from one norm: x + attn(h) + mlp(h), "
                                         "h = norm(x) (GPT-J, PaLM)")
    dtype: Any = option(jnp.float32, "compute dtype; parameters stay float32 (the optimizer's master copy)",
                        choices=COMPUTE_DTYPES, key="compute_dtype")
    # How the model is computed, not what it computes (the same numerics): see the module docstring.
    attention_impl: str = option("auto", "fused attention: auto = cuDNN on GPU, splash on TPU where they apply "
                                         "(lm.layers.attention.attention_implementation)", choices=ATTENTION_IMPLS)
    context_parallel: str = option("all_gather", "self-attention over a sequence split over mesh.context: "
                                                 "all_gather the keys and values, pass them round a ring, or "
                                                 "ring_zigzag: the ring over chunks i and 2n-1-i on device i, the "
                                                 "same causal work on every device (docs/long-context.md)",
                                   choices=CONTEXT_PARALLEL)
    scan_layers: bool = option(False, "one nn.scan over the layers (compiles one layer, not num_layers)")
    remat: str = option("none", "activations recomputed in the backward pass: see REMAT_POLICIES",
                        choices=tuple(REMAT_POLICIES))
    moe: MoeConfig = option(MoeConfig(), "mixture-of-experts layers")
    lora: LoraConfig = option(LoraConfig(), "low-rank adapters on the projections (lm/layers/lora.py)")
    # μP (Tensor Programs V): how initialisation, attention and the readout scale with the width (docs/scaling.md).
    parametrization: str = option("standard", "standard, or mup: a learning rate tuned at mup_base_width holds at "
                                              "every width (lm/layers/initializers.py, docs/scaling.md)",
                                  choices=PARAMETRIZATIONS)
    mup_base_width: int = option(0, "with parametrization=mup, the width (embed_dim) at which the model is the "
                                    "standard one", bounds=at_least(0))
    mup_base_head_dim: int = option(0, "with parametrization=mup, the head dimension at the base width (0: "
                                       "mup_base_width / num_heads)", bounds=at_least(0))

    def __post_init__(self):
        check_options(self, "model.")
        if self.embed_dim % self.num_heads:
            raise UserError(f"model.embed_dim={self.embed_dim} is not divisible by model.num_heads={self.num_heads}")
        if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise UserError(
                f"model.num_heads={self.num_heads} is not a multiple of model.num_kv_heads={self.num_kv_heads}"
            )
        if self.mlp_hidden_dim_override < 0 or self.norm_epsilon <= 0:
            raise UserError(f"model.mlp_hidden_dim={self.mlp_hidden_dim_override} must be >= 0 and "
                            f"model.norm_epsilon={self.norm_epsilon} > 0")
        if self.position == "rope" and self.head_dim % 2:
            raise UserError(f"RoPE needs an even head dimension; embed_dim / num_heads = {self.head_dim}")
        self._check_rope_scaling()
        if self.position == "sinusoidal" and self.embed_dim % 2:
            raise UserError(f"sinusoidal positions need an even model.embed_dim, got {self.embed_dim}")
        moe = self.moe
        if moe.num_experts:
            if moe.num_experts < 2 or not 1 <= moe.top_k <= moe.num_experts:
                raise UserError(
                    f"model.moe: need num_experts >= 2 and 1 <= top_k <= num_experts, "
                    f"got num_experts={moe.num_experts}, top_k={moe.top_k}"
                )
            if not 1 <= moe.every <= self.num_layers:
                raise UserError(f"model.moe.every={moe.every}: use 1..num_layers={self.num_layers}")
            if moe.capacity_factor <= 0:
                raise UserError(f"model.moe.capacity_factor={moe.capacity_factor} must be positive")
        if self.context_parallel == "ring_zigzag" and moe.num_experts:
            raise UserError("model.context_parallel=ring_zigzag reorders each row's tokens, and mixture-of-experts "
                            "layers fill their experts' slots in the row's order: use context_parallel=ring")
        if self.scan_layers and self.num_layers % self.layer_period:
            raise UserError(
                f"model.scan_layers needs model.num_layers={self.num_layers} to be a multiple of "
                f"model.moe.every={moe.every} (the scanned group of blocks); change one, or scan_layers=False"
            )
        self.lora.check_matches(self.projections)
        self._check_mup()
        if self.attention_impl == "cudnn" and self.attention_softcap:
            raise UserError(f"model.attention_impl=cudnn needs {SOFTCAP_NEED}, and model.attention_softcap="
                            f"{self.attention_softcap}: use attention_impl=auto or xla, or attention_softcap=0")

    def _check_mup(self) -> None:
        """UserError for a μP model without its base width, or with a switch μP does not cover."""
        if self.parametrization != "mup":
            return
        if self.mup_base_width < 1:
            raise UserError("model.parametrization=mup needs model.mup_base_width: the width (embed_dim) whose "
                            "learning rate you tuned, e.g. --config.model.mup_base_width=128")
        if not self.mup_base_head_dim and self.mup_base_width % self.num_heads:
            raise UserError(f"model.mup_base_width={self.mup_base_width} is not divisible by model.num_heads="
                            f"{self.num_heads}: set model.mup_base_head_dim")
        if self.mlp_hidden_dim_override:
            raise UserError(f"model.parametrization=mup scales the MLP with the width, and model.mlp_hidden_dim="
                            f"{self.mlp_hidden_dim_override} fixes it: use mlp_hidden_dim=0 (mlp_ratio)")
        if self.lora.rank:
            raise UserError("model.parametrization=mup is for training from scratch, not with LoRA adapters "
                            "(model.lora.rank): use parametrization=standard")

    @property
    def mup(self) -> bool:
        return self.parametrization == "mup"

    @property
    def width_ratio(self) -> float:
        """mup_base_width / embed_dim under μP (the readout's multiplier, and the hidden matrices' learning-rate
        multiplier with Adam-like optimizers: lm.train.optim); 1 for the standard parametrization."""
        return self.mup_base_width / self.embed_dim if self.mup else 1.0

    @property
    def attention_scale(self) -> float | None:
        """What the scores q.k are multiplied by: None, the attention's default 1 / sqrt(Dh); under μP
        sqrt(Dh0) / Dh (Dh0: the base head dimension), 1 / Dh kept at the base's 1 / sqrt(Dh0)."""
        if not self.mup:
            return None
        return (self.mup_base_head_dim or self.mup_base_width // self.num_heads) ** 0.5 / self.head_dim

    def _check_rope_scaling(self) -> None:
        """UserError for a RoPE scaling without RoPE, or without the parameters its kind needs."""
        kind = self.rope_scaling
        if kind == "none":
            if self.rope_scaling_factor != 1:
                raise UserError(f"model.rope_scaling_factor={self.rope_scaling_factor} needs a model.rope_scaling "
                                f"(linear, ntk, yarn, llama3); with rope_scaling=none leave it at 1")
            return
        if self.position != "rope":
            raise UserError(f"model.rope_scaling={kind} scales RoPE, and model.position={self.position}: use "
                            "position=rope, or rope_scaling=none")
        if kind in ("yarn", "llama3") and not self.rope_original_context:
            raise UserError(f"model.rope_scaling={kind} needs model.rope_original_context, the context length the "
                            "model was trained on (e.g. --config.model.rope_original_context=1024)")
        if kind == "ntk" and self.head_dim <= 2:
            raise UserError(f"model.rope_scaling=ntk changes the base by factor^(Dh/(Dh-2)), and the head dimension "
                            f"is {self.head_dim}: use heads of 4 channels or more")
        if kind == "yarn" and self.rope_yarn_beta_fast < self.rope_yarn_beta_slow:
            raise UserError(f"model.rope_yarn_beta_fast={self.rope_yarn_beta_fast} is below model.rope_yarn_beta_slow="
                            f"{self.rope_yarn_beta_slow}: the fast channels' bound is the larger number of turns")
        if kind == "llama3" and self.rope_llama3_high_freq_factor <= self.rope_llama3_low_freq_factor:
            raise UserError(f"model.rope_llama3_high_freq_factor={self.rope_llama3_high_freq_factor} must exceed "
                            f"model.rope_llama3_low_freq_factor={self.rope_llama3_low_freq_factor}")

    @property
    def rope(self) -> RopeScaling:
        """The model.rope_* options as the attention takes them."""
        return RopeScaling(self.rope_scaling, self.rope_scaling_factor, self.rope_original_context,
                           self.rope_yarn_beta_fast, self.rope_yarn_beta_slow, self.rope_yarn_attention_factor,
                           self.rope_yarn_truncate, self.rope_llama3_low_freq_factor, self.rope_llama3_high_freq_factor)

    @property
    def layer_period(self) -> int:
        """Blocks per repeating unit: moe.every with mixture-of-experts layers, else 1."""
        return self.moe.every if self.moe.num_experts else 1

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def mlp_hidden_dim(self) -> int:
        return mlp_hidden_dim(self.mlp, self.embed_dim, self.mlp_ratio, self.mlp_multiple, self.mlp_hidden_dim_override)

    @property
    def projections(self) -> tuple[str, ...]:
        """The names of the blocks' projections (the LoRA targets there are): the attention's, and the dense
        MLP's unless experts replace every MLP."""
        dense_mlp = () if self.moe.num_experts and self.moe.every == 1 else \
            ("gate", "up", "down") if self.mlp == "swiglu" else ("up", "down")
        return ATTENTION_TARGETS + dense_mlp

    def is_moe_block(self, index: int) -> bool:
        return self.moe.num_experts > 0 and (index + 1) % self.moe.every == 0

    @property
    def inits(self):
        return initializers(self.init, self.embed_dim, self.num_layers, self.mup_base_width if self.mup else 0)


class TransformerBlock(nn.Module):
    """Self-attention, [cross-attention to `memory`], then a dense or mixture-of-experts MLP, each
    sub-layer with a residual and a norm. positions (T,) or (B, T) and segment_ids (B, T) are the
    self-attention's (MultiHeadAttention). memory_mask: (B, 1, 1, S) from `padding_mask`. The array
    arguments can be given by position, as nn.remat and nn.scan pass them."""

    config: TransformerConfig
    causal: bool
    use_moe: bool = False
    cross_attention: bool = False
    train: bool = False
    capture_weights: bool = False

    @nn.compact
    def __call__(
        self,
        x: jax.Array,  # (B, T, D)
        mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        cache_index: jax.Array | None = None,
        memory: jax.Array | None = None,  # (B, S, D), with cross_attention
        memory_mask: jax.Array | None = None,
    ) -> jax.Array:
        cfg, train, capture_weights = self.config, self.train, self.capture_weights
        inits = cfg.inits

        def attention_module(name: str, causal: bool, position: str) -> MultiHeadAttention:
            return MultiHeadAttention(
                num_heads=cfg.num_heads,
                num_kv_heads=cfg.num_kv_heads,
                head_dim=cfg.head_dim,
                causal=causal,
                position=position,
                rope_base=cfg.rope_base,
                rope_scaling=cfg.rope,
                dropout=cfg.attention_dropout,
                use_bias=cfg.use_bias,
                dtype=cfg.dtype,
                implementation=cfg.attention_impl,
                kernel_init=inits.dense,
                out_kernel_init=inits.residual,
                lora=cfg.lora,
                qk_norm=cfg.qk_norm,
                norm_epsilon=cfg.norm_epsilon,
                softcap=cfg.attention_softcap,
                scale=cfg.attention_scale,
                context_parallel=cfg.context_parallel,
                name=name,
            )

        attention = attention_module("attention", self.causal, cfg.position)
        mlp_args = dict(
            kind=cfg.mlp,
            hidden_dim=cfg.mlp_hidden_dim,
            use_bias=cfg.use_bias,
            dtype=cfg.dtype,
            kernel_init=inits.dense,
            out_kernel_init=inits.residual,
        )
        if self.use_moe:
            moe = cfg.moe
            mlp = MoeMlp(
                num_experts=moe.num_experts,
                top_k=moe.top_k,
                capacity_factor=moe.capacity_factor,
                router_init=inits.dense,
                name="moe",
                **mlp_args,
            )
        else:
            mlp = Mlp(name="mlp", lora=cfg.lora, train=train, **mlp_args)
        dropout = nn.Dropout(cfg.dropout, deterministic=not train)

        def norm(name: str) -> Norm:
            return Norm(cfg.norm, dtype=cfg.dtype, epsilon=cfg.norm_epsilon, name=name)

        def attend(h):
            return attention(h, mask=mask, positions=positions, segment_ids=segment_ids, cache_index=cache_index,
                             train=train, capture_weights=capture_weights)

        sublayers = [(attend, "norm_attention")]
        if self.cross_attention:
            cross = attention_module("cross_attention", causal=False, position="none")  # positions: self-attention only

            def attend_memory(h):
                return cross(h, memory, mask=memory_mask, train=train, capture_weights=capture_weights)

            sublayers.append((attend_memory, "norm_cross_attention"))
        sublayers.append((mlp, "norm_mlp"))

        if cfg.parallel_block:  # one norm for all: x + sum f(norm(x)), or norm(x + sum f(x))
            shared = norm("norm")
            h = shared(x) if cfg.norm_position == "pre" else x
            x = x + sum(dropout(sublayer(h)) for sublayer, _ in sublayers)
            x = x if cfg.norm_position == "pre" else shared(x)
        else:
            for sublayer, name in sublayers:
                if cfg.norm_position == "pre":
                    x = x + dropout(sublayer(norm(name)(x)))
                else:
                    x = norm(name)(x + dropout(sublayer(x)))
        return constrain(x, ("batch", "length", "embed"))


def standard_only(config: TransformerConfig, family: str) -> None:
    """UserError where a model family whose heads μP does not cover (family: its name) asks for it."""
    if config.mup:
        raise UserError(f"model.parametrization=mup covers GPT, ViT and the Transformer encoder-decoder, not {family} "
                        "(its heads hold matrices outside the blocks): use parametrization=standard")


def checkpointed(block: type[nn.Module], remat: str, in_scan: bool) -> type[nn.Module]:
    """block, rematerialised with the named policy (unchanged for 'none'). Inside a scan the
    common-subexpression guard is not needed (the loop already keeps XLA from merging recomputation
    into the forward pass) and would only slow the step down."""
    if remat == "none":
        return block
    return nn.remat(block, policy=REMAT_POLICIES[remat], prevent_cse=not in_scan)


class BlockGroup(nn.Module):
    """`config.layer_period` consecutive blocks (block_0, ...), the unit nn.scan repeats: one block,
    or with mixture-of-experts every k-th layer the k blocks that end in a MoE block. A scan body:
    (x, *broadcast arrays) -> (x, None)."""

    config: TransformerConfig
    causal: bool
    cross_attention: bool = False
    train: bool = False
    capture_weights: bool = False

    @nn.compact
    def __call__(self, x, mask, positions, segment_ids, cache_index, memory, memory_mask):
        cfg = self.config
        for j in range(cfg.layer_period):
            x = TransformerBlock(cfg, self.causal, cfg.is_moe_block(j), self.cross_attention, self.train,
                                 self.capture_weights, name=f"block_{j}")(
                x, mask, positions, segment_ids, cache_index, memory, memory_mask)
        return x, None


class TransformerStack(nn.Module):
    """num_layers blocks (block_0, block_1, ...; or with scan_layers their stacked copies under
    'blocks'), then a final norm for pre-norm: (B, T, D) -> (B, T, D).

    An encoder: causal=False with a padding mask. A decoder-only model: causal=True, over rows of
    packed documents with their segment_ids (B, T) and positions (B, T). The decoder of an
    encoder-decoder: causal=True, cross_attention=True, with the encoder's output as memory.
    """

    config: TransformerConfig
    causal: bool
    cross_attention: bool = False

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        *,
        mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        cache_index: jax.Array | None = None,
        memory: jax.Array | None = None,
        memory_mask: jax.Array | None = None,
        train: bool = False,
        capture_weights: bool = False,
    ) -> jax.Array:
        cfg = self.config
        arrays = (mask, positions, segment_ids, cache_index, memory, memory_mask)  # the same for every layer
        if cfg.scan_layers:
            scanned = nn.scan(
                checkpointed(BlockGroup, cfg.remat, in_scan=True),
                variable_axes={"params": 0, "cache": 1, "moe": 0, "intermediates": 0},  # cache: rows first
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast,) * len(arrays),
                length=cfg.num_layers // cfg.layer_period,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            x, _ = scanned(cfg, self.causal, self.cross_attention, train, capture_weights, name=SCANNED_NAME)(
                x, *arrays)
        else:
            block = checkpointed(TransformerBlock, cfg.remat, in_scan=False)
            for i in range(cfg.num_layers):
                x = block(cfg, self.causal, cfg.is_moe_block(i), self.cross_attention, train, capture_weights,
                          name=f"block_{i}")(x, *arrays)
        if cfg.norm_position == "pre":
            x = Norm(cfg.norm, dtype=cfg.dtype, epsilon=cfg.norm_epsilon, name="norm_final")(x)
        return x


def sown_per_layer(path: tuple[str, ...], value, config: TransformerConfig) -> Iterator[tuple[int, Any]]:
    """(layer index, value) for a value one block sowed (an 'intermediates' entry at `path`), from
    either layout: block_<i> gives layer i; under the scanned 'blocks', value has a leading axis over
    the scan and block_<j> is layer scan_index * layer_period + j."""
    j = int(next(name for name in path if name.startswith("block_")).removeprefix("block_"))
    if SCANNED_NAME not in path:
        yield j, value
        return
    for scan_index, layer_value in enumerate(value):
        yield scan_index * config.layer_period + j, layer_value


def is_block_name(name: str) -> bool:
    """'block_3': one block of an unrolled stack (or of the scanned group)."""
    return name.startswith("block_") and name.removeprefix("block_").isdigit()


def stack_layers(stack: dict, layer_period: int = 1) -> dict:
    """One TransformerStack's params (or any tree shaped like them: gradients, masks) in the
    unrolled layout, block_0 .. block_<L-1> beside the final norm, converted to the scanned one:
    {SCANNED_NAME: {block_<j>: leaves with a leading 'layers' axis of L / layer_period}} beside the
    final norm, where scan index s of block_<j> is layer s * layer_period + j (layer_period: the
    config's layer_period, the MoE group)."""
    num_layers = sum(map(is_block_name, stack))
    if num_layers % layer_period:
        raise ValueError(f"{num_layers} layers do not split into scanned groups of {layer_period}")
    groups = [[stack[f"block_{i}"] for i in range(j, num_layers, layer_period)] for j in range(layer_period)]
    for j, layers in enumerate(groups):
        if any(jax.tree.structure(layer) != jax.tree.structure(layers[0]) for layer in layers):
            raise ValueError(f"block_{j}, block_{j + layer_period}, ... hold different parameters")
    scanned = {f"block_{j}": jax.tree.map(lambda *per_layer: jnp.stack(per_layer), *layers)
               for j, layers in enumerate(groups)}
    rest = {name: value for name, value in stack.items() if not is_block_name(name)}
    return {**rest, SCANNED_NAME: scanned}


def unstack_layers(stack: dict) -> dict:
    """The inverse of stack_layers: a scanned stack's params as block_0 .. block_<L-1> (the layer
    period is the number of blocks in the scanned group)."""
    scanned = stack[SCANNED_NAME]
    period = len(scanned)
    length = len(jax.tree.leaves(scanned)[0])  # scan steps: the leading 'layers' axis
    layers = {
        f"block_{s * period + j}": jax.tree.map(lambda leaf, s=s: leaf[s], scanned[f"block_{j}"])
        for s in range(length) for j in range(period)
    }
    rest = {name: value for name, value in stack.items() if name != SCANNED_NAME}
    return {**rest, **layers}
