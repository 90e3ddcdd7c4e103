"""What the tasks score: a GPT (lm/models/gpt.py) with its params and tokenizer, as a Scorer (lm/eval/scoring.py).

  run_scorer(model, params, tokenizer, context_length)  an lm run's model (the command restores its checkpoint)
  hf_config(directory, base)                           the run config a Hugging Face folder implies (GPT-2, Llama)
  hf_params(directory, config, init)                   its weights in lm's names (as init_from=hf:DIR reads them)
  hf_summary(directory, config, params)                one line: its architecture, size and context
  hf_tokenizer(directory)                              its tokenizer.json, and the prefix token the harness uses
  hf_end_of_text(directory, tokenizer)                 the id its generation stops at

Texts are encoded as transformers' tokenizers encode them in the harness (special tokens added as the tokenizer
adds them by default, e.g. a Llama tokenizer's BOS). Scoring runs in float32 on one device.
"""

import json
import pathlib

import flax.linen as nn
import jax
import ml_collections
import tokenizers
from jax.sharding import SingleDeviceSharding

from lm.data import bpe, text
from lm.errors import UserError
from lm.eval.scoring import Scorer, gpt_apply
from lm.hf.files import TOKENIZER_CONFIG, TOKENIZER_FILE, Folder
from lm.hf.source import HFSource, following

HARNESS_MAX_LENGTH = 2048  # the harness's context when neither config.json nor the tokenizer gives one
LENGTH_FIELDS = ("n_positions", "max_position_embeddings", "n_ctx")  # config.json's context, in the harness's order


def run_scorer(model: nn.Module, params, tokenizer, context_length: int, batch_size: int = 32) -> Scorer:
    """The Scorer of an lm run's GPT: through its byte-level BPE (lm prepare's, or GPT-2's), or character by character
    through its character vocabulary (CharacterEncoder: the characters it lacks dropped; a text's first character
    conditioned on a newline); a run of token ids without a tokenizer is a UserError."""
    if isinstance(tokenizer, bpe.BPETokenizer):
        return Scorer(gpt_apply(model), params, encoder(tokenizer.tokenizer), context_length,
                      tokenizer.end_of_text_id, batch_size)
    if isinstance(tokenizer, text.CharTokenizer):
        characters = CharacterEncoder(tokenizer)
        return Scorer(gpt_apply(model), params, characters, context_length, characters.ids.get("\n"), batch_size)
    raise UserError("this run has no tokenizer (it trained on token ids): the tasks are text; evaluate a run trained "
                    "with data.tokenizer (lm prepare's, or gpt2), or export it with its tokenizer and use --hf")


class CharacterEncoder:
    """text -> the ids of a character vocabulary, each character one id; the characters the vocabulary lacks are
    dropped from the text, and remembered (dropped) to be reported."""

    def __init__(self, tokenizer: text.CharTokenizer):
        self.ids = {c: i for i, c in enumerate(tokenizer.chars)}
        self.dropped: set[str] = set()

    def __call__(self, text_: str) -> list[int]:
        self.dropped.update(c for c in text_ if c not in self.ids)
        return [self.ids[c] for c in text_ if c in self.ids]

    def note(self) -> str:
        """What scoring a character-level model on the tasks means, for the user before the table."""
        return (f"note: this run reads characters (a vocabulary of {len(self.ids)}), so each text is scored character "
                "by character: a continuation's log-likelihood is the sum over its characters, and every metric means "
                "what it means for any tokenizer (LAMBADA's perplexity is per word, WikiText's per word and per byte); "
                "characters outside the vocabulary are dropped from the texts (their probabilities are not counted), "
                "a text's first character follows a newline, and a continuation longer than the model's context (in "
                "characters) cannot be scored")

    def report(self) -> str:
        """The characters dropped so far, as one line."""
        if not self.dropped:
            return "every character of the texts is in the vocabulary: none dropped"
        shown = " ".join(repr(c) for c in sorted(self.dropped))
        return f"dropped from the texts (not in the run's vocabulary): {len(self.dropped)} characters: {shown}"


def encoder(tokenizer: tokenizers.Tokenizer):
    """text -> ids, with the special tokens the tokenizer's post-processor adds (none for GPT-2's)."""
    return lambda text: tokenizer.encode(text).ids


def hf_max_length(hf: dict, tokenizer_config: dict) -> int:
    """The harness's context of a Hugging Face model: config.json's n_positions, max_position_embeddings or n_ctx,
    else the tokenizer's model_max_length, else 2048."""
    for field in LENGTH_FIELDS:
        if hf.get(field):
            return int(hf[field])
    return int(tokenizer_config.get("model_max_length") or HARNESS_MAX_LENGTH)


