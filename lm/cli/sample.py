r"""Generate text from the latest checkpoint of a language-model run, or from a Hugging Face folder.

  lm sample --workdir=runs/baby --prompt="ROMEO:" --max_new_tokens=300 \
      --temperature=0.8 --top_k=40 [--top_p=0.95]
  lm sample --hf=DIR --prompt="The meaning of life is" [--hf_tokenizer=tokenizer.json] ...
  lm sample --workdir=runs/sft --chat --prompt="What is 7 times 8?"   # a user's turn, the assistant's reply

--chat (a supervised fine-tuning run, configs/sft.py): the prompt is the user's message, rendered by the run's
chat template with the assistant's turn opened, as the run's own samples are.

--hf: a GPT2LMHeadModel or LlamaForCausalLM folder with its tokenizer.json (as lm eval --hf reads it); the prompt
is encoded as transformers encodes it (with the special tokens the tokenizer adds, e.g. Llama's BOS), and the
sample is decoded with them.
"""

import contextlib
import functools
import pathlib
import sys
from collections.abc import Callable

from absl import app, flags, logging

from lm.cli import define_string_once, define_workdir, parse_flags, reject_arguments
from lm.cli.resolve import load_hf, load_run
from lm.errors import UserError, run_user_errors

_WORKDIR = define_workdir("A run folder written by lm train.", required=False)
_HF = define_string_once("hf", "Instead of --workdir: a Hugging Face model folder (GPT-2, Llama) with its "
                               "tokenizer.json.")
_HF_TOKENIZER = define_string_once("hf_tokenizer", "With --hf: its tokenizer.json (default: DIR's).")
_PROMPT = flags.DEFINE_string("prompt", "\n", "Text to continue.")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 300, "How many tokens to generate.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "Softmax temperature; 0 is greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 40, "Sample from the k most likely tokens; 0 = all.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Sample from the most likely tokens whose probabilities add up to "
                                         "top_p (nucleus sampling, after top_k); 1 = all.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "How many independent samples.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_CHAT = flags.DEFINE_bool("chat", False, "Send the prompt as a user's message through the run's chat template (a "
                          "supervised fine-tuning run's data.chat_template), with the assistant's turn opened.")


def folder_sampler(directory: str, tokenizer_file: str | None = None) -> Callable[..., str]:
    """The model of a Hugging Face folder (lm/cli/resolve.py load_hf) as a function like a run's
    experiment.sample without its params: (prompt, max_new_tokens, temperature, top_k, seed, top_p) -> the
    prompt and its continuation, as text."""
    import jax
    import numpy as np

    from lm.decode.generate import generate

    with contextlib.redirect_stdout(sys.stderr):  # what was loaded: stdout is the samples alone
        experiment, params, tokenizer, _ = load_hf(directory, tokenizer_file)

    def sample(prompt: str, max_new_tokens: int, temperature: float, top_k: int, seed: int = 0,
               top_p: float = 1.0) -> str:
        ids = tokenizer.encode(prompt).ids
        if not ids:
            raise UserError(f"--prompt={prompt!r} encodes to no token ids: give text to continue")
        found = generate(experiment.model, params, np.asarray([ids], np.int32), max_new_tokens,
                         jax.random.key(seed), temperature, top_k, top_p)
        return tokenizer.decode([int(i) for i in found[0]], skip_special_tokens=False)

    return sample


def main(argv: list[str]) -> None:
    reject_arguments(argv)
    logging.set_verbosity(logging.WARNING)

    def sample():
        if not 0 < _TOP_P.value <= 1:
            raise UserError(f"--top_p={_TOP_P.value}: use a probability in (0, 1]")
        if (_WORKDIR.value is None) == (_HF.value is None):
            raise UserError("give one of --workdir=DIR (a run folder written by lm train) and --hf=DIR (a Hugging "
                            "Face folder)")
        prompt = _PROMPT.value
        if _HF.value is not None:
            if _CHAT.value:
                raise UserError("--chat takes a run's chat template (--workdir of a supervised fine-tuning run); "
                                "with --hf, write the template's text into --prompt")
            sampler = folder_sampler(_HF.value, _HF_TOKENIZER.value)
        else:
            experiment, params = load_run(pathlib.Path(_WORKDIR.value), "sample")
            sampler = functools.partial(experiment.sample, params)
            if _CHAT.value:
                prompt = experiment.chat_prompt(prompt)
        for i in range(_NUM_SAMPLES.value):
            text = sampler(prompt, _MAX_NEW_TOKENS.value, _TEMPERATURE.value, _TOP_K.value,
                           seed=_SEED.value + i, top_p=_TOP_P.value)
            print(text if i == 0 else f"---\n{text}")

    run_user_errors(sample)


def run() -> None:
    """The command: flags from sys.argv, then main."""
    app.run(main, flags_parser=parse_flags)
