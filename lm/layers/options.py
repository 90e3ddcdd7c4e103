"""Options declared once: dataclass fields that carry their description and allowed values.

TransformerConfig and MoeConfig (lm/layers/transformer.py) declare every block option with `option`.
From those fields come a config's `model` section (`declared_section`), the dataclass built from such a
section (`from_section`) and the checks of types and allowed values (`check_options`, which the
dataclasses run on themselves), so a new switch is one field plus the layer code that uses it.

The other config sections (run, optimizer, train, data, eval, sample, mesh) declare their keys with the
same `option` as they are built (`declare`); every section keeps each key's description and allowed
values beside it (`description`), which `lm train --print_config` lists.

A number's option declares the Range it may take (`bounds=at_least(1)`, `FRACTION`, ...); `check_declared`
checks every declared choice and range of a config before anything is written or compiled (the command
line's resolve_config, and lm.train.optim.resolve_schedule, which every run passes through). The
descriptions are kept per section object: `declared_copy` is a copy that keeps them.
"""

import dataclasses
import math
import typing
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from lm.errors import UserError

CHECKED_TYPES = (bool, int, float, str)  # field types whose values are checked (float also takes an int)


@dataclasses.dataclass(frozen=True)
class Range:
    """The numbers an option may take: from low (above it, where low_open) up to high (below it, where
    high_open), None: no end; also, single values allowed besides (e.g. -1: derived from the run).
    NaN and infinities are never in range."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    also: tuple = ()

    def __contains__(self, value: float) -> bool:
        if value in self.also:
            return True
        if not math.isfinite(value):
            return False
        above_low = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below_high = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above_low and below_high

    def __str__(self) -> str:
        low = None if self.low is None else f"{'more than' if self.low_open else 'at least'} {self.low}"
        high = None if self.high is None else f"{'below' if self.high_open else 'at most'} {self.high}"
        if low and high and not self.low_open and not self.high_open:
            text = f"from {self.low} to {self.high}"
        elif low and not high and not self.low_open:
            text = f"{self.low} or more"
        else:
            text = " and ".join(filter(None, (low, high))) or "any finite number"
        return text + "".join(f", or {value}" for value in self.also)


def at_least(low: float, *also: float) -> Range:
    """low or more (and the values also); e.g. at_least(1) for counts, at_least(0) for rates."""
    return Range(low, also=also)


def above(low: float) -> Range:
    """More than low: e.g. above(0) for a scale that must not vanish."""
    return Range(low, low_open=True)


FRACTION = Range(0, 1)  # a share, 0 to 1
SHARE_BELOW_ONE = Range(0, 1, high_open=True)  # a share that leaves something: dropout, warmup_fraction, b1, b2


def option(default: Any, doc: str, *, choices: Sequence | Mapping | None = None, bounds: Range | None = None,
           key: str | None = None) -> Any:
    """A dataclass field: its default and a one-line description; choices, the allowed values (a
    sequence, or a mapping from the names a config holds to the values the field holds, e.g.
    "bfloat16" -> jnp.bfloat16); bounds, the Range a number must lie in (check_declared); key, the
    config's name for the field where it differs."""
    return dataclasses.field(default=default, metadata={"doc": doc, "choices": choices, "bounds": bounds, "key": key})


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


@dataclasses.dataclass(frozen=True)
class Description:
    """What a config key means, in one line, the values it may take (choices, bounds; None: any of its type)
    and its declared default (what a key its config leaves alone holds: `left_at_default`)."""

    doc: str
    choices: tuple | None = None
    bounds: Range | None = None
    default: Any = None


_DESCRIPTIONS: dict[int, dict[str, Description]] = {}  # id(section) -> {key: Description}, while the section lives


def _keep(section: ml_collections.ConfigDict, key: str, described: Description) -> None:
    """Keeps described beside section, for its key, while the section lives."""
    if id(section) not in _DESCRIPTIONS:
        _DESCRIPTIONS[id(section)] = {}
        weakref.finalize(section, _DESCRIPTIONS.pop, id(section))
    _DESCRIPTIONS[id(section)][key] = described


def _describe(section: ml_collections.ConfigDict, key: str, declared: dataclasses.Field) -> None:
    """Keeps the description, choices and bounds of an `option` beside section, for its key."""
    choices = declared.metadata.get("choices")
    _keep(section, key, Description(doc(declared), None if choices is None else tuple(choices),
                                    declared.metadata.get("bounds"), config_value(declared, declared.default)))


def declare(section: ml_collections.ConfigDict, **options: dataclasses.Field) -> ml_collections.ConfigDict:
    """Sets each key of a config section to its option's default (`option(default, doc, choices=...)`)
    and keeps the option's description and choices beside the section (`description`); returns it."""
    for key, declared in options.items():
        section[key] = declared.default
        _describe(section, key, declared)
    return section


def description(section: ml_collections.ConfigDict, key: str) -> Description | None:
    """What was declared for section[key]; None where the section's builder declared nothing."""
    return _DESCRIPTIONS.get(id(section), {}).get(key)


def left_at_default(section: ml_collections.ConfigDict, key: str) -> bool:
    """Whether section[key] holds its declared default: what derived values may fill in (e.g. a language
    model's data.vocab_size, from its tokenizer). False where nothing was declared (a config read back from
    a run's config.json): its values are all taken as set."""
    declared = description(section, key)
    return declared is not None and key in section and section[key] == declared.default


def declared_copy(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """config.copy_and_resolve_references(), its sections keeping what was declared for their keys (a
    plain copy is a new ConfigDict that `description` knows nothing of)."""
    copy = config.copy_and_resolve_references()
    _carry_descriptions(config, copy)
    return copy


def _carry_descriptions(section: ml_collections.ConfigDict, copy: ml_collections.ConfigDict) -> None:
    for key, described in _DESCRIPTIONS.get(id(section), {}).items():
        _keep(copy, key, described)
    for key, value in section.items():
        if isinstance(value, ml_collections.ConfigDict):
            _carry_descriptions(value, copy[key])


def check_declared(config: ml_collections.ConfigDict, prefix: str = "") -> None:
    """UserError for the first key of config, at any depth, whose value is not one of its declared choices
    or a number outside its declared bounds (NaN and infinities are outside every range); keys nobody
    declared are not checked. Runs before anything is written or compiled (lm.train.optim.resolve_schedule)."""
    for key, value in config.items():
        name = prefix + key
        if isinstance(value, ml_collections.ConfigDict):
            check_declared(value, name + ".")
            continue
        declared = description(config, key)
        if declared is None:
            continue
        if declared.choices is not None and value not in declared.choices:
            raise UserError(f"{name}={value!r}: use one of {declared.choices}")
        if declared.bounds is not None and has_type(value, float) and value not in declared.bounds:
            raise UserError(f"{name}={value!r} is out of range: use {declared.bounds}")


def declared_section(cls: type) -> ml_collections.ConfigDict:
    """The config section of an options dataclass: every field at its default under its config key,
    declared with the field's description and choices; a nested options dataclass gives a sub-section."""
    section = ml_collections.ConfigDict()
    for field, kind in option_fields(cls):
        key = config_key(field)
        section[key] = declared_section(kind) if dataclasses.is_dataclass(kind) else config_value(field, field.default)
        _describe(section, key, field)
    return section


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
