"""A new run's parameters from another run's (init_from): fine-tuning, continued pretraining.

A source of parameters (a ParamSource: an lm run's Orbax checkpoint, CheckpointSource, or with
init_from=hf:DIR a Hugging Face model folder, lm/hf/source.py) gives a nested dict of arrays. They go into this run's
freshly initialised parameters by name:
  1. init_from_rename renames the source's subtrees: 'source/prefix:this/prefix,...' (the
     longest matching prefix wins; an empty right side leaves the subtree out);
  2. each Transformer stack of the source takes this model's layer layout: unrolled block_<i> or
     scanned 'blocks' (lm.layers.transformer.stack_layers / unstack_layers);
  3. a parameter both have is loaded (the shapes must be equal: else one UserError naming the fields
     in which the source run's config.json differs from this config, the data field that sizes that
     parameter first (data.context_length, data.vocab_size: shape_fields), or where none does the
     parameter and both shapes), one only this model has keeps its fresh initialisation (a new head),
     one only the source has is dropped.
The shapes are checked on the abstract trees, before anything is compiled or written; the arrays
are read in shards spread over this run's devices and placed in its shardings by one jitted copy.
Only a run that starts at step 0 does this (a resumed run continues its own checkpoint), and the
optimizer state always starts fresh.
"""

import collections
import contextlib
import dataclasses
import json
import math
import os
from typing import Protocol

import jax
import ml_collections
import orbax.checkpoint as ocp
from etils import epath
from flax import traverse_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lm.errors import UserError
from lm.layers.transformer import SCANNED_NAME, is_block_name, stack_layers, unstack_layers
from lm.runs import CONFIG_FILE, differing_fields, init_from_not_found, override_flags, saved_config, settings
from lm.train.checkpoint import FROZEN_DIR, frozen_checkpointer, merge_trees
from lm.train.setup import checkpoint_directory

Renames = list[tuple[str, str]]  # (source prefix, this model's prefix; "" leaves it out)


class ParamSource(Protocol):
    description: str  # where the parameters come from, for the log and the errors

    def abstract_params(self) -> dict:
        """The parameters' shapes and dtypes: a nested dict of jax.ShapeDtypeStruct."""

    def load_params(self, shardings: dict) -> dict:
        """The parameters (a nested dict like abstract_params) as arrays in the given shardings."""


class CheckpointSource:
    """The params of an lm run's checkpoint. location: the run's workdir (its latest checkpoint,
    wherever its train.checkpoint_dir put it), a checkpoint folder (its latest), or one step's
    folder in one; a local path or a URL Orbax reads (gs://...). Reads only: a run that is still
    writing checkpoints there is left alone. run_config: the run's config.json, where a local run
    folder holds one (lm.runs.saved_config), else None."""

    def __init__(self, location: str):
        # Orbax reads absolute paths only: a relative one is taken from the working directory.
        path = epath.Path(location if "://" in location else os.path.abspath(os.path.expanduser(location)))
        if not path.exists():
            raise init_from_not_found(location)
        self.run_config = saved_config(location)
        step = None
        if (path / CONFIG_FILE).exists():  # a workdir
            run_config = ml_collections.ConfigDict(json.loads((path / CONFIG_FILE).read_text()))
            path = epath.Path(checkpoint_directory(run_config, str(path)))
        elif path.name.isdigit() and (path / "state").exists():  # one step's folder
            path, step = path.parent, int(path.name)
        self.directory = path
        with contextlib.closing(self.manager()) as manager:
            self.step = manager.latest_step() if step is None else step
            if self.step is None:
                raise UserError(f"init_from={location}: no checkpoint in {path}")
            self.description = f"{path} step {self.step}"
            try:
                saved = manager.item_metadata(self.step)["state"]["params"]
            except Exception as e:  # noqa: BLE001 (Orbax raises many kinds for unreadable or foreign files)
                raise UserError(f"init_from={location}: the checkpoint {self.description} cannot be read as "
                                f"an lm train state ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from e
        self.abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), saved)
        self.frozen = {}  # the frozen parameters a LoRA run saved once beside its steps (lm/train/checkpoint.py)
        if (path / FROZEN_DIR).exists():
            frozen = frozen_checkpointer().metadata(path / FROZEN_DIR).item_metadata
            self.frozen = jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), dict(frozen))

    def manager(self) -> ocp.CheckpointManager:
        """A manager that reads the checkpoints (and never creates, cleans or deletes anything)."""
        return ocp.CheckpointManager(self.directory, item_handlers={"state": ocp.PyTreeCheckpointHandler()},
                                     options=ocp.CheckpointManagerOptions(create=False))

    def abstract_params(self) -> dict:
        return merge_trees(self.abstract, self.frozen)

    def load_params(self, shardings: dict) -> dict:
        def wanted(abstract):
            placed = traverse_util.flatten_dict(shardings)
            return traverse_util.unflatten_dict({name: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=placed[name])
                                                 for name, s in traverse_util.flatten_dict(abstract).items()})

        saved = {"params": wanted(self.abstract)}
        restore = ocp.args.PyTreeRestore(saved, restore_args=ocp.checkpoint_utils.construct_restore_args(saved),
                                         partial_restore=True)  # the params, not the optimizer state
        with contextlib.closing(self.manager()) as manager:
            params = manager.restore(self.step, args=ocp.args.Composite(state=restore))["state"]["params"]
        if not self.frozen:
            return params
        frozen = frozen_checkpointer().restore(self.directory / FROZEN_DIR,
                                               args=ocp.args.StandardRestore(wanted(self.frozen)))
        return merge_trees(params, frozen)



