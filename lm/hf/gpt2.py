"""GPT-2 (transformers' GPT2LMHeadModel) <-> lm's GPT (lm/models/gpt.py, experiment language_model).

GPT-2 is lm's default block: pre-norm LayerNorm, GELU MLP (tanh approximation, "gelu_new"), learned
positions, biases, tied embeddings. Its Conv1D weights are stored (in, out), lm's kernels too; the
attention's query, key and value are one fused c_attn (D, 3D), split into lm's three (D, H, Dh).
lm pads the vocabulary to model.vocab_multiple: import adds zero rows, export cuts them. A run may
train on a shorter context than n_positions: import keeps the first data.context_length rows of the
position table, export writes that many (n_positions = data.context_length).
Checkpoints of the bare GPT2Model (the hub's `gpt2`: names without "transformer.", the attention's
causal-mask buffers 'attn.bias') read as well.
"""

import jax.numpy as jnp
import ml_collections

from lm.hf.mapping import (
    HF_ACTIVATIONS,
    SWITCHES_OFF,
    Fields,
    Limits,
    Rule,
    config_value,
    dense,
    mlp_kind,
    norm,
    one_to_one,
    padded_vocab,
    unsupported,
    vocab_rows,
)

ARCHITECTURES = ("GPT2LMHeadModel",)
EXPERIMENT = "language_model"
PREFIX = "transformer."  # the base model's names; a GPT2Model checkpoint has them without it
IGNORED = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers in older checkpoints


def lm_fields(hf: dict) -> Fields:
    for field, wanted in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                          ("add_cross_attention", False)):
        if hf.get(field, wanted) != wanted:
            raise unsupported(field, hf[field], f"lm's attention is GPT-2's with {field}={wanted}")
    width = hf["n_embd"]
    return {
        "model.num_layers": (hf["n_layer"], "n_layer"),
        "model.num_heads": (hf["n_head"], "n_head"),
        "model.num_kv_heads": (hf["n_head"], "n_head"),
        "model.embed_dim": (width, "n_embd"),
        "model.mlp": (mlp_kind(hf, "activation_function", "gelu_new"), "activation_function"),
        "model.mlp_hidden_dim": (hf.get("n_inner") or 4 * width, "n_inner"),
        "model.norm": ("layer", ""),
        "model.norm_position": ("pre", ""),
        "model.norm_epsilon": (hf.get("layer_norm_epsilon", 1e-5), "layer_norm_epsilon"),
        "model.position": ("learned", ""),
        "model.use_bias": (True, ""),
        "model.moe.num_experts": (0, ""),
        **SWITCHES_OFF,
        "model.scale_embeddings": (False, ""),
        "model.tie_embeddings": (hf.get("tie_word_embeddings", True), "tie_word_embeddings"),
        "data.vocab_size": (hf["vocab_size"], "vocab_size"),
    }


def lm_limits(hf: dict) -> Limits:
    """A run trains on at most n_positions positions: the rows of GPT-2's position table."""
    return {"data.context_length": (hf["n_positions"], "n_positions")}


def hf_config(config: ml_collections.ConfigDict, vocab_size: int) -> dict:
    m = config.model
    return {
        "architectures": list(ARCHITECTURES), "model_type": "gpt2", "vocab_size": vocab_size,
        "n_positions": config.data.context_length, "n_embd": m.embed_dim, "n_layer": m.num_layers,
        "n_head": m.num_heads, "n_inner": config_value(config, "model.mlp_hidden_dim"),
        "activation_function": HF_ACTIVATIONS.get(m.mlp, "gelu_new"), "layer_norm_epsilon": m.norm_epsilon,
        "tie_word_embeddings": m.tie_embeddings, "resid_pdrop": m.dropout, "embd_pdrop": m.dropout,
        "attn_pdrop": m.attention_dropout, "bos_token_id": None, "eos_token_id": None,
    }


def fused_qkv(hf: str, lm: str, width: int, heads: int) -> list[Rule]:
    """c_attn.weight (D, 3D) and c_attn.bias (3D,) <-> lm's query, key and value kernels (D, H, Dh) and
    biases (H, Dh)."""
    head_dim = width // heads
    parts = ("query", "key", "value")
    weight = Rule((f"{hf}.weight",), tuple(f"{lm}/{p}/kernel" for p in parts),
                  lambda w: tuple(w[:, j * width:(j + 1) * width].reshape(width, heads, head_dim) for j in range(3)),
                  lambda *k: (jnp.concatenate([x.reshape(width, width) for x in k], axis=1),))
    bias = Rule((f"{hf}.bias",), tuple(f"{lm}/{p}/bias" for p in parts),
                lambda b: tuple(b[j * width:(j + 1) * width].reshape(heads, head_dim) for j in range(3)),
                lambda *b: (jnp.concatenate([x.reshape(width) for x in b]),))
    return [weight, bias]


def rules(hf: dict, architecture: str, config: ml_collections.ConfigDict) -> list[Rule]:
    vocab, width, heads = hf["vocab_size"], hf["n_embd"], hf["n_head"]
    hidden = hf.get("n_inner") or 4 * width
    padded = padded_vocab(vocab, config.model.vocab_multiple)
    context = config.data.context_length  # at most n_positions (lm_limits, checked by lm/hf/source.py)
    found = [vocab_rows("transformer.wte.weight", "token_embed/embedding", vocab, padded),
             one_to_one("transformer.wpe.weight", "position_embed/embedding", lambda x: x[:context], lambda x: x)]
    for i in range(hf["n_layer"]):
        hf_block, block = f"transformer.h.{i}", f"decoder/block_{i}"
        found += norm(f"{hf_block}.ln_1", f"{block}/norm_attention", "layer")
        found += fused_qkv(f"{hf_block}.attn.c_attn", f"{block}/attention", width, heads)
        found += dense(f"{hf_block}.attn.c_proj", f"{block}/attention/out", (heads, width // heads), (width,),
                       conv1d=True)
        found += norm(f"{hf_block}.ln_2", f"{block}/norm_mlp", "layer")
        found += dense(f"{hf_block}.mlp.c_fc", f"{block}/mlp/up", (width,), (hidden,), conv1d=True)
        found += dense(f"{hf_block}.mlp.c_proj", f"{block}/mlp/down", (hidden,), (width,), conv1d=True)
    found += norm("transformer.ln_f", "decoder/norm_final", "layer")
    if not hf.get("tie_word_embeddings", True):
        found.append(vocab_rows("lm_head.weight", "lm_head/kernel", vocab, padded, transpose=True))
    return found
