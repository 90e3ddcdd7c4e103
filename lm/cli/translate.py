r"""Translate sentences with the latest checkpoint of a translation run (one translation per line).

  lm translate --workdir=runs/mt "Zwei Hunde spielen im Schnee." "Ein Mann fährt Rad." \
      --beam_size=4 --length_penalty=0.6
  lm translate --workdir=runs/mt "Zwei Hunde spielen im Schnee." --attention_png=attention.png

--attention_png (with exactly one sentence) also saves a heat map of the translation's attention to the
source: x = source pieces and <eos>, y = output pieces, colour = weight (every row sums to 1). An RNN with
attention gives one panel, the Transformer one per decoder layer (cross-attention, mean over heads).
Only the run folder is read (config, tokenizers, checkpoint): no data is needed.
"""

import pathlib
import sys

from absl import app, flags, logging

from lm.cli import define_workdir, parse_flags
from lm.cli.resolve import load_run
from lm.errors import UserError, run_user_errors

_WORKDIR = define_workdir("A translation run folder written by lm train.")
_BEAM_SIZE = flags.DEFINE_integer("beam_size", 4, "Beams per sentence; 1 is greedy.")
_LENGTH_PENALTY = flags.DEFINE_float("length_penalty", 0.6, "GNMT length penalty alpha for beam search.")
_ATTENTION_PNG = flags.DEFINE_string("attention_png", None,
                                     "Save the attention heat map of the (single) translation to this PNG file.")


def check_arguments(sentences: list[str], beam_size: int, length_penalty: float, attention_png: str | None) -> None:
    """UserError for what can be refused before the run is loaded."""
    if not sentences:
        raise UserError('give the sentences to translate: lm translate --workdir=DIR "Ein Satz." ...')
    if beam_size < 1:
        raise UserError(f"--beam_size={beam_size}: must be >= 1")
    if length_penalty < 0:
        raise UserError(f"--length_penalty={length_penalty}: must be >= 0")
    if attention_png is not None:
        if len(sentences) != 1:
            raise UserError(f"--attention_png plots one translation: give exactly one sentence, not {len(sentences)}")
        if not pathlib.Path(attention_png).parent.is_dir():
            raise UserError(f"--attention_png={attention_png}: folder {pathlib.Path(attention_png).parent} not found")


def translate(workdir: pathlib.Path, sentences: list[str], beam_size: int, length_penalty: float,
              attention_png: str | None) -> None:
    """Prints the translation of each sentence, one per line; optionally writes the attention heat map (and says
where, on stderr)."""
    check_arguments(sentences, beam_size, length_penalty, attention_png)
    experiment, params = load_run(workdir, "translate")
    maps = None
    if attention_png is not None:  # first, so that a model without attention fails before any output
        maps = experiment.attention_maps(params, sentences[0], beam_size, length_penalty)
    for line in experiment.translate(params, sentences, beam_size, length_penalty):
        print(line, flush=True)
    if maps is not None:
        from lm.plots import save_attention_heatmap

        try:
            save_attention_heatmap(attention_png, *maps)
        except OSError as e:
            raise UserError(f"--attention_png={attention_png}: {e}") from e
        print(f"done: the attention map in {attention_png}", file=sys.stderr)  # (stdout: the translations alone)


def main(argv: list[str]) -> None:
    logging.set_verbosity(logging.WARNING)
    run_user_errors(lambda: translate(pathlib.Path(_WORKDIR.value), argv[1:], _BEAM_SIZE.value,
                                      _LENGTH_PENALTY.value, _ATTENTION_PNG.value))


def run() -> None:
    """The command: flags from sys.argv, then main."""
    app.run(main, flags_parser=parse_flags)
