"""The model options shared by every Transformer experiment, as config fields and as a TransformerConfig.

Each experiment's config has a `model` section built from `transformer_options()`, so the same
switches (--config.model.norm=rms, --config.model.position=rope, --config.model.moe.num_experts=8,
...) mean the same thing for GPT, ViT and the encoder-decoder.
"""

import jax.numpy as jnp
import ml_collections

from lm.errors import UserError
from lm.layers.transformer import MoeConfig, TransformerConfig

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def transformer_options(**overrides) -> ml_collections.ConfigDict:
    """Default model fields (GPT-2 style: pre-norm LayerNorm, GELU MLP, learned positions)."""
    model = ml_collections.ConfigDict()
    model.num_layers = 4
    model.num_heads = 4
    model.num_kv_heads = 4  # < num_heads: grouped-query attention; 1: multi-query
    model.embed_dim = 128
    model.mlp = "gelu"  # gelu | relu | swiglu
    model.mlp_ratio = 4.0  # hidden width / embed_dim of the classic MLP; SwiGLU uses 2/3 of it
    model.mlp_multiple = 8  # SwiGLU hidden width rounded to a multiple of this
    model.norm = "layer"  # layer | rms
    model.norm_position = "pre"  # pre | post
    model.position = "learned"  # none | sinusoidal | learned | rope | alibi
    model.rope_base = 10000.0
    model.dropout = 0.0
    model.attention_dropout = 0.0
    model.use_bias = True
    model.init = "gpt2"  # gpt2 | normal | xavier | small (lm/layers/initializers.py)
    model.compute_dtype = "float32"  # float32 | bfloat16 (params stay float32: the optimizer's master copy)
    # How the model is computed, not what it computes (the same numerics): see lm/layers/transformer.py
    model.attention_impl = "auto"  # auto | xla | cudnn | splash: auto = cuDNN on GPU, splash on TPU where they apply
    model.scan_layers = False  # True: one nn.scan over the layers (compiles one layer, not num_layers)
    model.remat = "none"  # none | dots | dots_no_batch | full: activations recomputed in the backward pass
    model.moe = ml_collections.ConfigDict()
    model.moe.num_experts = 0  # 0: dense; E >= 2: experts replace every `every`-th MLP
    model.moe.every = 2
    model.moe.top_k = 2
    model.moe.capacity_factor = 1.25
    model.moe.load_balance_weight = 0.01  # Switch/GShard auxiliary loss weight
    model.moe.router_z_weight = 0.001  # ST-MoE router z-loss weight
    model.update(overrides)
    return model


def compute_dtype(name: str):
    if name not in DTYPES:
        raise UserError(f"model.compute_dtype={name!r}: use one of {sorted(DTYPES)}")
    return DTYPES[name]


def transformer_config(model: ml_collections.ConfigDict) -> TransformerConfig:
    """The block options of a config's `model` section (checked: bad values are UserErrors)."""
    return TransformerConfig(
        num_layers=model.num_layers,
        embed_dim=model.embed_dim,
        num_heads=model.num_heads,
        num_kv_heads=model.num_kv_heads,
        mlp=model.mlp,
        mlp_ratio=model.mlp_ratio,
        mlp_multiple=model.mlp_multiple,
        norm=model.norm,
        norm_position=model.norm_position,
        position=model.position,
        rope_base=model.rope_base,
        dropout=model.dropout,
        attention_dropout=model.attention_dropout,
        use_bias=model.use_bias,
        init=model.init,
        moe=MoeConfig(
            num_experts=model.moe.num_experts,
            every=model.moe.every,
            top_k=model.moe.top_k,
            capacity_factor=model.moe.capacity_factor,
        ),
        dtype=compute_dtype(model.compute_dtype),
        # runs saved before these options existed computed the model the default way
        attention_impl=model.get("attention_impl", "auto"),
        scan_layers=model.get("scan_layers", False),
        remat=model.get("remat", "none"),
    )
