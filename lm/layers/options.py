"""Options declared once: dataclass fields that carry their description and allowed values.

TransformerConfig and MoeConfig (lm/layers/transformer.py) declare every block option with `option`.
From those fields come a config's `model` section (`defaults`), the dataclass built from such a
section (`from_section`) and the checks of types and allowed values (`check_options`, which the
dataclasses run on themselves), so a new switch is one field plus the layer code that uses it.
"""

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from lm.errors import UserError

CHECKED_TYPES = (bool, int, float, str)  # field types whose values are checked (float also takes an int)


def option(default: Any, doc: str, *, choices: Sequence | Mapping | None = None, key: str | None = None) -> Any:
    """A dataclass field: its default and a one-line description; choices, the allowed values (a
    sequence, or a mapping from the names a config holds to the values the field holds, e.g.
    "bfloat16" -> jnp.bfloat16); key, the config's name for the field where it differs."""
    return dataclasses.field(default=default, metadata={"doc": doc, "choices": choices, "key": key})


def option_fields(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    """(field, its type) of an options dataclass, in declaration order."""
    types = typing.get_type_hints(cls)
    return [(field, types[field.name]) for field in dataclasses.fields(cls)]


def config_key(field: dataclasses.Field) -> str:
    """The field's name in a config section."""
    return field.metadata.get("key") or field.name


def doc(field: dataclasses.Field) -> str:
    return field.metadata.get("doc", "")


def config_value(field: dataclasses.Field, value: Any) -> Any:
    """A field's value as a config holds it: the name of a mapped choice, else the value itself."""
    choices = field.metadata.get("choices")
    if isinstance(choices, Mapping):
        return next(name for name, mapped in choices.items() if mapped == value)
    return value


def defaults(cls: type) -> dict[str, Any]:
    """{config key: default} of an options dataclass; a nested options dataclass gives a nested dict."""
    return {
        config_key(field): defaults(kind) if dataclasses.is_dataclass(kind) else config_value(field, field.default)
        for field, kind in option_fields(cls)
    }


def from_section(cls: type, section: Mapping) -> Any:
    """cls from a config section (a ConfigDict, or the dict of a saved config.json); other keys of the
    section are ignored. A key the section lacks takes the field's default: runs saved before an
    option existed were computed the default way. The instance checks its values itself."""
    values = {}
    for field, kind in option_fields(cls):
        key = config_key(field)
        if dataclasses.is_dataclass(kind):
            values[field.name] = from_section(kind, section.get(key) or {})
            continue
        value = section.get(key, config_value(field, field.default))
        choices = field.metadata.get("choices")
        if isinstance(choices, Mapping) and isinstance(value, str):
            value = choices.get(value, value)  # an unknown name stays a name: check_options reports it
        values[field.name] = value
    return cls(**values)


def has_type(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def check_options(instance: Any, prefix: str) -> None:
    """UserError for the first field of an options dataclass whose value is not one of its choices
    or not of its type; prefix: where the fields sit in the config, e.g. "model."."""
    for field, kind in option_fields(type(instance)):
        value, name = getattr(instance, field.name), prefix + config_key(field)
        choices = field.metadata.get("choices")
        if choices is not None:
            allowed = tuple(choices.values() if isinstance(choices, Mapping) else choices)
            if not any(value is a or (type(value) is type(a) and value == a) for a in allowed):
                raise UserError(f"{name}={value!r}: use one of {tuple(choices)}")
        elif kind in CHECKED_TYPES and not has_type(value, kind):
            article = "an" if kind is int else "a"
            raise UserError(f"{name}={value!r} is not {article} {kind.__name__}: give one like {field.default!r}")