def read_tokenizer_config(directory: pathlib.Path) -> dict:
    path = directory / TOKENIZER_CONFIG
    return json.loads(path.read_text()) if path.is_file() else {}


def hf_config(directory: str, base: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """base (a language_model config) with the model fields the folder's config.json implies, float32, layers
    unrolled, and data.context_length the harness's context of the model (hf_max_length)."""
    folder = pathlib.Path(directory).expanduser()
    hf = Folder(folder, f"--hf={directory}").config
    config = following(str(folder), base)
    config.model.update(compute_dtype="float32", scan_layers=False)
    config.data.context_length = hf_max_length(hf, read_tokenizer_config(folder))
    return config


def hf_params(directory: str, config: ml_collections.ConfigDict, init) -> dict:
    """The folder's weights as the params of the model config describes (init: rng -> its variables), in its
    parameter dtype on the first device; read and checked as init_from=hf:DIR reads them (lm/hf/source.py)."""
    abstract = nn.unbox(jax.eval_shape(init, jax.random.key(0))["params"])
    source = HFSource(directory, config)
    on_device = SingleDeviceSharding(jax.devices()[0])
    params = source.load_params(jax.tree.map(lambda _: on_device, source.abstract_params()))
    return jax.tree.map(lambda value, wanted: value.astype(wanted.dtype), params, abstract)


def parameter_count(params: dict, vocab_size: int) -> int:
    """The parameters of a GPT's params as transformers counts its model's: without the rows lm pads the vocabulary
    with (model.vocab_multiple), in the token table and in an untied output kernel."""
    padding = params["token_embed"]["embedding"].shape[0] - vocab_size
    heads = 2 if "lm_head" in params else 1
    return sum(x.size for x in jax.tree.leaves(params)) - heads * padding * params["token_embed"]["embedding"].shape[1]


def hf_summary(directory: str, config: ml_collections.ConfigDict, params: dict) -> str:
    """'--hf=DIR: a GPT2LMHeadModel of 124,439,808 parameters (12 layers, width 768, vocabulary 50257), context
    1024, float32': the model a folder gave, its parameters counted as transformers counts them."""
    architecture = Folder(pathlib.Path(directory).expanduser(), f"--hf={directory}").config["architectures"][0]
    m, d = config.model, config.data
    return (f"--hf={directory}: a {architecture} of {parameter_count(params, d.vocab_size):,} parameters "
            f"({m.num_layers} layers, width {m.embed_dim}, vocabulary {d.vocab_size}), context {d.context_length}, "
            f"{m.compute_dtype}")


def token_id(tokenizer: tokenizers.Tokenizer, token) -> int | None:
    """The id of a tokenizer_config.json token (a string, or {"content": ...}); None when it names none."""
    if isinstance(token, dict):
        token = token.get("content")
    return tokenizer.token_to_id(token) if isinstance(token, str) else None


def hf_tokenizer(directory: str, tokenizer_file: str | None = None) -> tuple[tokenizers.Tokenizer, int | None]:
    """(the folder's tokenizer.json, or tokenizer_file; the prefix token the harness uses: the BOS of
    tokenizer_config.json, else its EOS, else <|endoftext|>); a folder without one is a UserError."""
    folder = pathlib.Path(directory).expanduser()
    path = pathlib.Path(tokenizer_file).expanduser() if tokenizer_file else folder / TOKENIZER_FILE
    if not path.is_file():
        raise UserError(f"{path} not found: the tasks are text, so --hf needs the model's tokenizer; save it into "
                        "the folder (tokenizer.save_pretrained(DIR) in transformers) or give --hf_tokenizer=FILE")
    tokenizer = bpe.BPETokenizer.load(path).tokenizer
    settings = read_tokenizer_config(folder)
    candidates = [token_id(tokenizer, settings.get(name)) for name in ("bos_token", "eos_token")]
    prefix = next((i for i in candidates if i is not None), tokenizer.token_to_id(bpe.END_OF_TEXT))
    return tokenizer, prefix


def hf_end_of_text(directory: str, tokenizer: tokenizers.Tokenizer) -> int | None:
    """The id generation stops at (the harness's eot_token_id): the EOS of the folder's tokenizer_config.json,
    else <|endoftext|>; None when the tokenizer has neither."""
    eos = token_id(tokenizer, read_tokenizer_config(pathlib.Path(directory).expanduser()).get("eos_token"))
    return eos if eos is not None else tokenizer.token_to_id(bpe.END_OF_TEXT)
