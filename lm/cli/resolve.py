"""From a config's `experiment` to its module: the one place that imports experiments.

config.experiment is a built-in's short name (BUILT_IN: experiments/<name>.py) or the dotted path of
any importable module, e.g. `mypkg.tasks.toy` from the user's own package (installed, on PYTHONPATH,
or under the folder the command runs in). The module defines build(config, workdir) and
from_workdir(config, workdir) (lm/train/experiment.py); the commands hand its build to the trainer.
"""

import importlib
import pathlib
from types import ModuleType
from typing import TYPE_CHECKING

import ml_collections

from lm.errors import UserError
from lm.runs import CONFIG_FILE, CONFIG_REMEDY, read_json

if TYPE_CHECKING:  # (the commands import this module before jax, so that --help is quick)
    from lm.train.experiment import Experiment

BUILT_IN = ("language_model", "translation", "image_classification", "masked_lm", "finetune", "sft", "dpo",
            "grpo")
MODULE_FUNCTIONS = ("build", "from_workdir")


def module_path(name: str) -> str:
    """The module config.experiment=name names: experiments.<name> for a built-in, else name itself."""
    return f"experiments.{name}" if name in BUILT_IN else name


def find_experiment(name: str) -> ModuleType:
    """The experiment module config.experiment=name names, imported; a UserError when there is none
    or it lacks build / from_workdir."""
    path = module_path(name)
    try:
        module = importlib.import_module(path)
    except ModuleNotFoundError as e:
        if e.name is None or not (path == e.name or path.startswith(e.name + ".")):
            raise  # the module exists but one of its own imports is missing: the traceback says which
        raise UserError(f"experiment={name!r}: no module {path!r} can be imported; use a built-in "
                        f"({', '.join(BUILT_IN)}) or the dotted path of your own module (install its package, "
                        "or put its folder on PYTHONPATH)") from e
    except ValueError as e:  # an empty name
        raise UserError(f"experiment={name!r} is not a module path: use a built-in ({', '.join(BUILT_IN)}) or "
                        "a dotted path such as mypkg.tasks.toy") from e
    missing = [f for f in MODULE_FUNCTIONS if not callable(getattr(module, f, None))]
    if missing:
        raise UserError(f"experiment={name!r}: {module.__file__} defines no {' and no '.join(missing)}; an "
                        "experiment module defines build(config, workdir) and from_workdir(config, workdir)")
    return module


def build_experiment(config: ml_collections.ConfigDict, workdir: pathlib.Path | None = None) -> "Experiment":
    """The experiment of config.experiment, built from config for a run in workdir (None: outside a run)."""
    return find_experiment(config.experiment).build(config, workdir)


def load_run(workdir: pathlib.Path, needs: str):
    """(experiment, params) of the run in workdir (written by `lm train`): its saved config, the assets
    its experiment's from_workdir reads (tokenizers), the latest checkpoint's params on one device.
    needs: the experiment method the command calls (`sample`, `translate`); a run whose experiment
    has none is a UserError."""
    from lm.train.setup import restore_params

    config = load_config(workdir)
    experiment = find_experiment(config.experiment).from_workdir(config, workdir)
    if not callable(getattr(experiment, needs, None)):
        raise UserError(f"{workdir} holds a {config.experiment!r} run, whose experiment has no {needs}()")
    return experiment, restore_params(config, experiment, workdir)


def load_hf(directory: str, tokenizer_file: str | None = None):
    """(experiment, params, tokenizer, prefix token id) of a Hugging Face folder (GPT-2, Llama): the language
    model its config.json implies (float32: lm/eval/models.py hf_config), the folder's weights on one device, its
    tokenizer.json (or tokenizer_file; a tokenizers.Tokenizer) and the prefix token the harness uses (BOS, else
    EOS); prints what it loaded (models.hf_summary). A folder without a tokenizer is a UserError before the weights
    are read."""
    from configs.base import language_model
    from lm.eval import models

    config = models.hf_config(directory, language_model("token_file"))
    tokenizer, prefix = models.hf_tokenizer(directory, tokenizer_file)
    experiment = find_experiment(config.experiment).from_workdir(config, None)
    params = models.hf_params(directory, config, experiment.init)
    print(models.hf_summary(directory, config, params))
    return experiment, params, tokenizer, prefix


def load_config(workdir: pathlib.Path) -> ml_collections.ConfigDict:
    """The resolved config a run saved in workdir; a UserError when workdir is not a run folder."""
    config_path = workdir / CONFIG_FILE
    if not config_path.is_file():
        raise UserError(f"{config_path} not found: --workdir must be a folder written by lm train")
    return ml_collections.ConfigDict(read_json(config_path, CONFIG_REMEDY))
