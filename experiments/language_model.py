"""Language modelling: next-token prediction with a GPT on a character-level corpus, a pre-tokenised
token file (nanoGPT's train.bin / val.bin, with its tokenizer when data.tokenizer names one: what
`lm prepare` writes) or synthetic random ids (for throughput runs)."""

import functools
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from lm.data import bpe, run_cache, text, tokens
from lm.decode.generate import generate
from lm.errors import UserError
from lm.losses import masked_mean, moe_objective
from lm.models.config import transformer_config
from lm.models.gpt import GPT, GPTConfig, flops_per_token
from lm.train.experiment import Experiment

TOKENIZER_FILE = "tokenizer.json"
TOKEN_SOURCES = ("token_file", "synthetic")  # data.dataset values that give token ids (a tokenizer optional)
TOKENIZER_FORMAT = "a tokenizer.json as lm prepare writes it"


def gpt_config(config: ml_collections.ConfigDict, vocab_size: int) -> GPTConfig:
    return GPTConfig(
        vocab_size=vocab_size,
        context_length=config.data.context_length,
        transformer=transformer_config(config.model),
        tie_embeddings=config.model.tie_embeddings,
        vocab_multiple=config.model.vocab_multiple,
        scale_embeddings=config.model.scale_embeddings,
        loss_chunk=config.model.get("loss_chunk", 0),  # (runs saved before the option: 0)
    )


