"""Llama (transformers' LlamaForCausalLM) <-> lm's GPT (lm/models/gpt.py, experiment language_model).

A Llama block in lm's switches: model.norm=rms (norm_epsilon = rms_norm_eps), model.mlp=swiglu with
mlp_hidden_dim = intermediate_size, model.position=rope (rope_base = rope_theta; lm rotates the
channel pairs (i, i + Dh/2), the layout of transformers' rotate_half), model.num_kv_heads =
num_key_value_heads (grouped-query attention), model.use_bias=False (attention_bias and mlp_bias),
model.tie_embeddings = tie_word_embeddings (False for Llama: its own lm_head). RoPE scaling
(rope_type other than "default") has no lm counterpart.
"""

import ml_collections

from lm.hf.mapping import (
    SWITCHES_OFF,
    Fields,
    Rule,
    config_value,
    dense,
    norm,
    padded_vocab,
    unsupported,
    vocab_rows,
)

ARCHITECTURES = ("LlamaForCausalLM",)
EXPERIMENT = "language_model"
PREFIX = "model."
IGNORED = ("rotary_emb.inv_freq",)  # a buffer in older checkpoints


def rope(hf: dict) -> dict:
    """The RoPE parameters: transformers 5's rope_parameters, or 4's rope_theta and rope_scaling."""
    return hf.get("rope_parameters") or {"rope_theta": hf.get("rope_theta", 10000.0),
                                         **(hf.get("rope_scaling") or {})}


def lm_fields(hf: dict) -> Fields:
    if hf.get("hidden_act", "silu") != "silu":
        raise unsupported("hidden_act", hf["hidden_act"], "lm's SwiGLU gates with silu")
    rope_type = rope(hf).get("rope_type", rope(hf).get("type", "default"))
    if rope_type != "default":
        raise unsupported("rope_type", rope_type, "lm's RoPE has no scaling (rope_type must be 'default')")
    width, heads = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("head_dim") not in (None, width // heads):
        raise unsupported("head_dim", hf["head_dim"], f"lm's heads are hidden_size / num_attention_heads = "
                                                      f"{width // heads} wide")
    bias = hf.get("attention_bias", False)
    if hf.get("mlp_bias", False) != bias:
        raise unsupported("mlp_bias", hf["mlp_bias"], f"model.use_bias gives the attention and the MLP biases "
                                                      f"together, and attention_bias={bias}")
    return {
        "model.num_layers": (hf["num_hidden_layers"], "num_hidden_layers"),
        "model.num_heads": (heads, "num_attention_heads"),
        "model.num_kv_heads": (hf.get("num_key_value_heads") or heads, "num_key_value_heads"),
        "model.embed_dim": (width, "hidden_size"),
        "model.mlp": ("swiglu", ""),
        "model.mlp_hidden_dim": (hf["intermediate_size"], "intermediate_size"),
        "model.norm": ("rms", ""),
        "model.norm_position": ("pre", ""),
        "model.norm_epsilon": (hf.get("rms_norm_eps", 1e-6), "rms_norm_eps"),
        "model.position": ("rope", ""),
        "model.rope_base": (float(rope(hf)["rope_theta"]), "rope_theta"),
        "model.use_bias": (bias, "attention_bias"),
        "model.moe.num_experts": (0, ""),
        **SWITCHES_OFF,
        "model.scale_embeddings": (False, ""),
        "model.tie_embeddings": (hf.get("tie_word_embeddings", False), "tie_word_embeddings"),
        "data.vocab_size": (hf["vocab_size"], "vocab_size"),
    }


def hf_config(config: ml_collections.ConfigDict, vocab_size: int) -> dict:
    m = config.model
    return {
        "architectures": list(ARCHITECTURES), "model_type": "llama", "vocab_size": vocab_size,
        "hidden_size": m.embed_dim, "intermediate_size": config_value(config, "model.mlp_hidden_dim"),
        "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_heads, "num_key_value_heads": m.num_kv_heads,
        "head_dim": m.embed_dim // m.num_heads, "hidden_act": "silu",
        "max_position_embeddings": config.data.context_length, "rms_norm_eps": m.norm_epsilon,
        "rope_parameters": {"rope_theta": m.rope_base, "rope_type": "default"}, "rope_theta": m.rope_base,
        "attention_bias": m.use_bias, "mlp_bias": m.use_bias, "tie_word_embeddings": m.tie_embeddings,
        "attention_dropout": m.attention_dropout, "bos_token_id": None, "eos_token_id": None,
    }


def rules(hf: dict, architecture: str, config: ml_collections.ConfigDict) -> list[Rule]:
    vocab, width, heads = hf["vocab_size"], hf["hidden_size"], hf["num_attention_heads"]
    kv_heads, hidden = hf.get("num_key_value_heads") or heads, hf["intermediate_size"]
    head_dim, bias = width // heads, hf.get("attention_bias", False)
    padded = padded_vocab(vocab, config.model.vocab_multiple)
    found = [vocab_rows("model.embed_tokens.weight", "token_embed/embedding", vocab, padded)]
    for i in range(hf["num_hidden_layers"]):
        hf_block, block = f"model.layers.{i}", f"decoder/block_{i}"
        found += norm(f"{hf_block}.input_layernorm", f"{block}/norm_attention", "rms")
        for name, lm_name, n in (("q", "query", heads), ("k", "key", kv_heads), ("v", "value", kv_heads)):
            found += dense(f"{hf_block}.self_attn.{name}_proj", f"{block}/attention/{lm_name}", (width,),
                           (n, head_dim), bias)
        found += dense(f"{hf_block}.self_attn.o_proj", f"{block}/attention/out", (heads, head_dim), (width,), bias)
        found += norm(f"{hf_block}.post_attention_layernorm", f"{block}/norm_mlp", "rms")
        for name in ("gate", "up"):
            found += dense(f"{hf_block}.mlp.{name}_proj", f"{block}/mlp/{name}", (width,), (hidden,), bias)
        found += dense(f"{hf_block}.mlp.down_proj", f"{block}/mlp/down", (hidden,), (width,), bias)
    found += norm("model.norm", "decoder/norm_final", "rms")
    if not hf.get("tie_word_embeddings", False):
        found.append(vocab_rows("lm_head.weight", "lm_head/kernel", vocab, padded, transpose=True))
    return found
