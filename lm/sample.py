"""Generate text from the latest checkpoint of a language-model run.

  python -m lm.sample --workdir=runs/baby --prompt="ROMEO:" --max_new_tokens=300 \
      --temperature=0.8 --top_k=40
"""

import json
import pathlib

import ml_collections
from absl import app, flags, logging

from lm.cli import parse_flags, run_user_errors
from lm.errors import UserError

_WORKDIR = flags.DEFINE_string("workdir", None, "A run folder written by lm.main.")
_PROMPT = flags.DEFINE_string("prompt", "\n", "Text to continue.")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 300, "How many tokens to generate.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "Softmax temperature; 0 is greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 40, "Sample from the k most likely tokens; 0 = all.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "How many independent samples.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
flags.mark_flag_as_required("workdir")


def load_run(workdir: pathlib.Path):
    """(experiment, params) from a run folder: its saved config, assets and latest checkpoint."""
    from experiments.language_model import from_workdir
    from lm.train.loop import CONFIG_FILE, restore_params

    config_path = workdir / CONFIG_FILE
    if not config_path.is_file():
        raise UserError(f"{config_path} not found: --workdir must be a folder written by lm.main")
    config = ml_collections.ConfigDict(json.loads(config_path.read_text()))
    if config.experiment != "language_model":
        raise UserError(f"{workdir} holds a {config.experiment!r} run, not a language model")
    experiment = from_workdir(config, workdir)
    return experiment, restore_params(config, experiment, workdir)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)

    def sample():
        experiment, params = load_run(pathlib.Path(_WORKDIR.value))
        try:
            experiment.tokenizer.encode(_PROMPT.value)
        except ValueError as e:
            raise UserError(f"--prompt: {e}") from e
        for i in range(_NUM_SAMPLES.value):
            text = experiment.sample(
                params, _PROMPT.value, _MAX_NEW_TOKENS.value, _TEMPERATURE.value, _TOP_K.value,
                seed=_SEED.value + i,
            )
            print(text if i == 0 else f"---\n{text}")

    run_user_errors(sample)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