class LanguageModel(Experiment):
    unit = "tokens"

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        tokenizer: text.CharTokenizer | bpe.BPETokenizer | None,
        train_tokens: np.ndarray | None = None,
        val_tokens: np.ndarray | None = None,
        data_cache: run_cache.DataCache | None = None,
    ):
        """tokenizer: the character vocabulary of a text corpus, a token file's (data.tokenizer), or None
        for token ids without one (whose vocabulary is data.vocab_size). train_tokens, val_tokens: (N,)
        ids (memory-mapped for a token file; None for synthetic ids and for sampling)."""
        super().__init__(config, data_cache)
        self.tokenizer = tokenizer
        self.train_tokens = train_tokens
        self.val_tokens = val_tokens
        self.vocab_size = config.data.vocab_size if tokenizer is None else tokenizer.vocab_size
        self.model = GPT(gpt_config(config, self.vocab_size))
        self.units_per_example = config.data.context_length

    def init(self, rng: jax.Array) -> dict:
        tokens = jnp.zeros((1, self.config.data.context_length), jnp.int32)
        return self.model.init({"params": rng}, tokens)

    def loss(self, params, batch, rng, train: bool):
        """Cross-entropy plus the weighted mixture-of-experts auxiliary losses (zero when dense). A batch of
        packed documents (lm/data/packing.py examples) also holds segment_ids and positions, for the model,
        and weights (B, T): the cross-entropy is then their weighted mean (no loss across a boundary)."""
        packed = {key: batch[key] for key in ("segment_ids", "positions") if key in batch}
        token_losses, collections = self.model.apply(
            {"params": params}, batch["inputs"], train=train, targets=batch["targets"], rngs={"dropout": rng},
            mutable=["moe"], **packed,
        )  # (B, T), in chunks of model.loss_chunk positions
        cross_entropy = masked_mean(token_losses, batch["weights"]) if "weights" in batch else token_losses.mean()
        moe = self.model.config.transformer.moe
        aux_loss, moe_metrics = moe_objective(collections.get("moe", {}), moe.load_balance_weight,
                                              moe.router_z_weight)
        return cross_entropy + aux_loss, {"cross_entropy": cross_entropy, **moe_metrics}

    def train_data(self, batch_size: int, seed: int, shard: tuple[int, int], start_step: int):
        length, dataset = self.config.data.context_length, self.config.data.dataset
        if dataset == "synthetic":
            return tokens.SyntheticBatches(self.vocab_size, length, batch_size, seed, shard, start_step)
        if dataset == "token_file":
            return tokens.train_windows(
                self.train_tokens, length, batch_size, seed, shard, start_step, self.vocab_size
            )
        return text.train_windows(self.train_tokens, length, batch_size, seed, shard, start_step)

    def eval_data(self):
        return self.val_windows(self.config.data.context_length)

    def val_windows(self, length: int) -> list[dict[str, np.ndarray]]:
        """The fixed eval batches (eval.batch_size x eval.num_batches) of windows of length: from the val
        split, or random ids for synthetic data."""
        e, dataset = self.config.eval, self.config.data.dataset
        if dataset == "synthetic":
            return tokens.synthetic_eval(self.vocab_size, length, e.batch_size, e.num_batches)
        if dataset == "token_file":
            return tokens.eval_windows(self.val_tokens, length, e.batch_size, e.num_batches, self.vocab_size)
        return text.eval_windows(self.val_tokens, length, e.batch_size, e.num_batches, seed=0)

    def flops_per_example(self, active_params: int) -> float:
        return flops_per_token(self.model.config, active_params) * self.config.data.context_length

    def save_assets(self, workdir: pathlib.Path) -> None:
        super().save_assets(workdir)
        if self.tokenizer is not None:  # token ids without data.tokenizer: nothing to decode them with
            self.tokenizer.save(workdir / TOKENIZER_FILE)

    def export_vocabulary(self) -> tuple[int, None]:
        """The model's vocabulary; the tokenizer stays in the run folder (characters or BPE ids)."""
        return self.vocab_size, None

    def sample(self, params, prompt: str, max_new_tokens: int, temperature: float, top_k: int,
               seed: int = 0, top_p: float = 1.0) -> str:
        """The prompt continued by max_new_tokens sampled tokens, as text; a UserError for a run without a
        tokenizer or a prompt the tokenizer cannot encode to at least one id."""
        if self.tokenizer is None:
            raise UserError(no_tokenizer(self.config))
        prompt_ids = encode_prompt(self.tokenizer, prompt, "--prompt")[None]  # (1, P)
        ids = generate(
            self.model, params, prompt_ids, max_new_tokens, jax.random.key(seed), temperature, top_k, top_p
        )
        return self.tokenizer.decode(ids[0])

    def texts(self, params) -> dict[str, str]:
        if self.tokenizer is None:
            return {}  # token ids: no text to show
        s = self.config.sample
        return {"sample": self.sample(params, s.prompt, s.max_new_tokens, s.temperature, s.top_k)}

    def final_results(self, params, evaluate, workdir: pathlib.Path) -> dict[str, float]:
        """Val cross-entropy in windows of each eval.context_lengths, e.g. twice the training length to
        see which positions extrapolate: 'val_cross_entropy_ctx128'. Learned positions have no table
        rows past the training length, so longer lengths are left out for them. (The corpus has no test
        split; benchmarks/gpt_baby.py reports the loss over the whole val split.) Empty for synthetic ids."""
        e, trained_length = self.config.eval, self.config.data.context_length
        results = {}
        if self.config.data.dataset == "synthetic":
            return results
        for length in e.context_lengths:
            if self.config.model.position == "learned" and length > trained_length:
                print(f"val at context {length}: left out, learned positions stop at {trained_length}")
                continue
            batches = self.val_windows(length)
            results[f"val_cross_entropy_ctx{length}"] = evaluate(batches)["cross_entropy"]
        return results


def build(config: ml_collections.ConfigDict, workdir: pathlib.Path | None = None) -> LanguageModel:
    """By data.dataset: a text corpus (tinyshakespeare) is read, its character vocabulary fitted and
    split train/val (text_ids); a token file memory-maps data.train_file and data.val_file
    (data.token_dtype ids, each < data.vocab_size), with data.tokenizer's tokenizer when set (its
    vocabulary must be data.vocab_size); synthetic reads nothing (random ids < data.vocab_size)."""
    d = config.data
    if d.get("tokenizer") and d.dataset != "token_file":
        raise UserError(f"data.tokenizer is for data.dataset='token_file' (the ids it wrote), not "
                        f"{d.dataset!r}: drop data.tokenizer")
    if d.dataset in text.DATASETS:
        cache = run_cache.DataCache(workdir)
        tokenizer, ids = text_ids(config, workdir, cache)
        encode_prompt(tokenizer, config.sample.prompt, "--config.sample.prompt")
        return LanguageModel(config, tokenizer, *text.split_tokens(ids, d.train_fraction), data_cache=cache)
    if d.dataset not in TOKEN_SOURCES:
        raise UserError(f"data.dataset={d.dataset!r}: use one of {', '.join([*text.DATASETS, *TOKEN_SOURCES])}")
    vocab_size = d.get("vocab_size")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise UserError(f"data.dataset={d.dataset!r} needs data.vocab_size, the model's vocabulary (a positive "
                        f"int, e.g. 50257 for GPT-2 BPE), not {vocab_size!r}")
    if d.dataset == "synthetic":
        return LanguageModel(config, None)
    tokenizer = token_file_tokenizer(d) if d.get("tokenizer") else None
    if tokenizer is not None:
        encode_prompt(tokenizer, config.sample.prompt, "--config.sample.prompt")
    opened = []
    for field in ("train_file", "val_file"):
        if not d.get(field):
            raise UserError(f"data.dataset='token_file' needs data.{field}: a file of token ids, absolute or "
                            "relative to $LM_DATA_DIR")
        opened.append(tokens.open_tokens(d[field], d.get("token_dtype", "uint16"), d.context_length,
                                         vocab_size, f"data.{field}"))
    return LanguageModel(config, tokenizer, *opened)


