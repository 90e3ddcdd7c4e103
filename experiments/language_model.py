"""Language modelling: next-token prediction with a GPT on a character-level corpus, a pre-tokenised
token file (nanoGPT's train.bin / val.bin, with its tokenizer when data.tokenizer names one: what
`lm prepare` writes), the documents of a source (files, TFDS or Hugging Face: data.source, tokenised with
data.tokenizer, packed by document or concatenated) or synthetic random ids (for throughput runs)."""

import functools
import itertools
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from lm import runs
from lm.data import bpe, chat, mixture, packing, run_cache, sources, text, token_shards, tokens
from lm.decode.generate import generate
from lm.errors import UserError
from lm.eval.benchmarks import benchmark_evaluators, parse_benchmarks
from lm.eval.scoring import Scorer, gpt_apply
from lm.eval.tasks import check_data
from lm.layers.options import declared_copy, description, left_at_default
from lm.losses import cross_entropy_and_logsumexp, masked_mean, moe_objective
from lm.models.config import transformer_config
from lm.models.gpt import GPT, GPTConfig, flops_per_token
from lm.train.experiment import Evaluator, Experiment

TOKENIZER_FILE = "tokenizer.json"
TEMPLATE_FILE = "chat_template.json"  # in a post-training run's folder: its template's source, special tokens, name
TOKEN_SOURCES = ("token_file", "synthetic")  # data.dataset values that give token ids (a tokenizer optional)
SOURCE = "source"  # data.dataset: the documents of data.source, tokenised with data.tokenizer
SOURCE_OPTIONS = ("source", "mixture", "val_source", "val_fraction", "text_field", "skip_bad_records")  # the documents
DATASET_OPTIONS = {  # the data keys (besides dataset) each dataset of configs/base.py token_file_data reads
    "token_file": ("train_file", "val_file", "token_dtype", "tokenizer", "vocab_size", "context_length"),
    "synthetic": ("vocab_size", "context_length"),
    SOURCE: (*SOURCE_OPTIONS, "packing", "tokenizer", "vocab_size", "context_length"),
}
TEXT_OPTIONS = ("context_length", "train_fraction")  # what a text corpus (text_data) reads
GPT2_TOKENIZER = "gpt2"  # data.tokenizer: GPT-2's own (lm/data/bpe.py from_gpt2), a source's default
NAMED_TOKENIZERS = {  # data.tokenizer names that need no file
    GPT2_TOKENIZER: bpe.BPETokenizer.from_gpt2,
    "bytes": bpe.BPETokenizer.bytes_only,  # a byte-level BPE with no merges: 257 ids
}
GPT2_VOCAB_SIZE = 50257  # GPT-2's BPE: data.vocab_size 0 for ids without a tokenizer
ENCODE_BATCH = 4096  # documents a tokenizer call encodes (in parallel)
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
        train_rows: list[packing.PackedRows] | None = None,
        val_documents: list[list[np.ndarray]] | None = None,
        components: list[mixture.Component] | None = None,
        chat_template: chat.ChatTemplate | None = None,
    ):
        """tokenizer: the character vocabulary of a text corpus, a token file's or a source's (data.tokenizer),
        or None for token ids without one (whose vocabulary is data.vocab_size). train_tokens, val_tokens: (N,)
        ids (memory-mapped for a token file; None for synthetic ids, packed documents and sampling). Documents
        packed by document instead: train_rows, the training rows of data.source (one) or of each of the
        mixture's components, and val_documents, the validation documents' ids (packed at each length
        evaluated): of data.val_source or data.source (one list), or of each component. chat_template: the
        template a supervised fine-tuning run renders conversations with (lm sample --chat, lm export)."""
        super().__init__(config, data_cache)
        self.tokenizer = tokenizer
        self.train_tokens = train_tokens
        self.val_tokens = val_tokens
        self.train_rows = train_rows
        self.val_documents = val_documents
        self.components = components or []
        self.chat_template = chat_template
        self.vocab_size = config.data.vocab_size if tokenizer is None else tokenizer.vocab_size
        self.model = GPT(gpt_config(config, self.vocab_size))
        self.units_per_example = config.data.context_length
        self.z_loss_weight = config.train.get("z_loss", 0.0)  # (runs saved before the option: none)

    def init(self, rng: jax.Array) -> dict:
        tokens = jnp.zeros((1, self.config.data.context_length), jnp.int32)
        return self.model.init({"params": rng}, tokens)

    def loss(self, params, batch, rng, train: bool):
        """Cross-entropy, plus train.z_loss times the output z-loss (PaLM: the mean of logsumexp(logits)^2 over
        the loss's tokens), plus the weighted mixture-of-experts auxiliary losses (zero when dense). Logged
        beside the loss: cross_entropy, z_loss (the unweighted mean of logsumexp^2) and logsumexp (its mean: the
        logits' scale, whatever the weight). A batch of packed documents (lm/data/packing.py examples) also
        holds segment_ids and positions, for the model, and weights (B, T): the means are then weighted by
        them (no loss across a boundary)."""
        packed = {key: batch[key] for key in ("segment_ids", "positions") if key in batch}
        per_token, collections = self.model.apply(
            {"params": params}, batch["inputs"], train=train, targets=batch["targets"], rngs={"dropout": rng},
            mutable=["moe"], logits_reduce=cross_entropy_and_logsumexp, **packed,
        )  # {"cross_entropy", "logsumexp"}: (B, T) each, in chunks of model.loss_chunk positions

        def mean(values: jax.Array) -> jax.Array:  # over the loss's tokens
            return masked_mean(values, batch["weights"]) if "weights" in batch else values.mean()

        cross_entropy, z_loss = mean(per_token["cross_entropy"]), mean(jnp.square(per_token["logsumexp"]))
        moe = self.model.config.transformer.moe
        aux_loss, moe_metrics = moe_objective(collections.get("moe", {}), moe.load_balance_weight,
                                              moe.router_z_weight)
        metrics = {"cross_entropy": cross_entropy, "z_loss": z_loss, "logsumexp": mean(per_token["logsumexp"])}
        return (cross_entropy + self.z_loss_weight * z_loss + aux_loss,
                {**metrics, **moe_metrics, **self.source_shares(batch)})

    def source_shares(self, batch) -> dict[str, jax.Array]:
        """For a batch of a mixture (its rows' "source", (B,)): each component's share of the batch's tokens
        (padding left out), 'share_source0', ...; empty otherwise."""
        if "source" not in batch:
            return {}
        tokens = batch["segment_ids"] > 0  # (B, T)
        total = jnp.maximum(tokens.sum(), 1)
        return {f"share_source{j}": (tokens & (batch["source"][:, None] == j)).sum() / total
                for j in range(len(self.components))}

    def train_data(self, batch_size: int, seed: int, shard: tuple[int, int], start_step: int):
        length, dataset = self.config.data.context_length, self.config.data.dataset
        if dataset == "synthetic":
            return tokens.SyntheticBatches(self.vocab_size, length, batch_size, seed, shard, start_step)
        if self.components:
            weights = [component.weight for component in self.components]
            return mixture.MixtureBatches(self.train_rows, weights, batch_size, seed, shard, start_step)
        if self.train_rows is not None:
            return packing.train_batches(self.train_rows[0], batch_size, seed, shard, start_step)
        if dataset in ("token_file", SOURCE):  # ids as stored (uint16, memory-mapped), int32 per batch
            return tokens.train_windows(
                self.train_tokens, length, batch_size, seed, shard, start_step, self.vocab_size
            )
        return text.train_windows(self.train_tokens, length, batch_size, seed, shard, start_step)

    def eval_data(self):
        return self.val_windows(self.config.data.context_length)

    def val_windows(self, length: int) -> list[dict[str, np.ndarray]]:
        """The fixed eval batches (eval.batch_size x eval.num_batches) of windows of length: from the val
        split (its documents packed into rows of length), or random ids for synthetic data."""
        e, dataset = self.config.eval, self.config.data.dataset
        if dataset == "synthetic":
            return tokens.synthetic_eval(self.vocab_size, length, e.batch_size, e.num_batches)
        if self.val_documents is not None:
            rows = [packing.pack_documents(documents, length) for documents in self.val_documents]
            if len(rows) == 1:
                return packing.eval_batches(rows[0], e.batch_size, e.num_batches)
            weights = [component.weight for component in self.components]  # each component's own, mixed
            return list(itertools.islice(mixture.MixtureBatches(rows, weights, e.batch_size, seed=0), e.num_batches))
        if dataset in ("token_file", SOURCE):
            return tokens.eval_windows(self.val_tokens, length, e.batch_size, e.num_batches, self.vocab_size)
        return text.eval_windows(self.val_tokens, length, e.batch_size, e.num_batches, seed=0)

    def flops_per_example(self, active_params: int) -> float:
        return flops_per_token(self.model.config, active_params) * self.config.data.context_length

    def evaluators(self) -> list[Evaluator]:
        """The zero-shot tasks of eval.benchmarks (lm/eval/benchmarks.py: hellaswag_acc_norm, ...) every eval.every
        steps, scored with the GPT and its BPE tokenizer (build checked there is one) in batches of eval.batch_size
        sequences; none when eval.benchmarks is ''."""
        spec = self.config.eval.get("benchmarks", "")  # (runs saved before the option: none)
        if not spec:
            return []
        tokenizer = self.tokenizer.tokenizer
        scorer = Scorer(gpt_apply(self.model), None, lambda text: tokenizer.encode(text).ids,
                        self.config.data.context_length, self.tokenizer.end_of_text_id, self.config.eval.batch_size)
        return benchmark_evaluators(spec, self.config.eval.every, scorer)

    def save_assets(self, workdir: pathlib.Path) -> None:
        """The data cache, the tokenizer (TOKENIZER_FILE) and a post-training run's chat template (TEMPLATE_FILE):
        sampling and export read them there, not data.tokenizer's or data.chat_template's file, which may have
        moved or changed since."""
        super().save_assets(workdir)
        if self.tokenizer is not None:  # token ids without data.tokenizer: nothing to decode them with
            self.tokenizer.save(workdir / TOKENIZER_FILE)
        if (template := self.chat_template) is not None:
            runs.write_json(workdir / TEMPLATE_FILE, {"name": template.name, "source": template.source,
                                                      "special_tokens": template.special_tokens})

    def export_vocabulary(self) -> tuple[int, bpe.BPETokenizer | None]:
        """The model's vocabulary, and its byte-level BPE (written into the exported folder); a character
        vocabulary (lm's own format) stays in the run folder."""
        return self.vocab_size, self.tokenizer if isinstance(self.tokenizer, bpe.BPETokenizer) else None

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

    def chat_prompt(self, text: str) -> str:
        """text as the user's message, rendered by the run's chat template with the assistant's turn opened
        (lm sample --chat); a UserError for a run without one (a pretrained GPT: only supervised fine-tuning
        runs, experiments/sft.py, have one)."""
        if self.chat_template is None:
            raise UserError("--chat: this run has no chat template (data.chat_template of a supervised fine-tuning "
                            "run, configs/sft.py); leave --chat out to continue the prompt as it is")
        return self.chat_template.render(chat.pair_messages(text, "")[:1], add_generation_prompt=True)

    def texts(self, params) -> dict[str, str]:
        """The sample prompt continued; with a chat template, as a user message (chat_prompt) and the reply."""
        s = self.config.sample
        if self.tokenizer is None or not s.max_new_tokens:
            return {}  # token ids: no text to show; or no sample asked for
        prompt = s.prompt if self.chat_template is None else self.chat_prompt(s.prompt)
        return {"sample": self.sample(params, prompt, s.max_new_tokens, s.temperature, s.top_k)}

    def final_results(self, params, evaluate, workdir: pathlib.Path) -> dict[str, float]:
        """Val cross-entropy in windows of each eval.context_lengths, e.g. twice the training length to
        see which positions extrapolate: 'val_cross_entropy_ctx128'. Learned positions have no table
        rows past the training length, so longer lengths are left out for them. (The corpus has no test
        split; benchmarks/gpt_baby.py reports the loss over the whole val split.) For a mixture, also each
        source's held-out documents alone at the training length: 'val_cross_entropy_source0', ... Empty for
        synthetic ids. With eval.position_bands, each length's windows also give the cross-entropy of the tokens
        at each band of positions that fits in it (position_band_losses): 'val_cross_entropy_ctx512_pos128_256'."""
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
            bands = [(a, b) for a, b in position_bands(e.get("position_bands", ())) if b <= length]
            if bands:
                losses = position_band_losses(self.model, params, batches, bands)
                results.update({f"val_cross_entropy_ctx{length}_pos{a}_{b}": loss
                                for (a, b), loss in zip(bands, losses, strict=True)})
        if self.val_documents is not None and len(self.val_documents) > 1:  # each mixture source's alone
            for j, documents in enumerate(self.val_documents):
                rows = packing.pack_documents(documents, trained_length)
                batches = packing.eval_batches(rows, e.batch_size, e.num_batches)
                results[f"val_cross_entropy_source{j}"] = evaluate(batches)["cross_entropy"]
        return results


