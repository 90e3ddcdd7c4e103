"""Write a run's parameters and config as a Hugging Face model folder.

The folder (config.json, model.safetensors) is one that transformers' from_pretrained loads and that
gives the run's logits (docs/huggingface.md).

  lm export --workdir=runs/gpt2_finetune --out=exported/gpt2_finetune [--dtype=bfloat16]
  lm export --workdir=runs/gpt2_lora --out=exported/gpt2_lora --merge_lora   # LoRA merged into the weights
  lm export --workdir=runs/gpt2_lora --out=exported/gpt2_lora_peft --adapters  # a peft folder (docs/post-training.md)

A language model exports as GPT2LMHeadModel or LlamaForCausalLM (with its byte-level BPE, if it has one, as
tokenizer.json and tokenizer_config.json: a folder transformers and `lm eval --hf` read whole), a ViT as
ViTForImageClassification, a BERT pretraining run as BertForPreTraining with its WordPiece vocabulary (vocab.txt,
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
_MERGE_LORA = flags.DEFINE_bool("merge_lora", False, "A LoRA run: a plain Hugging Face folder, its adapters merged "
                                                     "into the weights (W + alpha / rank B A).")
_ADAPTERS = flags.DEFINE_bool("adapters", False, "A LoRA run: its adapters alone, as a peft folder "
                                                 "(adapter_config.json, adapter_model.safetensors).")


def check_lora_flags(has_adapters: bool, merge_lora: bool, adapters: bool) -> None:
    """A run with LoRA adapters exports with one of --merge_lora and --adapters; a run without, with neither."""
    if merge_lora and adapters:
        raise UserError("--merge_lora and --adapters write different folders: pass one of them")
    if has_adapters and not (merge_lora or adapters):
        raise UserError("this run has LoRA adapters (model.lora): pass --merge_lora for a plain Hugging Face folder "
                        "with them merged into the weights, or --adapters for a peft folder of the adapters alone")
    if not has_adapters and (merge_lora or adapters):
        raise UserError(f"--{'merge_lora' if merge_lora else 'adapters'}: this run has no LoRA adapters "
                        "(model.lora.rank=0)")


def export_run(workdir: pathlib.Path, out: pathlib.Path, dtype: str, merge_lora: bool = False,
               adapters: bool = False) -> None:
    """The latest checkpoint of the run in workdir, written to out: a Hugging Face folder (a LoRA run's with
    merge_lora), or with adapters a LoRA run's adapters as a peft folder."""
    from lm.cli.resolve import find_experiment, load_config
    from lm.hf.export import DTYPES, export
    from lm.hf.peft import lora_options, peft_adapters, write_adapters
    from lm.layers.lora import has_adapters, merged
    from lm.train.init_from import HF_PREFIX, CheckpointSource

    config = load_config(workdir)
    experiment = find_experiment(config.experiment).from_workdir(config, workdir)
    vocab_size, tokenizer = experiment.export_vocabulary()
    chat_template = getattr(experiment, "chat_template", None)  # a supervised fine-tuning run's
    source = CheckpointSource(str(workdir))
    on_host = SingleDeviceSharding(jax.devices("cpu")[0])
    params = source.load_params(jax.tree.map(lambda _: on_host, source.abstract_params()))
    check_lora_flags(has_adapters(params), merge_lora, adapters)
    if adapters:
        base = config.init_from.removeprefix(HF_PREFIX) if config.init_from.startswith(HF_PREFIX) else None
        adapter_config, tensors = peft_adapters(config, params, base, vocab_size)
        files = write_adapters(out, adapter_config, {name: value.astype(DTYPES[dtype]) for name, value in
                                                     tensors.items()})
        print(f"{source.description} -> {out}: peft LoRA adapters, r={adapter_config['r']} on "
              f"{', '.join(adapter_config['target_modules'])} ({dtype}), {', '.join(files)}")
        if base is None:
            what = f"the run {config.init_from}" if config.init_from else "its own initial weights"
            print(f"note: the folder names no base model (base_model_name_or_path null): this run's base is {what}, "
                  "not a Hugging Face folder")
        return
    if merge_lora:
        params = merged(params, lora_options(config).scale)
    architecture, files = export(config, params, vocab_size, out, dtype, tokenizer=tokenizer,
                                 chat_template=chat_template.source if chat_template else None)
    print(f"{source.description} -> {out}: {architecture} ({dtype}){' with LoRA merged' if merge_lora else ''}, "
          f"{', '.join(files)}")


def main(argv: list[str]) -> None:
    reject_arguments(argv)
    logging.set_verbosity(logging.WARNING)

    def export_to_out():
        if not _OUT.value:
            raise UserError("--out is required: the folder to write the Hugging Face checkpoint to")
        export_run(pathlib.Path(_WORKDIR.value), pathlib.Path(_OUT.value), _DTYPE.value, _MERGE_LORA.value,
                   _ADAPTERS.value)

    run_user_errors(export_to_out)


def run() -> None:
    """The command: flags from sys.argv, then main."""
    app.run(main, flags_parser=parse_flags)
