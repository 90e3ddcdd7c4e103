"""The model options shared by every Transformer experiment, as config fields and as a TransformerConfig.

Each experiment's config has a `model` section built from `transformer_options()`, so the same
switches (--config.model.norm=rms, --config.model.position=rope, --config.model.moe.num_experts=8,
...) mean the same thing for GPT, ViT and the encoder-decoder. Both functions are generated from the
fields of TransformerConfig and MoeConfig (lm/layers/transformer.py), where each option is declared
once with its default, description and allowed values.

The table of architecture switches in docs/configs.md lists every option but those in NOT_ABLATIONS (a test
checks both against the fields).
"""

import jax
import ml_collections

from lm.errors import UserError
from lm.layers.attention import fallback_note
from lm.layers.options import declared_section, from_section
from lm.layers.transformer import COMPUTE_DTYPES, TransformerConfig

# The options that are not ablation switches, so the switch table of docs/configs.md leaves them out: the model
# size, which each config variant sets, and how the model is computed, not what it computes (the
# table of performance switches in docs/performance.md).
NOT_ABLATIONS = {
    "num_layers": "model size",
    "num_heads": "model size",
    "embed_dim": "model size",
    "compute_dtype": "performance",
    "attention_impl": "performance",
    "scan_layers": "performance",
    "context_parallel": "performance",
    "remat": "performance",
    **{f"lora.{key}": "post-training (docs/post-training.md)" for key in ("rank", "alpha", "dropout", "targets")},
    **{key: "scaling (docs/scaling.md)" for key in ("parametrization", "mup_base_width", "mup_base_head_dim")},
}


def transformer_options(**overrides) -> ml_collections.ConfigDict:
    """The `model` section: every TransformerConfig option at its default (GPT-2 style: pre-norm
    LayerNorm, GELU MLP, learned positions), `moe` a sub-section, then the overrides."""
    model = declared_section(TransformerConfig)
    model.update(overrides)
    return model


def compute_dtype(name: str):
    if name not in COMPUTE_DTYPES:
        raise UserError(f"model.compute_dtype={name!r}: use one of {tuple(COMPUTE_DTYPES)}")
    return COMPUTE_DTYPES[name]


def transformer_config(model: ml_collections.ConfigDict) -> TransformerConfig:
    """The block options of a config's `model` section (checked: bad values are UserErrors). An option
    the section lacks takes its default: runs saved before it existed computed the model that way. Where a
    switch keeps attention off the fused kernel this platform would run, one line says so (fallback_note)."""
    config = from_section(TransformerConfig, model)
    if note := fallback_note(config.attention_impl, jax.default_backend(), config.attention_softcap):
        print(note)
    return config
