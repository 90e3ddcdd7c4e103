"""A run's parameters and config as a Hugging Face model folder that transformers' from_pretrained
loads (lm export). The architecture is the first of the run's experiment's candidates
(EXPORTS) whose lm_fields, read back off the config.json written for the run, all hold in the run's
config: so a run exports exactly when importing the result would give it back. Parameters are written
from the unrolled layer layout (a scanned run is unstacked), the vocabulary's padding rows cut off; a
WordPiece tokenizer (a masked_lm run's) is written beside them by the architecture's save_tokenizer, a
byte-level BPE (a language model's) as tokenizer.json and tokenizer_config.json (lm/hf/files.py).
"""

import pathlib
from types import ModuleType

import jax
import ml_collections
import numpy as np
from flax import traverse_util

from lm.data.bpe import BPETokenizer
from lm.data.wordpiece import WordPieceTokenizer
from lm.errors import UserError
from lm.hf import ARCHITECTURES, EXPORTS
from lm.hf.files import write_bpe_tokenizer, write_folder
from lm.hf.mapping import apply, differences
from lm.layers.transformer import SCANNED_NAME, unstack_layers

DTYPES = {"float32": np.float32, "bfloat16": jax.numpy.bfloat16}


def unrolled(params: dict) -> dict:
    """params with every scanned Transformer stack unstacked into block_<i>."""
    if SCANNED_NAME in params:
        params = unstack_layers(params)
    return {name: unrolled(value) if isinstance(value, dict) else value for name, value in params.items()}


def hf_architecture(config: ml_collections.ConfigDict, vocab_size: int | None) -> tuple[ModuleType, dict]:
    """(the lm/hf module, the config.json) of the first of the run's candidates (EXPORTS) that holds its model;
    vocab_size: a language model's vocabulary (None for images). A model no Hugging Face architecture holds is
    a UserError naming, per candidate, the fields that differ."""
    candidates = EXPORTS.get(config.experiment)
    if candidates is None:
        raise UserError(f"experiment={config.experiment} runs have no Hugging Face export; lm exports "
                        f"{', '.join(EXPORTS)} runs")
    reasons = []
    for module in candidates:
        hf = module.hf_config(config, vocab_size)
        found = differences(module.lm_fields(hf), config)
        if not found:
            return module, hf
        needs = ", ".join(f"{key}={wanted} (this run: {actual})" for key, actual, wanted, _ in found)
        reasons.append(f"{hf['architectures'][0]} needs {needs}")
    raise UserError(f"no Hugging Face architecture holds this run's model: {'; '.join(reasons)}")


def hf_checkpoint(config: ml_collections.ConfigDict, params: dict, vocab_size: int | None) -> tuple[dict, dict]:
    """(config.json, {tensor name: array}) of the run's model (hf_architecture's)."""
    module, hf = hf_architecture(config, vocab_size)
    flat = traverse_util.flatten_dict(unrolled(params), sep="/")
    with jax.default_device(jax.devices("cpu")[0]):
        tensors = apply(module.rules(hf, hf["architectures"][0], config), flat, "to_hf")
    return hf, {name: np.asarray(value) for name, value in tensors.items()}


def export(config: ml_collections.ConfigDict, params: dict, vocab_size: int | None, out: pathlib.Path,
           dtype: str = "float32", max_shard_bytes: int = 5 * 2**30,
           tokenizer: WordPieceTokenizer | BPETokenizer | None = None,
           chat_template: str | None = None) -> tuple[str, list[str]]:
    """Writes the folder (and the tokenizer, given one, with the Jinja chat_template of a supervised fine-tuning
    run in its tokenizer_config.json, where transformers' apply_chat_template finds it; a byte-level BPE's
    <|endoftext|> is config.json's bos_token_id and eos_token_id, as GPT-2's); returns (architecture, the files
    written)."""
    if dtype not in DTYPES:
        raise UserError(f"--dtype={dtype}: use one of {', '.join(DTYPES)}")
    hf, tensors = hf_checkpoint(config, params, vocab_size)
    hf["dtype"] = dtype
    if isinstance(tokenizer, BPETokenizer) and tokenizer.end_of_text_id is not None:
        hf["bos_token_id"] = hf["eos_token_id"] = tokenizer.end_of_text_id
    tensors = {name: value.astype(DTYPES[dtype]) for name, value in tensors.items()}
    architecture = hf["architectures"][0]
    files = write_folder(out, hf, tensors, max_shard_bytes)
    if isinstance(tokenizer, BPETokenizer):
        files += write_bpe_tokenizer(out, tokenizer, config.data.context_length, chat_template)
    elif tokenizer is not None:
        files += ARCHITECTURES[architecture].save_tokenizer(tokenizer, config, out)
    return architecture, files