def build(config: ml_collections.ConfigDict, workdir: pathlib.Path | None = None) -> LanguageModel:
    """By data.dataset (a data.source or data.mixture selects source over token_file: run_data): a text corpus
    (tinyshakespeare) is read, its character vocabulary fitted and split train/val (text_ids); a token file
    memory-maps data.train_file and data.val_file (data.token_dtype ids, each < data.vocab_size), with
    data.tokenizer's tokenizer when set (its vocabulary is data.vocab_size's); a source's documents are read and
    tokenised (source_experiment); synthetic reads nothing (random ids < data.vocab_size). The experiment's
    config is run_data's copy of config, its vocabulary size filled in (the trainer runs with it)."""
    config = run_data(config)
    d = config.data
    check_benchmarks(config)
    position_bands(config.eval.get("position_bands", ()))
    if d.dataset in text.DATASETS:
        cache = run_cache.DataCache(workdir)
        tokenizer, ids = text_ids(config, workdir, cache)
        check_sample_prompt(tokenizer, config)
        return LanguageModel(config, tokenizer, *text.split_tokens(ids, d.train_fraction), data_cache=cache)
    if d.dataset not in (*TOKEN_SOURCES, SOURCE):
        raise UserError(f"data.dataset={d.dataset!r}: use one of {', '.join([*text.DATASETS, *TOKEN_SOURCES, SOURCE])}")
    vocab_size = d.get("vocab_size")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 0:
        raise UserError(f"data.dataset={d.dataset!r} needs data.vocab_size, the model's vocabulary (a positive "
                        f"int, e.g. 50257 for GPT-2 BPE, or 0: data.tokenizer's), not {vocab_size!r}")
    if d.dataset == "synthetic" or (d.dataset == "token_file" and not d.get("tokenizer")):
        d.vocab_size = d.vocab_size or GPT2_VOCAB_SIZE  # ids without a tokenizer
    if d.dataset == "synthetic":
        return LanguageModel(config, None)
    if d.dataset == SOURCE:
        return source_experiment(config, workdir)
    tokenizer = token_file_tokenizer(d) if d.get("tokenizer") else None
    if tokenizer is not None:
        check_sample_prompt(tokenizer, config)
    opened = []
    for field in ("train_file", "val_file"):
        if not d.get(field):
            raise UserError(f"data.dataset='token_file' needs data.{field}: a file of token ids, absolute or "
                            "relative to $LM_DATA_DIR")
        opened.append(tokens.open_tokens(d[field], d.get("token_dtype", "uint16"), d.context_length,
                                         d.vocab_size, f"data.{field}"))
    return LanguageModel(config, tokenizer, *opened)


