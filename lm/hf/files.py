"""A Hugging Face model folder on disk: config.json and the weights in safetensors, one file
(model.safetensors) or shards listed by model.safetensors.index.json. Read and written with the
safetensors library's numpy API (bfloat16 arrays are ml_dtypes.bfloat16); no torch. A language model's
byte-level BPE goes beside them as tokenizer.json and tokenizer_config.json (write_bpe_tokenizer)."""

import json
import math
import os
import pathlib

import jax
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from lm.data.bpe import END_OF_TEXT, BPETokenizer
from lm.errors import UserError

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SAFETENSORS_DTYPES = {"F32": np.float32, "BF16": jax.numpy.bfloat16, "F16": np.float16}


class Folder:
    """A local Hugging Face model folder: its config.json and which safetensors file holds each tensor."""

    def __init__(self, directory: str | pathlib.Path, location: str):
        """location: how the user named it (for the errors), e.g. 'init_from=hf:DIR'."""
        self.directory = pathlib.Path(directory).expanduser()
        config_path = self.directory / CONFIG_FILE
        if not config_path.is_file():
            raise UserError(f"{location}: {config_path} not found; give a local Hugging Face model folder (e.g. "
                            "from `huggingface-cli download gpt2 --local-dir DIR`)")
        self.config = json.loads(config_path.read_text())
        if (self.directory / INDEX_FILE).is_file():
            weight_map = json.loads((self.directory / INDEX_FILE).read_text())["weight_map"]
            self.files = {name: self.directory / file for name, file in weight_map.items()}
        elif (self.directory / WEIGHTS_FILE).is_file():
            with safe_open(self.directory / WEIGHTS_FILE, "numpy") as f:
                self.files = dict.fromkeys(f.keys(), self.directory / WEIGHTS_FILE)
        else:
            raise UserError(f"{location}: {self.directory} has neither {WEIGHTS_FILE} nor {INDEX_FILE}; only "
                            "safetensors weights are read (save them with save_pretrained(safe_serialization=True))")

    def abstract(self) -> dict[str, jax.ShapeDtypeStruct]:
        """Every tensor's shape and dtype, without reading the arrays."""
        shapes = {}
        for file in sorted(set(self.files.values())):
            with safe_open(file, "numpy") as f:
                for name in f.keys():
                    piece = f.get_slice(name)
                    dtype = SAFETENSORS_DTYPES.get(piece.get_dtype())
                    if dtype is None:
                        raise UserError(f"{file}: tensor {name} is {piece.get_dtype()}; lm reads F32, BF16 and F16")
                    shapes[name] = jax.ShapeDtypeStruct(tuple(piece.get_shape()), dtype)
        return shapes

    def read(self, names) -> dict[str, np.ndarray]:
        """The named tensors as numpy arrays, each file opened once."""
        by_file: dict[pathlib.Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self.files[name], []).append(name)
        arrays = {}
        for file, file_names in by_file.items():
            with safe_open(file, "numpy") as f:
                arrays.update({name: f.get_tensor(name) for name in file_names})
        return arrays


def save_safetensors(tensors: dict[str, np.ndarray], path: pathlib.Path) -> None:
    """tensors as the safetensors file path (with the metadata transformers expects), readable as any file this
    process writes is (mode 0666 less the umask: the library itself leaves its temporary file's 0600)."""
    save_file(tensors, path, metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def write_folder(directory: pathlib.Path, config: dict, tensors: dict[str, np.ndarray],
                 max_shard_bytes: int = 5 * 2**30) -> list[str]:
    """Writes config.json and the tensors: one model.safetensors, or shards of at most max_shard_bytes
    (a tensor larger than that gets a shard of its own) with model.safetensors.index.json, as
    save_pretrained names them. Returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, array in tensors.items():
        if shards[-1] and size + array.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = np.ascontiguousarray(array)
        size += array.nbytes
    if len(shards) == 1:
        save_safetensors(shards[0], directory / WEIGHTS_FILE)
        return [CONFIG_FILE, WEIGHTS_FILE]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, shard in zip(names, shards, strict=True):
        save_safetensors(shard, directory / name)
    total = sum(math.prod(a.shape) * a.dtype.itemsize for a in tensors.values())
    index = {"metadata": {"total_size": total},
             "weight_map": {tensor: name for name, shard in zip(names, shards, strict=True) for tensor in shard}}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return [CONFIG_FILE, *names, INDEX_FILE]


def write_bpe_tokenizer(directory: pathlib.Path, tokenizer: BPETokenizer, max_length: int,
                        chat_template: str | None = None) -> list[str]:
    """Writes a byte-level BPE as transformers' GPT2TokenizerFast reads it: tokenizer.json (the whole pipeline)
    and tokenizer_config.json (its class; <|endoftext|> as its BOS, EOS and unknown token, as GPT-2's, where the
    vocabulary has it; model_max_length: max_length, the model's context; chat_template, given one). Returns
    the files written."""
    tokenizer.save(directory / TOKENIZER_FILE)
    special = END_OF_TEXT if tokenizer.end_of_text_id is not None else None
    settings = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": max_length, "add_prefix_space": False,
                "bos_token": special, "eos_token": special, "unk_token": special}
    if chat_template is not None:
        settings["chat_template"] = chat_template
    (directory / TOKENIZER_CONFIG).write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
    return [TOKENIZER_FILE, TOKENIZER_CONFIG]