HF_PREFIX = "hf:"  # init_from=hf:DIR: a local Hugging Face model folder


def open_source(location: str, config: ml_collections.ConfigDict) -> ParamSource:
    """The ParamSource that init_from names: hf:DIR, a Hugging Face folder checked against this run's
    config (lm/hf/source.py; prints the fields they agree in); anything else, an lm run's checkpoint."""
    if location.startswith(HF_PREFIX):
        from lm.hf.source import HFSource

        source = HFSource(location.removeprefix(HF_PREFIX), config)
        print(source.agreement)
        return source
    return CheckpointSource(location)


def model_from_source(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """config, or with init_from_config=True a copy whose fields the config.json of init_from=hf:DIR implies
    (the model section, data.vocab_size) are set to its values, and data.context_length lowered to its
    positions where longer (lm/hf/source.py following); prints the fields that changed. Anything else in
    init_from with init_from_config=True is a UserError."""
    if not config.get("init_from_config"):
        return config
    if not config.init_from.startswith(HF_PREFIX):
        raise UserError(f"init_from_config=True takes the model from a Hugging Face folder's config.json: give "
                        f"init_from=hf:DIR (init_from={config.init_from!r})")
    from lm.hf.source import following

    filled = following(config.init_from.removeprefix(HF_PREFIX), config)
    before = traverse_util.flatten_dict(config.to_dict(), sep=".")
    after = traverse_util.flatten_dict(filled.to_dict(), sep=".")
    changed = [f"{key}={value} (was {before.get(key)})" for key, value in after.items() if before.get(key) != value]
    print(f"init_from_config: {config.init_from}'s config.json sets {', '.join(changed) or 'nothing new'}")
    return filled


def with_adapters(source: ParamSource, config: ml_collections.ConfigDict, abstract_params: dict) -> ParamSource:
    """source, with the LoRA adapters of the peft folder that init_from_adapters names (lm/hf/peft.py) added."""
    if not config.get("init_from_adapters"):
        return source
    from lm.hf.peft import PeftSource, WithAdapters

    return WithAdapters(source, PeftSource(config.init_from_adapters, config, abstract_params))


def parse_renames(text: str) -> Renames:
    """'encoder:bert/encoder,pooler:' -> [('encoder', 'bert/encoder'), ('pooler', '')]."""
    renames = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        source, colon, target = item.partition(":")
        if not colon or not source.strip("/"):
            raise UserError(f"init_from_rename={text!r}: write source_subtree:this_subtree pairs separated "
                            "by commas (an empty this_subtree leaves it out), e.g. 'encoder:bert/encoder,pooler:'")
        renames.append((source.strip("/"), target.strip("/")))
    return renames


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + "/")


def renamed(params: dict, renames: Renames) -> dict:
    """params (a nested dict) with each name under a renamed prefix moved (or left out)."""
    moved = {}
    for name, value in traverse_util.flatten_dict(params, sep="/").items():
        matching = [(source, target) for source, target in renames if under(name, source)]
        if matching:
            source, target = max(matching, key=lambda rename: len(rename[0]))
            if not target:
                continue
            name = target + name[len(source):]
        if name in moved:
            raise UserError(f"init_from_rename: two source parameters would both become {name}")
        moved[name] = value
    return traverse_util.unflatten_dict(moved, sep="/")


