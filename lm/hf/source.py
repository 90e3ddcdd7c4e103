"""init_from=hf:DIR: a local Hugging Face model folder as a ParamSource (lm/train/init_from.py).

The folder's architecture (config.json's `architectures`) picks the module in lm/hf; the run's config
must agree with every field that module's lm_fields reads off config.json and stay within its lm_limits
(GPT-2's n_positions bounds data.context_length), else one UserError listing every difference and the
flags that fix them; the tensors are mapped by its rules into lm's names, in the unrolled layer layout
(init_from converts to a scanned stack), bf16 or fp32 as stored (init_from casts to the run's parameter dtype).
"""

from types import ModuleType

import jax
import ml_collections
from flax import traverse_util

from lm.errors import UserError
from lm.hf import ARCHITECTURES, LANGUAGE_MODELS
from lm.hf.files import Folder
from lm.hf.mapping import Fields, Limits, Rule, apply, differences, excesses, overrides
from lm.layers.options import declared_copy


def read_folder(directory: str, location: str) -> tuple[Folder, str, ModuleType, Fields, Limits]:
    """(the folder, its architecture, the lm/hf module for it, the lm fields its config.json implies and
    those it bounds (a module without lm_limits bounds none)); an architecture lm does not read, or a
    config.json field it cannot represent, is a UserError."""
    folder = Folder(directory, location)
    named = folder.config.get("architectures") or []
    known = [name for name in named if name in ARCHITECTURES]
    if not known:
        raise UserError(f"{location}: config.json's architectures are {named}; lm reads {', '.join(ARCHITECTURES)}")
    module = ARCHITECTURES[known[0]]
    limits = module.lm_limits(folder.config) if hasattr(module, "lm_limits") else {}
    try:
        return folder, known[0], module, module.lm_fields(folder.config), limits
    except UserError as e:
        raise UserError(f"{location}: {e}") from None


def following(directory: str, config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A copy of config with every field the folder's config.json implies set to that value (where config
    has the field), and every field over its limit lowered to it: a run config that init_from=hf:directory
    accepts."""
    _, _, _, fields, limits = read_folder(directory, f"hf:{directory}")
    config = declared_copy(config)  # (its ranges and choices still checked)
    over = {key: (limit, source) for key, _, limit, source in excesses(limits, config)}
    for key, (value, _) in {**fields, **over}.items():
        *path, name = key.split(".")
        section = config
        for part in path:
            section = section[part]
        if name in section or key == "model.mlp_hidden_dim":
            section[name] = value
    return config


def experiments_of(module: ModuleType) -> tuple[str, ...]:
    """The experiments whose model an architecture's folder holds: a causal language model's (module.EXPERIMENT
    language_model) starts any of LANGUAGE_MODELS (pretraining, supervised fine-tuning, DPO: all lm's GPT), any
    other architecture its module's EXPERIMENT alone."""
    return LANGUAGE_MODELS if module.EXPERIMENT in LANGUAGE_MODELS else (module.EXPERIMENT,)


def describe(found, over, architecture: str) -> str:
    """'model.embed_dim=64 (config.json n_embd=32), data.context_length=64 (at most config.json n_positions=32)':
    the fields that differ (found, from differences), then those over their limits (over, from excesses)."""
    differ = [f"{key}={actual} (config.json {source}={wanted})" if source else
              f"{key}={actual} ({architecture}: {wanted})" for key, actual, wanted, source in found]
    return ", ".join(differ + [f"{key}={actual} (at most config.json {source}={limit})"
                               for key, actual, limit, source in over])


class HFSource:
    """The parameters of the Hugging Face folder `directory`, for a run of `config` (checked against it)."""

    def __init__(self, directory: str, config: ml_collections.ConfigDict):
        location = f"init_from=hf:{directory}"
        self.folder, self.architecture, module, fields, limits = read_folder(directory, location)
        hf = self.folder.config
        accepted = experiments_of(module)
        if config.experiment not in accepted:
            raise UserError(f"{location} is a {self.architecture}, for an experiment={' or '.join(accepted)} run; "
                            f"this run's experiment is {config.experiment}")
        found, over = differences(fields, config), excesses(limits, config)
        if found or over:
            raise UserError(f"{location}: this run's config differs from config.json: "
                            f"{describe(found, over, self.architecture)}; run with {overrides(found + over)}, or "
                            "with --config.init_from_config=True to take them from config.json")
        try:
            self.rules: list[Rule] = module.rules(hf, self.architecture, config)
        except UserError as e:
            raise UserError(f"{location}: {e}") from None
        self.file_names = self.names_in_rules(module, location)
        # what a run starting from the folder prints (lm/train/init_from.py open_source)
        self.agreement = (f"{location}: a {self.architecture}; this run's config agrees with its config.json in "
                          + " ".join(f"{key}={value}" for key, (value, _) in fields.items()))
        self.description = f"hf:{directory} ({self.architecture})"

    def names_in_rules(self, module, location: str) -> dict[str, str]:
        """{the rules' name: the file's name} for every tensor of the folder: a checkpoint of the bare
        base model has its names without module.PREFIX. A tensor no rule reads (other than the
        module's IGNORED buffers), or one a rule needs but the folder lacks, is a UserError."""
        stored = list(self.folder.files)
        prefix = "" if any(name.startswith(module.PREFIX) for name in stored) else module.PREFIX
        names = {prefix + name: name for name in stored}
        names = {name: file_name for name, file_name in names.items()
                 if not any(part in name for part in module.IGNORED)}
        wanted = {name for rule in self.rules for name in rule.hf}
        for label, extra in (("has tensors lm does not read", sorted(set(names) - wanted)),
                             ("lacks tensors lm needs", sorted(wanted - set(names)))):
            if extra:
                raise UserError(f"{location}: the folder {label} for a {self.architecture} of this config: "
                                f"{', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''} ({len(extra)} in all)")
        return names

    def abstract_params(self) -> dict:
        stored = self.folder.abstract()
        shapes = {name: stored[file_name] for name, file_name in self.file_names.items()}
        return traverse_util.unflatten_dict(jax.eval_shape(lambda t: apply(self.rules, t, "to_lm"), shapes), sep="/")

    def load_params(self, shardings: dict) -> dict:
        """Read, mapped on the host's CPU device (no accelerator holds the whole model), then placed."""
        stored = self.folder.read(self.file_names.values())
        arrays = {name: stored[file_name] for name, file_name in self.file_names.items()}
        with jax.default_device(jax.devices("cpu")[0]):
            params = apply(self.rules, arrays, "to_lm")
        placements = traverse_util.flatten_dict(shardings, sep="/")
        return traverse_util.unflatten_dict({name: jax.device_put(value, placements[name])
                                             for name, value in params.items()}, sep="/")
