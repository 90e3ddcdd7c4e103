r"""Generate text from the latest checkpoint of a language-model run.

  lm sample --workdir=runs/baby --prompt="ROMEO:" --max_new_tokens=300 \
      --temperature=0.8 --top_k=40 [--top_p=0.95]
"""

import pathlib

from absl import app, flags, logging

from lm.cli import define_workdir, parse_flags, reject_arguments
from lm.cli.resolve import load_run
from lm.errors import UserError, run_user_errors

_WORKDIR = define_workdir("A run folder written by lm train.")
_PROMPT = flags.DEFINE_string("prompt", "\n", "Text to continue.")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 300, "How many tokens to generate.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "Softmax temperature; 0 is greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 40, "Sample from the k most likely tokens; 0 = all.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Sample from the most likely tokens whose probabilities add up to "
                                         "top_p (nucleus sampling, after top_k); 1 = all.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "How many independent samples.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")


def main(argv: list[str]) -> None:
    reject_arguments(argv)
    logging.set_verbosity(logging.WARNING)

    def sample():
        if not 0 < _TOP_P.value <= 1:
            raise UserError(f"--top_p={_TOP_P.value}: use a probability in (0, 1]")
        experiment, params = load_run(pathlib.Path(_WORKDIR.value), "sample")
        for i in range(_NUM_SAMPLES.value):
            text = experiment.sample(
                params, _PROMPT.value, _MAX_NEW_TOKENS.value, _TEMPERATURE.value, _TOP_K.value,
                seed=_SEED.value + i, top_p=_TOP_P.value,
            )
            print(text if i == 0 else f"---\n{text}")

    run_user_errors(sample)


def run() -> None:
    """The command: flags from sys.argv, then main."""
    app.run(main, flags_parser=parse_flags)
