"""ViT (transformers' ViTForImageClassification, ViTModel) <-> lm's ViT (lm/models/vit.py, experiment
image_classification) with model.pool=cls and model.position=learned.

The P x P patch convolution (D, C, P, P) is lm's Linear over each flattened (row, col, channel)
patch, kernel (P*P*C, D). transformers' position table has a row for the [CLS] token too; lm adds
positions to the patches only, so on import the [CLS] token takes its row (cls + table[0], the same
sum the model computes) and on export that row is zeros. ViTModel's pooler (a tanh dense on [CLS])
has no lm counterpart and is not read: the classifier reads the final norm's [CLS] output, as in
ViTForImageClassification. The model takes images (B, H, W, C), transformers' pixel_values
(B, C, H, W) transposed.
"""

import jax.numpy as jnp
import ml_collections

from lm.data import images
from lm.hf.mapping import (
    Fields,
    Rule,
    copy,
    dense,
    encoder_config,
    encoder_fields,
    norm,
    one_to_one,
    unsupported,
)

ARCHITECTURES = ("ViTForImageClassification", "ViTModel")
EXPERIMENT = "image_classification"
PREFIX = "vit."  # a ViTModel checkpoint has its names without it
IGNORED = ("vit.pooler.",)


def lm_fields(hf: dict) -> Fields:
    if not hf.get("qkv_bias", True):
        raise unsupported("qkv_bias", False, "model.use_bias gives the attention and the MLP biases together")
    return {
        **encoder_fields(hf, "pre"),
        "model.pool": ("cls", ""),
        "model.patch_size": (hf["patch_size"], "patch_size"),
        "model.use_bias": (True, "qkv_bias"),
    }


def hf_config(config: ml_collections.ConfigDict, vocab_size: int | None = None) -> dict:
    """(vocab_size: unused.) The image size and classes are the run's: CIFAR-10's names, or for a data.source
    transformers' default names (LABEL_0, ...) for its model.num_classes, which config.json records."""
    m = config.model
    names = images.CLASS_NAMES if not config.data.get("source") else [f"LABEL_{k}" for k in range(m.num_classes)]
    return {
        "architectures": ["ViTForImageClassification"], "model_type": "vit", **encoder_config(config),
        "image_size": m.get("image_size", images.IMAGE_SHAPE[0]), "patch_size": m.patch_size,
        "num_channels": images.IMAGE_SHAPE[2], "qkv_bias": m.use_bias,
        "id2label": dict(enumerate(names)),
        "label2id": {name: i for i, name in enumerate(names)},
    }


def patch_kernel(hf: str, lm: str, width: int, patch: int, channels: int) -> Rule:
    """The conv weight (D, C, P, P) <-> lm's kernel (P*P*C, D) over patches flattened (row, col, channel)."""
    return one_to_one(hf, lm, lambda w: w.transpose(2, 3, 1, 0).reshape(patch * patch * channels, width),
                      lambda k: k.reshape(patch, patch, channels, width).transpose(3, 2, 0, 1))


def rules(hf: dict, architecture: str, config: ml_collections.ConfigDict) -> list[Rule]:
    width, heads, hidden = hf["hidden_size"], hf["num_attention_heads"], hf["intermediate_size"]
    head_dim = width // heads
    cls_and_positions = Rule(
        ("vit.embeddings.cls_token", "vit.embeddings.position_embeddings"), ("cls", "position_embed"),
        lambda cls, table: (cls + table[:, :1], table[0, 1:]),  # (1, 1, D), (N, D)
        lambda cls, table: (cls, jnp.concatenate([jnp.zeros_like(cls), table[None]], axis=1)))
    found = [cls_and_positions,
             patch_kernel("vit.embeddings.patch_embeddings.projection.weight", "patch_embed/projection/kernel",
                          width, hf["patch_size"], hf.get("num_channels", 3)),
             copy("vit.embeddings.patch_embeddings.projection.bias", "patch_embed/projection/bias")]
    for i in range(hf["num_hidden_layers"]):
        hf_block, block = f"vit.encoder.layer.{i}", f"encoder/block_{i}"
        found += norm(f"{hf_block}.layernorm_before", f"{block}/norm_attention", "layer")
        for name in ("query", "key", "value"):
            found += dense(f"{hf_block}.attention.attention.{name}", f"{block}/attention/{name}", (width,),
                           (heads, head_dim))
        found += dense(f"{hf_block}.attention.output.dense", f"{block}/attention/out", (heads, head_dim), (width,))
        found += norm(f"{hf_block}.layernorm_after", f"{block}/norm_mlp", "layer")
        found += dense(f"{hf_block}.intermediate.dense", f"{block}/mlp/up", (width,), (hidden,))
        found += dense(f"{hf_block}.output.dense", f"{block}/mlp/down", (hidden,), (width,))
    found += norm("vit.layernorm", "encoder/norm_final", "layer")
    if architecture == "ViTForImageClassification":
        found += dense("classifier", "head", (width,), (len(hf.get("id2label") or {0: 0, 1: 1}),))
    return found
