"""What the architecture modules (gpt2.py, llama.py, vit.py, bert.py) are written in: rules that map
Hugging Face tensors to lm parameters and back, and the lm config fields a config.json implies.

A Rule names some Hugging Face tensors, some lm parameters ('decoder/block_0/attention/query/kernel',
the unrolled layout) and the two functions between them; one list of rules serves import and export,
so every name and transpose is written once. The functions use jax.numpy, so the same rules give the
lm shapes without reading anything (jax.eval_shape) and the arrays themselves.
"""

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import ml_collections

from lm.errors import UserError
from lm.layers.mlp import mlp_hidden_dim


@dataclasses.dataclass(frozen=True)
class Rule:
    hf: tuple[str, ...]
    lm: tuple[str, ...]
    to_lm: Callable[..., tuple]  # the hf arrays -> the lm arrays
    to_hf: Callable[..., tuple]  # the lm arrays -> the hf arrays


def one_to_one(hf: str, lm: str, to_lm: Callable, to_hf: Callable) -> Rule:
    return Rule((hf,), (lm,), lambda x: (to_lm(x),), lambda x: (to_hf(x),))


def copy(hf: str, lm: str) -> Rule:
    return one_to_one(hf, lm, lambda x: x, lambda x: x)


def dense(hf: str, lm: str, in_shape: tuple[int, ...], out_shape: tuple[int, ...], bias: bool = True,
          conv1d: bool = False) -> list[Rule]:
    """hf.weight (out, in) (torch Linear), or (in, out) with conv1d (GPT-2's Conv1D), and hf.bias (out,)
    <-> lm/kernel in_shape + out_shape (an lm Linear over several axes, e.g. (D,) -> (H, Dh)), lm/bias."""
    fan_in, fan_out = math.prod(in_shape), math.prod(out_shape)

    def kernel_to_lm(w):
        return (w if conv1d else w.T).reshape(in_shape + out_shape)

    def kernel_to_hf(k):
        matrix = k.reshape(fan_in, fan_out)
        return matrix if conv1d else matrix.T

    rules = [one_to_one(f"{hf}.weight", f"{lm}/kernel", kernel_to_lm, kernel_to_hf)]
    if bias:
        rules.append(one_to_one(f"{hf}.bias", f"{lm}/bias", lambda b: b.reshape(out_shape),
                                lambda b: b.reshape(fan_out)))
    return rules


def norm(hf: str, lm: str, kind: str, weight: str = "weight", bias: str = "bias") -> list[Rule]:
    """A LayerNorm (hf.weight, hf.bias) or RMSNorm (hf.weight) <-> lm's Norm (lm/LayerNorm_0/scale, bias or
    lm/RMSNorm_0/scale)."""
    if kind == "rms":
        return [copy(f"{hf}.{weight}", f"{lm}/RMSNorm_0/scale")]
    return [copy(f"{hf}.{weight}", f"{lm}/LayerNorm_0/scale"), copy(f"{hf}.{bias}", f"{lm}/LayerNorm_0/bias")]


def vocab_rows(hf: str, lm: str, vocab_size: int, padded: int, transpose: bool = False) -> Rule:
    """hf (V, D) <-> lm (V padded, D), or (D, V padded) with transpose (an untied output kernel): the
    padding rows are zeros on import and cut on export (lm never reads nor outputs them)."""

    def to_lm(x):
        x = jnp.pad(x, ((0, padded - vocab_size), (0, 0)))
        return x.T if transpose else x

    return one_to_one(hf, lm, to_lm, lambda x: (x.T if transpose else x)[:vocab_size])