def text_ids(config: ml_collections.ConfigDict, workdir: pathlib.Path | None,
             cache: run_cache.DataCache) -> tuple[text.CharTokenizer, np.ndarray]:
    """The character vocabulary of the data.dataset text and the text as ids (N,): fitted and encoded, or
    for a resumed run the vocabulary saved in workdir and the ids in its cache (lm/data/run_cache.py)."""
    corpus = functools.cache(lambda: text.load_text(config.data.dataset))  # read only if needed, once
    tokenizer = run_cache.saved_or_fitted(workdir, config, TOKENIZER_FILE, text.CharTokenizer.load,
                                          lambda: text.CharTokenizer.fit(corpus()))
    key = run_cache.digest(config.data, tokenizer.chars)
    return tokenizer, cache.get("tokens", key, lambda: tokenizer.encode(corpus()))


def token_file_tokenizer(data: ml_collections.ConfigDict) -> bpe.BPETokenizer:
    """data.tokenizer's tokenizer; UserError if its vocabulary is not data.vocab_size."""
    path = tokens.find_token_file(data.tokenizer, "data.tokenizer", TOKENIZER_FORMAT)
    tokenizer = bpe.BPETokenizer.load(path)
    if tokenizer.vocab_size != data.vocab_size:
        raise UserError(f"data.vocab_size={data.vocab_size} but data.tokenizer={data.tokenizer} has "
                        f"{tokenizer.vocab_size} ids: set --config.data.vocab_size={tokenizer.vocab_size}")
    return tokenizer


def encode_prompt(tokenizer: text.CharTokenizer | bpe.BPETokenizer, prompt: str, option: str) -> np.ndarray:
    """The (P,) ids of a prompt to continue, P >= 1; a UserError naming option (where the prompt came
    from: the config's sample.prompt, checked before step 1, or lm sample's --prompt) otherwise."""
    try:
        ids = tokenizer.encode(prompt)
    except ValueError as e:  # a character vocabulary without some of the prompt's characters
        problem = str(e)
    else:
        if len(ids):
            return ids
        problem = "it encodes to no token ids"
    raise UserError(f"{option}={prompt!r}: {problem}; sampling needs a prompt of at least one token: set "
                    f"{option}=TEXT to text in the run's vocabulary")


def no_tokenizer(config: ml_collections.ConfigDict) -> str:
    return (f"this run was trained on token ids (data.dataset={config.data.dataset!r}) and has no tokenizer "
            "to decode text: sampling needs a run trained on text (data.dataset='tinyshakespeare') or on "
            "token files with their data.tokenizer (lm prepare writes both)")


def from_workdir(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> LanguageModel:
    """The experiment for sampling and export: tokenizer from the workdir, no corpus needed. A run trained
    on token ids without data.tokenizer has none (sample() then says so)."""
    if config.data.dataset not in TOKEN_SOURCES:
        return LanguageModel(config, run_cache.load_saved(workdir / TOKENIZER_FILE, text.CharTokenizer.load))
    if not config.data.get("tokenizer"):
        return LanguageModel(config, None)
    return LanguageModel(config, run_cache.load_saved(workdir / TOKENIZER_FILE, bpe.BPETokenizer.load))