def run_data(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A copy of config (config itself is left alone) with its data section as the run reads it: a data.source or
    data.mixture selects data.dataset=source where data.dataset is token_file; a key the chosen dataset does not
    read (DATASET_OPTIONS), set away from its declared default, is a UserError; init_from=RUN gives what
    from_init_run takes; a source's tokenizer is GPT-2's unless data.tokenizer names one."""
    config = declared_copy(config)
    d = config.data
    if d.dataset == "token_file" and (d.get("source") or d.get("mixture")):
        d.dataset = SOURCE
    reads = DATASET_OPTIONS.get(d.dataset, TEXT_OPTIONS)
    for key in d:
        if key not in ("dataset", *reads) and description(d, key) is not None and not left_at_default(d, key):
            readers = " or ".join(name for name, keys in DATASET_OPTIONS.items() if key in keys)
            raise UserError(f"data.{key}={d[key]!r} is not read by data.dataset={d.dataset!r}: drop it"
                            + (f" (it is for data.dataset={readers})" if readers else ""))
    from_init_run(config, reads)
    if d.dataset == SOURCE and not d.get("tokenizer"):
        d.tokenizer = GPT2_TOKENIZER
    return config


def from_init_run(config: ml_collections.ConfigDict, reads: tuple[str, ...] = ("tokenizer", "context_length")) -> None:
    """With init_from=RUN (an lm run of a GPT: its folder, checkpoints or one step), the run's data.tokenizer (its
    copy in the run folder, or gpt2) and data.context_length, each where config leaves it at its declared default
    and reads it (reads: the data keys config's dataset reads); printed. Nothing for hf:DIR or a run without a
    config.json."""
    location, d = config.get("init_from", ""), config.data
    folder = runs.run_folder(location) if location and not location.startswith("hf:") else None
    if folder is None:
        return
    there = runs.read_json(folder / runs.CONFIG_FILE, runs.CONFIG_REMEDY).get("data", {})
    taken = {}
    if (there.get("tokenizer") and "tokenizer" in reads and left_at_default(d, "tokenizer")
            and (folder / TOKENIZER_FILE).is_file()):
        named = there["tokenizer"] in NAMED_TOKENIZERS
        taken["tokenizer"] = there["tokenizer"] if named else str(folder / TOKENIZER_FILE)
    if isinstance(there.get("context_length"), int) and "context_length" in reads and left_at_default(
            d, "context_length"):
        taken["context_length"] = there["context_length"]
    taken = {key: value for key, value in taken.items() if d[key] != value}
    if taken:
        d.update(taken)
        print(f"init_from={location}: " + ", ".join(f"data.{key}={value}" for key, value in taken.items())
              + " (the run's: set them to override)")


def post_training_data(config: ml_collections.ConfigDict) -> tuple[ml_collections.ConfigDict, bpe.BPETokenizer]:
    """The start of a post-training run's build (SFT, DPO): a copy of config with what init_from=RUN gives
    (from_init_run) and data.vocab_size its tokenizer's, and that tokenizer."""
    config = declared_copy(config)
    from_init_run(config)
    return config, token_file_tokenizer(config.data)


def position_bands(edges) -> list[tuple[int, int]]:
    """eval.position_bands, the ends of the bands after 0 ((128, 256, 512)) -> the bands [(0, 128), (128, 256),
    (256, 512)]; edges that are not positive, increasing ints are a UserError."""
    edges = tuple(edges)
    if any(isinstance(b, bool) or not isinstance(b, int) for b in edges) or list(edges) != sorted(set(edges)) or (
            edges and edges[0] < 1):
        raise UserError(f"eval.position_bands={edges}: give the ends of the position bands, positive and increasing, "
                        "e.g. (128,256,512) for [0,128), [128,256), [256,512)")
    return list(zip((0, *edges), edges, strict=False))


@functools.partial(jax.jit, static_argnums=0)
def token_cross_entropy(model: GPT, params, batch: dict) -> jax.Array:
    """The cross-entropy of each of a batch's targets (B, T), the model reading its inputs as the loss does (a
    packed batch's segment_ids and positions too)."""
    packed = {key: batch[key] for key in ("segment_ids", "positions") if key in batch}
    return model.apply({"params": params}, batch["inputs"], targets=batch["targets"],
                       logits_reduce=cross_entropy_and_logsumexp, **packed)["cross_entropy"]


def band_sums(cross_entropy: np.ndarray, positions: np.ndarray, weights: np.ndarray,
              bands: list[tuple[int, int]]) -> np.ndarray:
    """(len(bands), 2) float64: the weighted sum of the cross-entropies (B, T) of the tokens whose position is in
    each band [a, b), and the sum of their weights."""
    sums = np.zeros((len(bands), 2))
    for i, (a, b) in enumerate(bands):
        inside = weights * ((positions >= a) & (positions < b))
        sums[i] = np.sum(cross_entropy * inside, dtype=np.float64), np.sum(inside, dtype=np.float64)
    return sums


def position_band_losses(model: GPT, params, batches: list[dict], bands: list[tuple[int, int]]) -> list[float]:
    """The mean cross-entropy, over batches, of the tokens at each band of positions [a, b): a packed batch's
    tokens by their position in their document (what the model's positions are), others by their place in the
    window; padding (weight 0) left out; NaN for a band without tokens."""
    sums = np.zeros((len(bands), 2))
    for batch in batches:
        cross_entropy = np.asarray(jax.device_get(token_cross_entropy(model, params, batch)))
        positions = batch.get("positions", np.broadcast_to(np.arange(cross_entropy.shape[1]), cross_entropy.shape))
        weights = batch.get("weights", np.ones(cross_entropy.shape))
        sums += band_sums(cross_entropy, np.asarray(positions), np.asarray(weights, np.float64), bands)
    with np.errstate(invalid="ignore"):
        return [float(total / count) if count else float("nan") for total, count in sums]


def check_benchmarks(config: ml_collections.ConfigDict) -> None:
    """eval.benchmarks, before any data is read: its tasks and counts (lm/eval/benchmarks.py), a BPE tokenizer to
    score their text with (data.tokenizer) and their files in $LM_DATA_DIR; a UserError otherwise."""
    spec = config.eval.get("benchmarks", "")
    chosen = parse_benchmarks(spec)
    if not chosen:
        return
    d = config.data
    if d.dataset not in (*TOKEN_SOURCES, SOURCE) or not d.get("tokenizer"):
        kind = f"reads {d.dataset} as characters" if d.dataset in text.DATASETS else "has token ids but no tokenizer"
        raise UserError(f"eval.benchmarks={spec}: the tasks are text, scored through the run's BPE tokenizer, and "
                        f"this run {kind}: train on BPE ids (data.tokenizer: lm prepare's or gpt2) or set "
                        "--config.eval.benchmarks=''")
    check_data([task for task, _ in chosen])


def text_ids(config: ml_collections.ConfigDict, workdir: pathlib.Path | None,
             cache: run_cache.DataCache) -> tuple[text.CharTokenizer, np.ndarray]:
    """The character vocabulary of the data.dataset text and the text as ids (N,): fitted and encoded, or
    for a resumed run the vocabulary saved in workdir and the ids in its cache (lm/data/run_cache.py)."""
    corpus = functools.cache(lambda: text.load_text(config.data.dataset))  # read only if needed, once
    tokenizer = run_cache.saved_or_fitted(workdir, config, TOKENIZER_FILE, text.CharTokenizer.load,
                                          lambda: text.CharTokenizer.fit(corpus()))
    key = run_cache.digest(config.data, tokenizer.chars)
    return tokenizer, cache.get("tokens", key, lambda: tokenizer.encode(corpus()))


def source_experiment(config: ml_collections.ConfigDict, workdir: pathlib.Path | None) -> LanguageModel:
    """The language model on the documents of data.source, or of each source of data.mixture (source_documents),
    tokenised with data.tokenizer: packed by document into rows of context_length + 1 (data.packing=documents;
    the padding fraction is printed; a mixture's rows drawn from its sources by weight: lm/data/mixture.py), or
    concatenated into one stream of ids cut into windows as a token file is (concat, data.source only)."""
    d = config.data
    if bool(d.source) == bool(d.mixture):
        raise UserError(f"data.dataset='source' needs the documents to train on: data.source (one of "
                        f"{sources.SPEC_FORMS}) or data.mixture ({mixture.FORM}), not both")
    components = mixture.parse_mixture(d.mixture) if d.mixture else []
    if components and d.packing != "documents":
        raise UserError(f"data.mixture draws whole packed rows from its sources: it needs data.packing=documents, "
                        f"not {d.packing!r}")
    tokenizer = token_file_tokenizer(d)
    check_sample_prompt(tokenizer, config)
    cache = run_cache.DataCache(workdir)
    specs = [(d.source, "data.source")] if d.source else [(c.spec, f"data.mixture's {c.spec}") for c in components]
    train, val = source_documents(d, specs, tokenizer, cache)
    if d.packing == "concat":
        return LanguageModel(config, tokenizer, train[0][0], val[0][0], data_cache=cache)  # (no int32 copy)
    rows = []
    for j, (documents, (spec, option)) in enumerate(zip(train, specs, strict=True)):
        rows.append(packing.pack_documents(unflatten(*documents), d.context_length))
        named = f"data.mixture source{j} = {spec} ({components[j].weight:.3g})" if components else option
        print(f"{named}: {len(documents[1]) - 1} documents packed into {len(rows[-1].tokens)} rows of "
              f"{d.context_length + 1} tokens, {packing.padding_fraction(rows[-1]):.2%} padding")
    return LanguageModel(config, tokenizer, data_cache=cache, train_rows=rows,
                         val_documents=[unflatten(*documents) for documents in val], components=components)


Flat = tuple[np.ndarray, np.ndarray]  # documents as (ids (N,), offsets (D + 1,)): i is ids[offsets[i]:offsets[i + 1]]


def source_documents(data: ml_collections.ConfigDict, specs: list[tuple[str, str]], tokenizer: bpe.BPETokenizer,
                     cache: run_cache.DataCache) -> tuple[list[Flat], list[Flat]]:
    """(train, val) documents, each its ids then the end-of-text id: of each of specs ((spec, the option naming
    it) pairs: data.source or the mixture's sources), and for validation data.val_source's (one) or else the
    last data.val_fraction of each spec's. Read and tokenised (encoded_documents), or for a resumed run read
    from its data cache."""
    if tokenizer.end_of_text_id is None:
        raise UserError(f"data.tokenizer={data.tokenizer} has no {bpe.END_OF_TEXT} token to end each document "
                        f"with: give a tokenizer that has one ({TOKENIZER_FORMAT})")
    if any(token_shards.is_spec(spec) for spec, _ in [*specs, (data.val_source, "data.val_source")]):
        return prepared_documents(data, specs, tokenizer)
    key = run_cache.digest({name: data[name] for name in SOURCE_OPTIONS}, tokenizer.tokenizer.to_str())

    def read() -> dict[str, list[Flat]]:
        named = specs + ([(data.val_source, "data.val_source")] if data.val_source else [])
        opened = [sources.Source(spec, data.text_field, data.skip_bad_records, option)
                  for spec, option in named]  # all opened before any is read
        encoded = [encoded_documents(source, tokenizer) for source in opened]
        if data.val_source:
            return {"train": encoded[:-1], "val": encoded[-1:]}
        split = [held_out(documents, data.val_fraction, option)
                 for documents, (_, option) in zip(encoded, specs, strict=True)]
        return {"train": [train for train, _ in split], "val": [val for _, val in split]}

    documents = cache.get("documents", key, read)
    return documents["train"], documents["val"]


def prepared_documents(data: ml_collections.ConfigDict, specs: list[tuple[str, str]],
                       tokenizer: bpe.BPETokenizer) -> tuple[list[Flat], list[Flat]]:
    """source_documents of specs that are all tokens:DIR, folders `lm prepare --source` wrote: each folder's
    train split, and for validation data.val_source's val split (a tokens:DIR too) or else each folder's; ids
    memory-mapped (lm/data/token_shards.py), nothing tokenised or cached. Each folder's tokenizer must be
    data.tokenizer's."""
    named = specs + ([(data.val_source, "data.val_source")] if data.val_source else [])
    if not all(token_shards.is_spec(spec) for spec, _ in named):
        raise UserError(f"{', '.join(f'{option}={spec}' for spec, option in named)}: give all of them as tokens:DIR "
                        "(documents lm prepare --source tokenised) or none")
    read = functools.partial(token_shards.read_documents, tokenizer=tokenizer.tokenizer,
                             tokenizer_option=f"data.tokenizer={data.tokenizer}")
    return ([read(spec, "train", option) for spec, option in specs],
            [read(spec, "val", option) for spec, option in (named[-1:] if data.val_source else specs)])


def encoded_documents(source: sources.Source, tokenizer: bpe.BPETokenizer) -> Flat:
    """The source's documents tokenised ENCODE_BATCH at a time on all cores, each followed by the end-of-text
    id; ids uint16 where the vocabulary fits. A UserError if the source gives no document."""
    pieces, lengths = [], []
    end = np.array([tokenizer.end_of_text_id], np.int32)
    texts = (text for _, text in source)
    while batch := list(itertools.islice(texts, ENCODE_BATCH)):
        for ids in tokenizer.encode_batch(batch):
            pieces += [ids, end]
            lengths.append(len(ids) + 1)
    if not lengths:  # (an empty source is a bad record: met here only when all were skipped)
        raise UserError(f"{source.name} gives no documents: all {source.skipped} of its records are bad "
                        "(the warning above names the first)")
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.int32
    return np.concatenate(pieces).astype(dtype), np.concatenate([[0], np.cumsum(lengths)])


def held_out(documents: Flat, fraction: float, option: str = "data.source") -> tuple[Flat, Flat]:
    """(train, val): the last max(1, floor(D * fraction)) of the D documents (fraction < 1) for validation,
    the rest for training. A single document (a corpus in one text file) is cut instead: its last
    max(1, floor(n * fraction)) tokens are validation, the rest training, each a document; a UserError for a
    single document of one token, named by option."""
    ids, offsets = documents
    count = len(offsets) - 1
    if count == 1:
        cut = len(ids) - max(1, int(len(ids) * fraction))
        if cut < 1:
            raise UserError(f"{option} has a single document of {len(ids)} token: too few to hold some out for "
                            "validation and train on the rest; give more text, or data.val_source")
        return (ids[:cut], np.array([0, cut])), (ids[cut:], np.array([0, len(ids) - cut]))
    cut = count - max(1, int(count * fraction))
    start = offsets[cut]
    return (ids[:start], offsets[:cut + 1]), (ids[start:], offsets[cut:] - start)


def unflatten(ids: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    """The documents of (ids, offsets), as views of ids."""
    return np.split(ids, offsets[1:-1])


def token_file_tokenizer(data: ml_collections.ConfigDict) -> bpe.BPETokenizer:
    """data.tokenizer's tokenizer (a name of NAMED_TOKENIZERS, else a tokenizer.json); data.vocab_size 0 is set to
    its vocabulary, another size than its is a UserError."""
    if data.tokenizer in NAMED_TOKENIZERS:
        tokenizer = NAMED_TOKENIZERS[data.tokenizer]()
    else:
        tokenizer = bpe.BPETokenizer.load(tokens.find_token_file(data.tokenizer, "data.tokenizer", TOKENIZER_FORMAT))
    data.vocab_size = data.vocab_size or tokenizer.vocab_size
    if tokenizer.vocab_size != data.vocab_size:
        raise UserError(f"data.vocab_size={data.vocab_size} but data.tokenizer={data.tokenizer} has "
                        f"{tokenizer.vocab_size} ids: set --config.data.vocab_size={tokenizer.vocab_size} (or 0: "
                        "the tokenizer's)")
    return tokenizer


def check_sample_prompt(tokenizer: text.CharTokenizer | bpe.BPETokenizer, config: ml_collections.ConfigDict) -> None:
    """config.sample.prompt, checked before step 1 (encode_prompt) where the run samples after training: not with
    sample.max_new_tokens=0, which samples nothing."""
    if config.sample.max_new_tokens:
        encode_prompt(tokenizer, config.sample.prompt, "--config.sample.prompt")


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
    if config.data.dataset not in (*TOKEN_SOURCES, SOURCE):
        return LanguageModel(config, run_cache.load_saved(workdir / TOKENIZER_FILE, text.CharTokenizer.load))
    if not config.data.get("tokenizer"):
        return LanguageModel(config, None)
    return LanguageModel(config, run_cache.load_saved(workdir / TOKENIZER_FILE, bpe.BPETokenizer.load))