def padded_vocab(vocab_size: int, multiple: int) -> int:
    return -(-vocab_size // multiple) * multiple


def apply(rules: list[Rule], arrays: dict, direction: str) -> dict:
    """arrays (flat: hf names, or lm names with '/') through the rules' to_lm or to_hf -> the other side."""
    out = {}
    for rule in rules:
        source, target = (rule.hf, rule.lm) if direction == "to_lm" else (rule.lm, rule.hf)
        results = getattr(rule, direction)(*(arrays[name] for name in source))
        out.update(zip(target, results, strict=True))
    return out


ACTIVATIONS = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu": "gelu_exact", "relu": "relu"}  # -> model.mlp
HF_ACTIVATIONS = {"gelu": "gelu_new", "gelu_exact": "gelu", "relu": "relu"}  # model.mlp -> transformers' name


def mlp_kind(hf: dict, field: str, default: str) -> str:
    """model.mlp for the activation config.json names in field (GPT-2's activation_function, hidden_act)."""
    activation = hf.get(field, default)
    if activation not in ACTIVATIONS:
        raise unsupported(field, activation, f"lm's MLPs use one of {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[activation]


# The lm config fields a config.json implies: {"model.embed_dim": (768, "n_embd"), "model.norm": ("layer", "")},
# each with the config.json field it comes from ("": fixed by the architecture).
Fields = dict[str, tuple[Any, str]]


# The block switches no architecture lm reads or writes has (Gemma 2's soft-caps, OLMo 2's and Qwen 3's QK-norm,
# GPT-J's parallel block are not among them): every lm_fields holds them off, so a run with one on does not
# export, and an init_from=hf:DIR config with one on is a difference, each one line naming the switch.
SWITCHES_OFF: Fields = {
    "model.qk_norm": (False, ""),
    "model.attention_softcap": (0.0, ""),
    "model.logit_softcap": (0.0, ""),
    "model.parallel_block": (False, ""),
    "model.parametrization": ("standard", ""),  # μP's attention scale and readout multiplier: no config.json field
}


def unsupported(field: str, value: Any, why: str) -> UserError:
    return UserError(f"config.json has {field}={value!r}, which lm cannot represent: {why}")


def config_value(config: ml_collections.ConfigDict, key: str) -> Any:
    """The value of a dotted key ('model.moe.num_experts') in config; model.mlp_hidden_dim is the MLP's
    effective hidden width (from mlp_ratio and mlp_multiple when the field is 0). None where absent."""
    if key == "model.mlp_hidden_dim":
        m = config.model
        return mlp_hidden_dim(m.mlp, m.embed_dim, m.mlp_ratio, m.mlp_multiple, m.get("mlp_hidden_dim", 0))
    node = config
    for part in key.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            return None
        node = node[part]
    return node


def encoder_fields(hf: dict, norm_position: str) -> Fields:
    """The fields of a BERT-style encoder's config.json (BertConfig, ViTConfig name them alike): LayerNorm
    blocks, multi-head attention, learned positions, no experts; norm_position is the architecture's."""
    return {
        "model.num_layers": (hf["num_hidden_layers"], "num_hidden_layers"),
        "model.num_heads": (hf["num_attention_heads"], "num_attention_heads"),
        "model.num_kv_heads": (hf["num_attention_heads"], "num_attention_heads"),
        "model.embed_dim": (hf["hidden_size"], "hidden_size"),
        "model.mlp": (mlp_kind(hf, "hidden_act", "gelu"), "hidden_act"),
        "model.mlp_hidden_dim": (hf["intermediate_size"], "intermediate_size"),
        "model.norm": ("layer", ""),
        "model.norm_position": (norm_position, ""),
        "model.norm_epsilon": (hf.get("layer_norm_eps", 1e-12), "layer_norm_eps"),
        "model.position": ("learned", ""),
        "model.moe.num_experts": (0, ""),
        **SWITCHES_OFF,
    }


def encoder_config(config: ml_collections.ConfigDict) -> dict:
    """The config.json entries of encoder_fields, from a run's config."""
    m = config.model
    return {
        "hidden_size": m.embed_dim, "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_heads,
        "intermediate_size": config_value(config, "model.mlp_hidden_dim"),
        "hidden_act": HF_ACTIVATIONS.get(m.mlp, "gelu"), "hidden_dropout_prob": m.dropout,
        "attention_probs_dropout_prob": m.attention_dropout, "layer_norm_eps": m.norm_epsilon,
    }


# The lm fields a config.json bounds from above: {"data.context_length": (1024, "n_positions")} (at most that).
Limits = dict[str, tuple[int, str]]


def differences(fields: Fields, config: ml_collections.ConfigDict) -> list[tuple[str, Any, Any, str]]:
    """(key, this config's value, the implied value, its config.json field) for every field that differs;
    a key the config does not have (data.vocab_size of a text corpus) is not compared."""
    found = []
    for key, (wanted, source) in fields.items():
        actual = config_value(config, key)
        if actual is not None and actual != wanted:
            found.append((key, actual, wanted, source))
    return found


def excesses(limits: Limits, config: ml_collections.ConfigDict) -> list[tuple[str, Any, Any, str]]:
    """(key, this config's value, the limit, its config.json field) for every field over its limit."""
    found = []
    for key, (limit, source) in limits.items():
        actual = config_value(config, key)
        if actual is not None and actual > limit:
            found.append((key, actual, limit, source))
    return found


def overrides(found: list[tuple[str, Any, Any, str]]) -> str:
    """'--config.model.embed_dim=768 --config.model.norm=rms': the flags that remove the differences."""
    return " ".join(f"--config.{key}={wanted}" for key, _, wanted, _ in found)