def in_layout_of(source: dict, target: dict, path: str = "") -> dict:
    """source (a nested dict) with every Transformer stack in the layer layout of target's stack at
    the same place: unrolled block_<i>, or scanned under SCANNED_NAME."""
    unrolled = any(map(is_block_name, source))
    if unrolled and SCANNED_NAME in target and not any(map(is_block_name, target)):
        period = len(target[SCANNED_NAME])
        layers = sum(map(is_block_name, source))
        try:
            source = stack_layers(source, period)
        except ValueError as e:  # a layer count the period does not divide, or layers of other structures
            raise UserError(f"init_from: the {layers} layers of the source's {path or 'model'} do not stack "
                            f"into this model's scanned groups of {period} blocks (model.moe.every): {e}") from e
    elif SCANNED_NAME in source and any(map(is_block_name, target)) and SCANNED_NAME not in target:
        source = unstack_layers(source)
    return {name: in_layout_of(value, target[name], f"{path}/{name}".lstrip("/"))
            if isinstance(value, dict) and isinstance(target.get(name), dict) else value
            for name, value in source.items()}


def as_target(source: dict, target: dict, renames: Renames) -> dict[str, object]:
    """The source's parameters under this model's names and layout, flat ('decoder/block_0/...')."""
    return traverse_util.flatten_dict(in_layout_of(renamed(source, renames), target), sep="/")


def subtree_counts(names: list[str], every_name: list[str]) -> str:
    """'decoder (25), token_embed (1)': names grouped into the largest subtrees of every_name that
    hold nothing but them, with how many names each holds."""
    chosen = set(names)
    totals, picked = collections.Counter(), collections.Counter()
    for name in every_name:
        parts = name.split("/")
        for depth in range(1, len(parts) + 1):
            totals["/".join(parts[:depth])] += 1
            picked["/".join(parts[:depth])] += name in chosen
    groups = collections.Counter()
    for name in names:
        parts = name.split("/")
        prefixes = ("/".join(parts[:depth]) for depth in range(1, len(parts) + 1))
        groups[next(p for p in prefixes if picked[p] == totals[p])] += 1
    return ", ".join(f"{prefix} ({count})" for prefix, count in groups.items())


def spread_shardings(abstract: dict, mesh: Mesh) -> dict:
    """A sharding per array that splits it over all of mesh's devices along its first axis their
    number divides (replicated when none does): how the source is read, so that no device holds it
    whole, before the jitted copy places it in this run's shardings."""
    flat_mesh = Mesh(mesh.devices.reshape(-1), ("devices",))

    def spread(leaf: jax.ShapeDtypeStruct) -> NamedSharding:
        axis = next((i for i, size in enumerate(leaf.shape) if size % flat_mesh.size == 0), None)
        spec = [None] * len(leaf.shape)
        if axis is not None:
            spec[axis] = "devices"
        return NamedSharding(flat_mesh, PartitionSpec(*spec))

    return jax.tree.map(spread, abstract)


@dataclasses.dataclass
class InitFrom:
    """A checked plan: which of this model's parameters come from source, which stay fresh."""

    source: ParamSource
    renames: Renames
    loaded: list[str]  # this model's names
    initialised: list[str]
    dropped: list[str]  # the source's, renamed and in this model's layout
    sizes: dict[str, int]  # parameters per name, of both

    def load(self, fresh_params: dict, shardings: dict, mesh: Mesh) -> dict:
        """fresh_params (this model's initialisation, donated) with the source's parameters loaded,
        in shardings; prints what was loaded, initialised and dropped."""
        source = self.source.load_params(spread_shardings(self.source.abstract_params(), mesh))

        def merge(fresh, source):
            incoming = as_target(source, fresh, self.renames)
            flat = traverse_util.flatten_dict(fresh, sep="/")
            merged = {name: incoming[name].astype(value.dtype) if name in incoming else value
                      for name, value in flat.items()}
            return traverse_util.unflatten_dict(merged, sep="/")

        params = jax.jit(merge, out_shardings=shardings, donate_argnums=0)(fresh_params, source)
        self.report()
        return params

    def report(self) -> None:
        every_target = self.loaded + self.initialised
        every_source = self.loaded + self.dropped
        print(f"init_from {self.source.description}:")
        for label, names, every in [("loaded", self.loaded, every_target),
                                    ("initialised", self.initialised, every_target),
                                    ("dropped", self.dropped, every_source)]:
            count = sum(self.sizes[name] for name in names)
            groups = subtree_counts(names, every)
            print(f"  {label:<11} {len(names):>4} arrays, {count:>11,} parameters{': ' + groups if groups else ''}")


