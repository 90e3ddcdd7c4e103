"""Write a run's parameters and config as a Hugging Face model folder.

The folder (config.json, model.safetensors) is one that transformers' from_pretrained loads and that
gives the run's logits (docs/huggingface.md).

  lm export --workdir=runs/gpt2_finetune --out=exported/gpt2_finetune [--dtype=bfloat16]

A language model exports as GPT2LMHeadModel or LlamaForCausalLM, a ViT as ViTForImageClassification,
a BERT pretraining run as BertForPreTraining with its WordPiece vocabulary (vocab.txt,
tokenizer_config.json), whichever holds its config (else one line says which fields stand in the way).
"""

import pathlib

import jax
from absl import app, flags, logging
from jax.sharding import SingleDeviceSharding

from lm.cli import define_string_once, define_workdir, parse_flags, reject_arguments
from lm.errors import UserError, run_user_errors

_WORKDIR = define_workdir("A run folder written by lm train.")
_OUT = define_string_once("out", "The folder to write the Hugging Face checkpoint to (required).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "The stored dtype of the parameters.")


def export_run(workdir: pathlib.Path, out: pathlib.Path, dtype: str) -> None:
    """The latest checkpoint of the run in workdir, written to out."""
    from lm.cli.resolve import find_experiment, load_config
    from lm.hf.export import export
    from lm.train.init_from import CheckpointSource

    config = load_config(workdir)
    vocab_size, tokenizer = find_experiment(config.experiment).from_workdir(config, workdir).export_vocabulary()
    source = CheckpointSource(str(workdir))
    on_host = SingleDeviceSharding(jax.devices("cpu")[0])
    params = source.load_params(jax.tree.map(lambda _: on_host, source.abstract_params()))
    architecture, files = export(config, params, vocab_size, out, dtype, tokenizer=tokenizer)
    print(f"{source.description} -> {out}: {architecture} ({dtype}), {', '.join(files)}")


def main(argv: list[str]) -> None:
    reject_arguments(argv)
    logging.set_verbosity(logging.WARNING)

    def export_to_out():
        if not _OUT.value:
            raise UserError("--out is required: the folder to write the Hugging Face checkpoint to")
        export_run(pathlib.Path(_WORKDIR.value), pathlib.Path(_OUT.value), _DTYPE.value)

    run_user_errors(export_to_out)


def run() -> None:
    """The command: flags from sys.argv, then main."""
    app.run(main, flags_parser=parse_flags)
