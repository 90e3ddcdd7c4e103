"""The block options are declared once (TransformerConfig / MoeConfig fields): the config's `model`
section, its checks, the compatibility with saved runs and the switch table of docs/configs.md all follow them."""

import dataclasses
import json
import pathlib
import re

import jax.numpy as jnp
import ml_collections
import pytest

from lm.errors import UserError
from lm.layers.options import (
    Description,
    check_options,
    config_key,
    config_value,
    declared_section,
    description,
    from_section,
    left_at_default,
    option,
    option_fields,
)
from lm.layers.transformer import MoeConfig, TransformerConfig
from lm.models.config import NOT_ABLATIONS, transformer_config, transformer_options

SWITCHES_PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "configs.md"


def flat_options() -> dict[str, tuple[dataclasses.Field, object]]:
    """'norm' -> (field, type), 'moe.top_k' -> ..., for every option (config keys)."""
    options = {}
    for field, kind in option_fields(TransformerConfig):
        if dataclasses.is_dataclass(kind):
            options.update({f"{config_key(field)}.{config_key(f)}": (f, k) for f, k in option_fields(kind)})
        else:
            options[config_key(field)] = (field, kind)
    return options


def test_the_section_holds_every_field_at_its_default():
    section = transformer_options()
    assert set(section) == {config_key(f) for f in dataclasses.fields(TransformerConfig)}
    assert set(section.moe) == {f.name for f in dataclasses.fields(MoeConfig)}
    for key, (field, _) in flat_options().items():
        value = section.moe[key.split(".")[1]] if key.startswith("moe.") else section[key]
        assert value == config_value(field, field.default), key
        assert field.metadata["doc"], f"{key} has no description"
    assert section.compute_dtype == "float32" and section.moe.num_experts == 0
    assert transformer_config(section) == TransformerConfig()


def test_the_generated_defaults_are_the_ones_configs_always_had():
    assert transformer_options().to_dict() == {
        "num_layers": 4, "num_heads": 4, "num_kv_heads": 4, "embed_dim": 128, "mlp": "gelu", "mlp_ratio": 4.0,
        "mlp_multiple": 8, "mlp_hidden_dim": 0, "norm": "layer", "norm_position": "pre",
        "norm_epsilon": 1e-5, "position": "learned", "rope_base": 10000.0,
        "rope_scaling": "none", "rope_scaling_factor": 1.0, "rope_original_context": 0, "rope_yarn_beta_fast": 32.0,
        "rope_yarn_beta_slow": 1.0, "rope_yarn_attention_factor": 0.0, "rope_yarn_truncate": True,
        "rope_llama3_low_freq_factor": 1.0, "rope_llama3_high_freq_factor": 4.0,
        "dropout": 0.0, "attention_dropout": 0.0, "use_bias": True, "init": "gpt2", "qk_norm": False,
        "attention_softcap": 0.0, "logit_softcap": 0.0, "parallel_block": False, "compute_dtype": "float32",
        "attention_impl": "auto", "context_parallel": "all_gather", "scan_layers": False, "remat": "none",
        "moe": {"num_experts": 0, "every": 2, "top_k": 2, "capacity_factor": 1.25, "load_balance_weight": 0.01,
                "router_z_weight": 0.001},
        "lora": {"rank": 0, "alpha": 16.0, "dropout": 0.0,
                 "targets": ("query", "key", "value", "out", "gate", "up", "down")},
        "parametrization": "standard", "mup_base_width": 0, "mup_base_head_dim": 0,
    }


def test_overrides_and_a_saved_config_json_round_trip():
    section = transformer_options(num_layers=2, norm="rms", compute_dtype="bfloat16", remat="full")
    section.moe.num_experts = 4
    expected = TransformerConfig(num_layers=2, norm="rms", dtype=jnp.bfloat16, remat="full",
                                 moe=MoeConfig(num_experts=4))
    assert transformer_config(section) == expected
    saved = ml_collections.ConfigDict(json.loads(section.to_json()))  # as lm/runs.py reads config.json
    assert transformer_config(saved) == expected


@pytest.mark.parametrize("key", ["attention_impl", "scan_layers", "remat", "moe.router_z_weight", "moe"])
def test_a_run_saved_before_an_option_existed_gets_its_default(key):
    saved = transformer_options(num_layers=2, remat="full", scan_layers=True).to_dict()
    saved["moe"]["router_z_weight"] = 0.5
    *parents, name = key.split(".")
    del (saved[parents[0]] if parents else saved)[name]
    built = transformer_config(ml_collections.ConfigDict(saved))
    expected = {"attention_impl": ("attention_impl", "auto"), "scan_layers": ("scan_layers", False),
                "remat": ("remat", "none")}
    if key in expected:
        attribute, default = expected[key]
        assert getattr(built, attribute) == default
    elif key == "moe":
        assert built.moe == MoeConfig()
    else:
        assert built.moe.router_z_weight == 0.001
    assert built.num_layers == 2  # the rest as saved


