"""Llama (transformers' LlamaForCausalLM) <-> lm's GPT (lm/models/gpt.py, experiment language_model).

A Llama block in lm's switches: model.norm=rms (norm_epsilon = rms_norm_eps), model.mlp=swiglu with
mlp_hidden_dim = intermediate_size, model.position=rope (rope_base = rope_theta; lm rotates the
channel pairs (i, i + Dh/2), the layout of transformers' rotate_half), model.num_kv_heads =
num_key_value_heads (grouped-query attention), model.use_bias=False (attention_bias and mlp_bias),
model.tie_embeddings = tie_word_embeddings (False for Llama: its own lm_head). RoPE scaling: rope_type
linear, yarn and llama3 are model.rope_scaling of that name with its parameters (rope_fields); lm's
rope_scaling=ntk (a fixed NTK-aware base) is plain RoPE of base rope_base * factor^(Dh/(Dh-2)), which a run
must say so to export; transformers' dynamic NTK (its base grows with each call's sequence length) and
longrope have no lm counterpart.
"""

import math

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
from lm.layers.positions import ntk_base

ARCHITECTURES = ("LlamaForCausalLM",)
EXPERIMENT = "language_model"
PREFIX = "model."
IGNORED = ("rotary_emb.inv_freq",)  # a buffer in older checkpoints


def rope(hf: dict) -> tuple[dict, str]:
    """(the RoPE parameters, the config.json entry they come from), where transformers 5 finds them: 4's
    rope_scaling before 5's rope_parameters, rope_theta (top-level) where they lack it."""
    where = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
    return {"rope_theta": hf.get("rope_theta", 10000.0), **(hf.get(where) or {})}, where


def rope_fields(hf: dict) -> Fields:
    """model.rope_base and the model.rope_* scaling options of config.json's RoPE parameters, read as
    transformers reads them (its defaults where a parameter is absent; the original context is a top-level
    original_max_position_embeddings, else the parameters', else max_position_embeddings)."""
    parameters, where = rope(hf)
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    fields = {"model.rope_base": (float(parameters["rope_theta"]), "rope_theta"),
              "model.rope_scaling": ("none" if kind == "default" else kind, f"{where}.rope_type")}
    if kind == "default":
        return {**fields, "model.rope_scaling_factor": (1.0, "")}
    if kind == "dynamic":
        raise unsupported("rope_type", kind, "transformers' dynamic NTK grows the base with each call's sequence "
                                             "length; lm's rope_scaling=ntk is a fixed base * factor^(Dh/(Dh-2))")
    if kind not in ("linear", "yarn", "llama3"):
        raise unsupported("rope_type", kind, "lm scales RoPE as transformers' linear, yarn and llama3 do")
    max_length = hf.get("max_position_embeddings", 2048)
    original = hf.get("original_max_position_embeddings") or parameters.get("original_max_position_embeddings",
                                                                             max_length)
    factor = parameters.get("factor") or (max_length / original if kind == "yarn" else None)
    if factor is None:
        raise unsupported(f"{where}.factor", None, f"rope_type={kind} needs a factor")
    fields["model.rope_scaling_factor"] = (float(factor), f"{where}.factor")
    if kind == "linear":
        return fields
    fields["model.rope_original_context"] = (original, f"{where}.original_max_position_embeddings")
    if kind == "llama3":
        return {**fields,
                "model.rope_llama3_low_freq_factor": (float(parameters["low_freq_factor"]), f"{where}.low_freq_factor"),
                "model.rope_llama3_high_freq_factor": (float(parameters["high_freq_factor"]),
                                                       f"{where}.high_freq_factor")}
    attention_factor = parameters.get("attention_factor") or 0.0
    mscale, mscale_all_dim = parameters.get("mscale"), parameters.get("mscale_all_dim")
    if not attention_factor and mscale and mscale_all_dim and factor > 1:  # DeepSeek's ratio of two mscales
        attention_factor = (0.1 * mscale * math.log(factor) + 1) / (0.1 * mscale_all_dim * math.log(factor) + 1)
    return {**fields,
            "model.rope_yarn_beta_fast": (float(parameters.get("beta_fast") or 32), f"{where}.beta_fast"),
            "model.rope_yarn_beta_slow": (float(parameters.get("beta_slow") or 1), f"{where}.beta_slow"),
            "model.rope_yarn_attention_factor": (float(attention_factor), f"{where}.attention_factor"),
            "model.rope_yarn_truncate": (bool(parameters.get("truncate", True)), f"{where}.truncate")}


def rope_parameters(model: ml_collections.ConfigDict) -> dict:
    """config.json's rope_parameters for the run's RoPE: rope_theta, rope_type and the parameters of that type
    (ntk: plain RoPE of the NTK-aware base)."""
    kind, factor = model.get("rope_scaling", "none"), model.get("rope_scaling_factor", 1.0)
    if kind in ("none", "ntk"):
        base = ntk_base(model.rope_base, model.embed_dim // model.num_heads, factor) if kind == "ntk" else \
            model.rope_base
        return {"rope_theta": base, "rope_type": "default"}
    parameters = {"rope_theta": model.rope_base, "rope_type": kind, "factor": factor}
    if kind == "linear":
        return parameters
    parameters["original_max_position_embeddings"] = model.rope_original_context
    if kind == "llama3":
        return {**parameters, "low_freq_factor": model.rope_llama3_low_freq_factor,
                "high_freq_factor": model.rope_llama3_high_freq_factor}
    parameters.update(beta_fast=model.rope_yarn_beta_fast, beta_slow=model.rope_yarn_beta_slow)
    if model.rope_yarn_attention_factor:
        parameters["attention_factor"] = model.rope_yarn_attention_factor
    if not model.rope_yarn_truncate:
        parameters["truncate"] = False
    return parameters


def rope_config(model: ml_collections.ConfigDict) -> dict:
    """The RoPE entries of config.json: transformers 5's rope_parameters, and 4's rope_theta and (scaled)
    rope_scaling."""
    parameters = rope_parameters(model)
    scaling = {key: value for key, value in parameters.items() if key != "rope_theta"}
    return {"rope_parameters": parameters, "rope_theta": parameters["rope_theta"],
            **({"rope_scaling": scaling} if scaling["rope_type"] != "default" else {})}


def max_positions(config: ml_collections.ConfigDict) -> int:
    """config.json's max_position_embeddings: the run's context length, or with yarn and llama3 scaling the
    factor times the original context where that is longer (the length the scaled RoPE is for, which
    transformers expects there)."""
    m = config.model
    if m.get("rope_scaling", "none") in ("yarn", "llama3"):
        return max(config.data.context_length, round(m.rope_scaling_factor * m.rope_original_context))
    return config.data.context_length


def lm_fields(hf: dict) -> Fields:
    if hf.get("hidden_act", "silu") != "silu":
        raise unsupported("hidden_act", hf["hidden_act"], "lm's SwiGLU gates with silu")
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
        **rope_fields(hf),
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
        "max_position_embeddings": max_positions(config), "rms_norm_eps": m.norm_epsilon,
        **rope_config(m),
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
