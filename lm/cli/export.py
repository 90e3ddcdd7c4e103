"""Write a run's parameters and config as a Hugging Face model folder (config.json, model.safetensors)
that transformers' from_pretrained loads and that gives the run's logits (docs/huggingface.md).

  python -m lm.export --workdir=runs/gpt2_finetune --out=exported/gpt2_finetune [--dtype=bfloat16]

A language model exports as GPT2LMHeadModel or LlamaForCausalLM, a ViT as ViTForImageClassification,
a BERT pretraining run as BertForPreTraining with its WordPiece vocabulary (vocab.txt,
tokenizer_config.json), whichever holds its config (else one line says which fields stand in the way).
"""

import json
import pathlib

import jax
from absl import app, flags, logging
from jax.sharding import SingleDeviceSharding

from lm.cli import define_string_once, define_workdir, parse_flags, run_user_errors
from lm.errors import UserError
from lm.runs import CONFIG_FILE

_WORKDIR = define_workdir("A run folder written by lm.main.")
_OUT = define_string_once("out", "The folder to write the Hugging Face checkpoint to (required).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "The stored dtype of the parameters.")


def export_run(workdir: pathlib.Path, out: pathlib.Path, dtype: str) -> None:
    """The latest checkpoint of the run in workdir, written to out."""
    import ml_collections

    from experiments import language_model, masked_lm
    from lm.data.wordpiece import WordPieceTokenizer
    from lm.hf.export import export
    from lm.train.init_from import CheckpointSource

    config_path = workdir / CONFIG_FILE
    if not config_path.is_file():
        raise UserError(f"{config_path} not found: --workdir must be a folder written by lm.main")
    config = ml_collections.ConfigDict(json.loads(config_path.read_text()))
    source = CheckpointSource(str(workdir))
    on_host = SingleDeviceSharding(jax.devices("cpu")[0])
    params = source.load_params(jax.tree.map(lambda _: on_host, source.abstract_params()))
    vocab_size, tokenizer = None, None  # (images)
    if config.experiment == "language_model":
        vocab_size = language_model.vocab_size(config, workdir)
    elif config.experiment == "masked_lm":
        tokenizer = WordPieceTokenizer.load(workdir / masked_lm.TOKENIZER_DIR)
        vocab_size = tokenizer.vocab_size
    architecture, files = export(config, params, vocab_size, out, dtype, tokenizer=tokenizer)
    print(f"{source.description} -> {out}: {architecture} ({dtype}), {', '.join(files)}")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)

    def export_to_out():
        if not _OUT.value:
            raise UserError("--out is required: the folder to write the Hugging Face checkpoint to")
        export_run(pathlib.Path(_WORKDIR.value), pathlib.Path(_OUT.value), _DTYPE.value)

    run_user_errors(export_to_out)


def run() -> None:
    """The command: flags from sys.argv, then main (also what `python -m lm.export` runs)."""
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