@pytest.mark.parametrize("key", [key for key, (field, _) in flat_options().items() if field.metadata["choices"]])
def test_a_value_outside_the_choices_is_a_user_error(key):
    saved = transformer_options().to_dict()
    *parents, name = key.split(".")
    (saved[parents[0]] if parents else saved)[name] = "bogus"
    with pytest.raises(UserError, match=rf"^model\.{re.escape(key)}='bogus': use one of \("):
        transformer_config(ml_collections.ConfigDict(saved))


@pytest.mark.parametrize("key, value, kind", [
    ("num_layers", "4", "an int"), ("num_layers", True, "an int"), ("rope_base", "1e4", "a float"),
    ("use_bias", 1, "a bool"), ("moe.top_k", 1.5, "an int"), ("moe.capacity_factor", None, "a float"),
])
def test_a_value_of_the_wrong_type_is_a_user_error(key, value, kind):
    saved = transformer_options().to_dict()  # as a hand-edited config.json could hold it
    *parents, name = key.split(".")
    (saved[parents[0]] if parents else saved)[name] = value
    with pytest.raises(UserError, match=rf"^model\.{re.escape(key)}=.* is not {kind}: give one like "):
        transformer_config(ml_collections.ConfigDict(saved))


def test_a_float_option_takes_an_int():
    assert transformer_config(ml_collections.ConfigDict({"mlp_ratio": 2, "rope_base": 500})).mlp_ratio == 2


def test_a_new_option_is_one_field():
    """The machinery is generic: a toy options dataclass gets its section, checks and defaults."""
    @dataclasses.dataclass(frozen=True)
    class Inner:
        width: int = option(3, "a width")

        def __post_init__(self):
            check_options(self, "toy.inner.")

    @dataclasses.dataclass(frozen=True)
    class Toy:
        kind: str = option("a", "a kind", choices=("a", "b"))
        scale: float = option(1.0, "a mapped value", choices={"one": 1.0, "two": 2.0}, key="scale_name")
        inner: Inner = option(Inner(), "nested")

        def __post_init__(self):
            check_options(self, "toy.")

    section = declared_section(Toy)
    assert section.to_dict() == {"kind": "a", "scale_name": "one", "inner": {"width": 3}}
    assert description(section, "scale_name") == Description("a mapped value", ("one", "two"), default="one")
    assert description(section.inner, "width") == Description("a width", default=3)
    section.inner.width = 4
    assert left_at_default(section, "scale_name") and not left_at_default(section.inner, "width")
    assert from_section(Toy, {"scale_name": "two", "inner": {"width": 5}, "other": 0}) == Toy("a", 2.0, Inner(5))
    with pytest.raises(UserError, match=r"^toy.scale_name='three': use one of \('one', 'two'\)$"):
        from_section(Toy, {"scale_name": "three"})
    with pytest.raises(UserError, match=r"^toy.inner.width='5' is not an int"):
        from_section(Toy, {"inner": {"width": "5"}})


def switch_table_rows() -> list[tuple[list[str], list[str]]]:
    """(switches without 'model.', values) of each row of the switch table of docs/configs.md."""
    text = SWITCHES_PAGE.read_text()
    section = text.split("\n## Architecture switches", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `model."):
            switches_cell, values_cell = line.split("|")[1:3]
            switches = [name.removeprefix("model.") for name in re.findall(r"`([^`]+)`", switches_cell)]
            rows.append((switches, re.findall(r"`([^`]+)`", values_cell)))
    return rows


def test_the_switch_table_lists_every_ablation_option_default_first():
    options = flat_options()
    listed = set()
    for switches, values in switch_table_rows():
        assert values, f"no values for {switches}"
        for i, key in enumerate(switches):
            assert key in options, f"the switch table lists model.{key}, which is no option"
            field, kind = options[key]
            default = str(config_value(field, field.default))
            if len(switches) == 1:  # the default, then the other values
                assert values[0] == default, f"model.{key}: the table's default is {values[0]}, the field's {default}"
                choices = field.metadata["choices"]
                allowed = {"True", "False"} if kind is bool else set(map(str, choices)) if choices else None
                assert allowed is None or set(values) == allowed, f"model.{key}: table {values}, field {allowed}"
            else:  # one default per switch, or one shared by all
                shown = values[0] if len(values) == 1 else values[i]
                assert shown == default, f"model.{key}: the table's default is {shown}, the field's {default}"
            listed.add(key)
    assert not listed & set(NOT_ABLATIONS), "the switch table lists a non-ablation option"
    assert set(NOT_ABLATIONS) <= set(options), "NOT_ABLATIONS names a key that is no option"
    missing = set(options) - listed - set(NOT_ABLATIONS) - {"moe"}
    assert not missing, f"options missing from the switch table (or from NOT_ABLATIONS): {sorted(missing)}"