def prepare(location: str, rename: str, abstract_params: dict, resumed_step: int | None,
            config: ml_collections.ConfigDict) -> InitFrom | None:
    """The checked InitFrom for init_from=location (with init_from_rename=rename) into
    a model of abstract_params, this run's config's; None without init_from, or when the run resumes from its own
    checkpoint at resumed_step (then init_from is ignored, which it says). A source parameter of another shape
    is a UserError naming the fields in which the source run's config.json differs from config that may explain
    it (shape_fields), with both values and the flags that match it; the parameter and both shapes where no
    field differs."""
    if not location:
        if config.get("init_from_adapters"):
            raise UserError(f"init_from_adapters={config.init_from_adapters} needs init_from: the base model the "
                            "adapters go onto (hf:DIR, or a run)")
        return None
    if resumed_step is not None:
        print(f"init_from ignored: resuming from this run's own checkpoint at step {resumed_step}")
        return None
    renames = parse_renames(rename)
    source = open_source(location, config)
    try:
        return plan(with_adapters(source, config, abstract_params), renames, abstract_params)
    except OtherShapes as e:
        saved = source.run_config if isinstance(source, CheckpointSource) else None
        fields = shape_fields(saved, config, e.parameter) if saved else []
        if not fields:
            raise
        raise UserError(f"init_from={location} holds a model with {settings(fields, saved=True)} (its "
                        f"{CONFIG_FILE}), this config has {settings(fields, saved=False)}: run with "
                        f"{override_flags(fields)}, or give init_from a run of this model") from e


class OtherShapes(UserError):
    """A source parameter of another shape than this model's (prepare names the config fields that
    explain it, where the source run's config.json has them). parameter: its name in this model."""

    def __init__(self, message: str, parameter: str):
        super().__init__(message)
        self.parameter = parameter


DATA_SHAPES = {"data.context_length": "position_embed", "data.vocab_size": "token_embed"}  # field: the table it sizes


def shape_fields(saved: dict, config: ml_collections.ConfigDict, parameter: str) -> list:
    """The fields in which the source run's config.json (saved) differs from config that may give this model's
    parameter another shape, the cause first: a data field sizing that table (DATA_SHAPES: data.context_length
    for the learned positions, data.vocab_size for the token table), then the model section's, its LoRA fields
    (model.lora.*) only for an adapter's parameter (a base model's parameters keep their shapes under LoRA)."""
    data = [field for field in differing_fields(saved, config, ("data",))
            if field[0] in DATA_SHAPES and parameter.startswith(DATA_SHAPES[field[0]])]
    model = [field for field in differing_fields(saved, config, ("model",))
             if not field[0].startswith("model.lora.") or "lora" in parameter]
    return data + model


def plan(source: ParamSource, renames: Renames, abstract_params: dict) -> InitFrom:
    """Which of abstract_params (this model's, a nested dict) come from source, after renames and
    the layout conversion; a rename that names nothing in the source is a UserError, a parameter of
    another shape there OtherShapes."""
    source_abstract = source.abstract_params()
    source_names = traverse_util.flatten_dict(source_abstract, sep="/")
    for prefix, _ in renames:
        if not any(under(name, prefix) for name in source_names):
            tops = sorted({name.split("/")[0] for name in source_names})
            raise UserError(f"init_from_rename: {prefix!r} names nothing in {source.description}, whose "
                            f"top-level subtrees are {', '.join(tops)}")
    incoming = jax.eval_shape(lambda s: as_target(s, abstract_params, renames), source_abstract)
    target = traverse_util.flatten_dict(abstract_params, sep="/")
    for name, leaf in target.items():
        if name in incoming and incoming[name].shape != leaf.shape:
            raise OtherShapes(
                f"init_from: {name} is {incoming[name].shape} in {source.description} but {leaf.shape} in "
                "this model; fix the config, or leave that source subtree out (this model's fresh initialisation "
                "is kept there) with --config.init_from_rename='SUBTREE:'", name
            )
    sizes = {name: math.prod(leaf.shape) for name, leaf in {**incoming, **target}.items()}
    return InitFrom(source, renames, loaded=[name for name in target if name in incoming],
                    initialised=[name for name in target if name not in incoming],
                    dropped=[name for name in incoming if name not in target], sizes=sizes)
