"""Translation on Multi30k, or on the sentence pairs of data.source (read_pairs): a recurrent seq2seq (no
attention, Bahdanau or Luong) or the Transformer encoder-decoder, trained with teacher forcing on
length-bucketed batches.

config.model.architecture picks the family: "rnn" (lm/models/seq2seq.py, options cell, attention,
embed_dim, hidden_dim, num_layers, dropout) or "transformer" (lm/models/encoder_decoder.py, every shared
block option of lm/models/config.py).
Loss: cross-entropy over the real target tokens (padding never counts), with label smoothing
train.label_smoothing; `cross_entropy` (unsmoothed, for perplexity) and `accuracy` are logged too.
"""

import functools
import pathlib
import time
from collections.abc import Callable, Sequence

import flax.traverse_util
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from lm.data import run_cache, translation
from lm.data.bleu import corpus_bleu, tokenized_bleu
from lm.data.sources import Source
from lm.decode.search import beam_search, greedy_search, rnn_step_fn, transformer_step_fn
from lm.distributed import is_primary
from lm.errors import UserError, check_count
from lm.layers.transformer import sown_per_layer
from lm.losses import masked_accuracy, masked_cross_entropy, moe_objective
from lm.models.config import compute_dtype, transformer_config
from lm.models.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from lm.models.seq2seq import Seq2Seq, Seq2SeqConfig
from lm.progress import Progress, await_each
from lm.train.experiment import Evaluator, Experiment

ARCHITECTURES = ("rnn", "transformer")
SOURCE_SPLITS = {"train": "source", "val": "val_source", "test": "test_source"}  # split: the data option reading it
Pairs = tuple[list[str], list[str]]  # (source sentences, target sentences), line-aligned


def build_model(config: ml_collections.ConfigDict, source_vocab: int, target_vocab: int):
    m = config.model
    if m.architecture == "rnn":
        return Seq2Seq(Seq2SeqConfig(
            source_vocab_size=source_vocab, target_vocab_size=target_vocab, embed_dim=m.embed_dim,
            hidden_dim=m.hidden_dim, cell=m.cell, attention=m.attention, num_layers=m.num_layers,
            dropout=m.dropout, dtype=compute_dtype(m.compute_dtype),
        ))
    if m.architecture == "transformer":
        return EncoderDecoder(EncoderDecoderConfig(
            source_vocab_size=source_vocab, target_vocab_size=target_vocab, max_length=config.data.buckets[-1],
            transformer=transformer_config(m), vocab_multiple=m.vocab_multiple,
            scale_embeddings=m.scale_embeddings,
        ))
    raise UserError(f"model.architecture={m.architecture!r}: use one of {ARCHITECTURES}")


class Translation(Experiment):
    unit = "tokens"  # target tokens; throughput counts the mean per sentence (batches vary in length)

    def __init__(self, config: ml_collections.ConfigDict, source_tokenizer, target_tokenizer,
                 splits: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] | None = None,
                 data_cache: run_cache.DataCache | None = None, pairs: Callable[[], dict[str, Pairs]] | None = None):
        """splits: every split's encoded pairs (None to translate); pairs: every split's sentences (read_pairs
        of config.data, by default read when first needed), for BLEU."""
        super().__init__(config, data_cache)
        self.source_tokenizer, self.target_tokenizer = source_tokenizer, target_tokenizer
        self.splits = splits or {}
        self.pairs = pairs or functools.cache(lambda: read_pairs(config.data))
        self.model = build_model(config, source_tokenizer.vocab_size, target_tokenizer.vocab_size)
        train_targets = self.splits.get("train", ([], []))[1]
        # Real target tokens per sentence (bos excluded, eos included).
        self.units_per_example = round(float(np.mean([len(t) - 1 for t in train_targets]))) if train_targets else 1

    def init(self, rng: jax.Array) -> dict:
        tokens = jnp.full((1, self.config.data.buckets[0]), translation.EOS_ID, jnp.int32)
        return self.model.init({"params": rng}, tokens, jnp.ones_like(tokens), tokens)

    def loss(self, params, batch, rng, train: bool):
        logits, collections = self.model.apply(
            {"params": params}, batch["source"], batch["source_mask"], batch["decoder_inputs"], train=train,
            rngs={"dropout": rng}, mutable=["moe"],
        )  # (B, T, V)
        targets, mask = batch["targets"], batch["target_mask"]
        smoothed = masked_cross_entropy(logits, targets, mask, self.config.train.label_smoothing)
        cross_entropy = masked_cross_entropy(logits, targets, mask)
        accuracy = masked_accuracy(logits, targets, mask)
        aux_loss, moe_metrics = moe_objective(collections.get("moe", {}), *self._moe_weights())
        return smoothed + aux_loss, {"cross_entropy": cross_entropy, "accuracy": accuracy, **moe_metrics}

    def _moe_weights(self) -> tuple[float, float]:
        moe = self.config.model.get("moe")
        return (moe.load_balance_weight, moe.router_z_weight) if moe else (0.0, 0.0)

    def train_data(self, batch_size: int, seed: int, shard: tuple[int, int], start_step: int):
        sources, targets = self.splits["train"]
        return translation.train_batches(sources, targets, batch_size, seed, shard, self.config.data.buckets,
                                         start_step)

    def evaluators(self) -> list[Evaluator]:
        """sacreBLEU of greedy translations of the val split, every eval.bleu_every steps (0: never)."""
        sources, references = self.pairs()["val"]

        def val_bleu(params) -> dict[str, float]:
            return {"bleu": corpus_bleu(self.translate(params, sources, 1), references)}

        return [Evaluator("val", self.config.eval.bleu_every, val_bleu)]

    def batch_variants(self, batch):
        """One per length bucket: the (B, L) arrays at each bucket's L, the (B,) ones as they are."""
        return [{k: jax.ShapeDtypeStruct((x.shape[0], length), x.dtype, sharding=x.sharding) if x.ndim == 2 else x
                 for k, x in batch.items()} for length in self.config.data.buckets]

    def eval_data(self, split: str = "val"):
        sources, targets = self.splits[split]
        return translation.eval_batches(sources, targets, self.config.eval.batch_size, self.config.data.buckets)

    def eval_weight(self, batch) -> jax.Array:
        return jnp.sum(batch["target_mask"].astype(jnp.float32))  # the real target tokens

    def flops_per_example(self, active_params: int) -> float:
        """6 N per target token (forward + backward matmuls), the encoder's share included."""
        return 6 * active_params * self.units_per_example

    def save_assets(self, workdir: pathlib.Path) -> None:
        super().save_assets(workdir)
        translation.save_tokenizers(workdir, self.source_tokenizer, self.target_tokenizer)

    def translate(self, params, sentences: Sequence[str], beam_size: int = 1, length_penalty: float = 0.6) -> list[str]:
        """Greedy (beam_size 1) or beam-search translations of source sentences."""
        ids = self.translate_ids(params, sentences, beam_size, length_penalty)
        return [self.target_tokenizer.decode(row) for row in ids]

    def translate_ids(self, params, sentences: Sequence[str], beam_size: int = 1,
                      length_penalty: float = 0.6) -> np.ndarray:
        """Target ids (N, max_length) of N source sentences, eos then padding. Decodes in chunks of
        eval.batch_size sentences, all padded to one bucket, so a call compiles the search once; a long
        call prints its progress (lm.progress)."""
        buckets = self.config.data.buckets
        ids = [[*self.source_tokenizer.encode(s), translation.EOS_ID][: buckets[-1]] for s in sentences]
        length = buckets[int(translation.bucket_of(np.array([max(map(len, ids))]), buckets)[0])]
        chunk = min(self.config.eval.batch_size, len(ids))
        rows = -(-len(ids) // chunk) * chunk  # padded with eos-only sentences
        source = np.zeros((rows, length), np.int32)
        source[:, 0] = translation.EOS_ID
        for row, sentence_ids in enumerate(ids):
            source[row, : len(sentence_ids)] = sentence_ids
        progress = Progress(f"decoding {len(ids):,} sentences (beam {beam_size})", rows // chunk, "sentences")
        outputs = await_each(
            (self._search(params, jnp.asarray(part), jnp.asarray(part > 0, jnp.int32), beam_size, length_penalty)
             for part in np.split(source, rows // chunk)),
            progress, [min(chunk, len(ids) - start) for start in range(0, rows, chunk)],  # real sentences
        )
        return np.concatenate(jax.device_get(outputs))[: len(ids)]

    @functools.partial(jax.jit, static_argnums=(0, 4, 5))
    def _search(self, params, source, source_mask, beam_size: int, length_penalty: float) -> jax.Array:
        """source, source_mask (B, S) -> target ids (B, max_length), eos then pad."""
        max_length = self.config.data.buckets[-1]
        variables = {"params": params}
        if isinstance(self.model, Seq2Seq):
            memory = self.model.apply(variables, source, source_mask, method=Seq2Seq.encode)
            step_fn, state = rnn_step_fn(self.model, params, memory, beam_size)
        else:
            memory = self.model.apply(variables, source, source_mask, method=EncoderDecoder.encode)
            step_fn, state = transformer_step_fn(self.model, params, memory, source_mask, max_length, beam_size)
        batch, bos, eos = source.shape[0], translation.BOS_ID, translation.EOS_ID
        if beam_size == 1:
            return greedy_search(step_fn, state, batch, bos, eos, max_length)
        return beam_search(step_fn, state, batch, beam_size, bos, eos, max_length, length_penalty)[0]

    def texts(self, params) -> dict[str, str]:
        """Greedy translations of the first validation sentences, with their references."""
        sources, references = self.pairs()["val"]
        count = 5
        hypotheses = self.translate(params, sources[:count])
        lines = [f"{s}\n  -> {h}\n  (reference: {r})" for s, h, r in
                 zip(sources[:count], hypotheses, references[:count], strict=True)]
        return {"translations": "\n".join(lines)}

    def attention_maps(self, params, sentence: str, beam_size: int = 1, length_penalty: float = 0.6
                       ) -> tuple[list[str], list[str], dict[str, np.ndarray]]:
        """Where the translation of sentence looks in the source: translates it (as `translate`), then
        teacher-forces [bos] + its own output with capture_weights=True. Returns
          source_pieces (S,)  the source's pieces (words) plus '<eos>', as the encoder sees them;
          output_pieces (T,)  the output's pieces up to and including its '<eos>' (none if cut at max length);
          maps                {title: weights (T, S)}, row t = the attention while predicting output t, a
                              distribution over the source (rows sum to 1): one "<kind> attention" map for the
                              RNN, one "decoder layer <i>" map per Transformer layer (cross-attention, mean
                              over heads).
        The no-attention RNN has nothing to show: UserError."""
        if isinstance(self.model, Seq2Seq) and self.model.config.attention == "none":
            raise UserError("this model has no attention (model.attention='none'): there is no attention map "
                            "to plot; train with attention (e.g. configs/translate_rnn.py:attention)")
        source_ids = [*self.source_tokenizer.encode(sentence), translation.EOS_ID][: self.config.data.buckets[-1]]
        output = [int(i) for i in self.translate_ids(params, [sentence], beam_size, length_penalty)[0]]
        output = output[: output.index(translation.EOS_ID) + 1] if translation.EOS_ID in output else output
        source = jnp.asarray([source_ids], jnp.int32)  # (1, S)
        decoder_inputs = jnp.asarray([[translation.BOS_ID, *output[:-1]]], jnp.int32)  # (1, T)
        sown = flax.traverse_util.flatten_dict(self._sown_weights(params, source, decoder_inputs))  # path -> (weights,)
        if isinstance(self.model, Seq2Seq):
            maps = {f"{self.model.config.attention} attention": np.asarray(sown[("attention_weights",)][0][0])}
        else:
            layers = {}  # layer index -> (T, S)
            for path, (weights,) in sown.items():  # weights (1, H, T, S)
                if path[0] == "decoder" and "cross_attention" in path:
                    for layer, layer_weights in sown_per_layer(path, weights, self.model.config.transformer):
                        layers[layer] = np.asarray(layer_weights[0]).mean(axis=0)
            maps = {f"decoder layer {i + 1}": layers[i] for i in sorted(layers)}
        return (self.source_tokenizer.id_pieces(source_ids), self.target_tokenizer.id_pieces(output),
                {title: weights.astype(np.float32) for title, weights in maps.items()})

    @functools.partial(jax.jit, static_argnums=0)
    def _sown_weights(self, params, source: jax.Array, decoder_inputs: jax.Array) -> dict:
        """Teacher forcing of source (1, S) and decoder_inputs (1, T) with capture_weights=True: the
        'intermediates' collection of attention weights."""
        _, collections = self.model.apply({"params": params}, source, jnp.ones_like(source), decoder_inputs,
                                          capture_weights=True, mutable=["intermediates"])
        return collections["intermediates"]

    def final_results(self, params, evaluate, workdir: pathlib.Path) -> dict[str, float]:
        """On the test split: per-token cross-entropy, perplexity and accuracy (teacher forced), and
        for each eval.beam_sizes the sacreBLEU score (cased, detokenised: the standard) and the
        lowercased word-tokenised BLEU the PyTorch tutorials report. Writes the translations to
        workdir/translations/<split>.beam<k>.txt."""
        e, split = self.config.eval, scored_split(self.config)
        metrics = evaluate(self.eval_data(split))
        results = {f"test_{name}": metrics[name] for name in ("cross_entropy", "accuracy")}
        results["test_perplexity"] = float(np.exp(metrics["cross_entropy"]))
        sources, references = self.pairs()[split]
        if is_primary():
            (workdir / "translations").mkdir(exist_ok=True)
        for beam_size in e.beam_sizes:
            start = time.perf_counter()
            hypotheses = self.translate(params, sources, beam_size, e.length_penalty)
            results[f"test_decode_seconds_beam{beam_size}"] = time.perf_counter() - start
            if is_primary():
                (workdir / "translations" / f"{split}.beam{beam_size}.txt").write_text("\n".join(hypotheses) + "\n")
            results[f"test_bleu_beam{beam_size}"] = corpus_bleu(hypotheses, references)
            results[f"test_bleu_lowercase_tokenized_beam{beam_size}"] = tokenized_bleu(hypotheses, references)
        return results


def build(config: ml_collections.ConfigDict, workdir: pathlib.Path | None = None) -> Translation:
    """Reads the sentence pairs (read_pairs: Multi30k's or data.source's; the first data.max_train_pairs
    training pairs, if set), fits the tokenizers on the training split and encodes every split; a resumed run
    reads the tokenizers saved in workdir and the encoded splits cached there instead (lm/data/run_cache.py)."""
    d = config.data
    check_count(d, "max_train_pairs", "pairs")
    if not d.source and (d.val_source or d.test_source):
        raise UserError("data.val_source and data.test_source go with data.source, the training pairs: give it too, "
                        "or leave them '' for Multi30k")
    names = tuple(SOURCE_SPLITS) if d.source else translation.SPLITS
    if scored_split(config) not in names:
        raise UserError(f"eval.test_split={config.eval.test_split!r}: the data's splits are {', '.join(names)} "
                        f"({'data.source' if d.source else 'Multi30k'}); use one of them, or '' for its test split")
    pairs = functools.cache(lambda: read_pairs(d))  # read only if needed, once
    tokenizers = run_cache.saved_or_fitted(
        workdir, config, translation.TOKENIZERS_DIR, lambda _: translation.load_tokenizers(workdir),
        lambda: translation.build_tokenizers(d.tokenizer, *pairs()["train"], vocab_size=d.vocab_size,
                                             model_type=d.sentencepiece_model, min_freq=d.min_freq),
    )
    key = run_cache.digest(d, run_cache.saved_digest(lambda folder: translation.save_tokenizers(folder, *tokenizers)))
    cache = run_cache.DataCache(workdir)
    splits = cache.get("splits", key, lambda: {
        split: translation.encode_pairs(*sides, *tokenizers) for split, sides in pairs().items()})
    return Translation(config, *tokenizers, splits, cache, pairs)


def scored_split(config: ml_collections.ConfigDict) -> str:
    """The split scored after training: eval.test_split, or for '' the data's test split (Multi30k's
    test_2016_flickr, data.source's test)."""
    return config.eval.test_split or ("test" if config.data.source else "test_2016_flickr")


def read_pairs(data: ml_collections.ConfigDict) -> dict[str, Pairs]:
    """Every split as (source sentences, target sentences): Multi30k's (data.source '': train, val,
    test_2016_flickr) or data.source's (source_pairs: train, val, test), the training split cut to its first
    data.max_train_pairs (0: all)."""
    if data.source:
        pairs = source_pairs(data)
    else:
        pairs = {split: translation.load_pairs(split, data.source_lang, data.target_lang)
                 for split in translation.SPLITS}
    if data.max_train_pairs:
        pairs["train"] = tuple(side[: data.max_train_pairs] for side in pairs["train"])
    return pairs


def source_pairs(data: ml_collections.ConfigDict) -> dict[str, Pairs]:
    """The sentence pairs of data.source's records (the texts of their fields data.source_field and
    data.target_field), in the source's order, as train, val and test: val and test are data.val_source's
    and data.test_source's, or else data.held_out_pairs pairs each held out from the end of data.source's (the
    last ones for test, the ones before them for val)."""
    fields = {"data.source_field": data.source_field, "data.target_field": data.target_field}
    opened = {split: Source(data[option], fields, data.skip_bad_records, f"data.{option}")
              for split, option in SOURCE_SPLITS.items() if data[option]}  # all opened before any is read
    pairs = {}
    for split, source in opened.items():
        pairs[split] = [texts for _, texts in source]
        if not pairs[split]:  # (an empty source is a bad record: met here only when all were skipped)
            raise UserError(f"{source.name} gives no sentence pairs: all {source.skipped} of its records are bad "
                            "(the warning above names the first)")
    for split in ("test", "val"):
        if split not in pairs:
            cut = len(pairs["train"]) - data.held_out_pairs
            if cut < 1:
                raise UserError(f"data.source has {len(pairs['train'])} sentence pairs left: too few to hold out "
                                f"data.held_out_pairs={data.held_out_pairs} for {split} and train on the rest; "
                                f"lower it, or give data.{SOURCE_SPLITS[split]}")
            pairs["train"], pairs[split] = pairs["train"][:cut], pairs["train"][cut:]
    return {split: tuple(map(list, zip(*pairs[split], strict=True))) for split in SOURCE_SPLITS}


def from_workdir(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> Translation:
    """The experiment for translating: tokenizers from the run folder, no corpus needed."""
    return Translation(config, *run_cache.load_saved(workdir / translation.TOKENIZERS_DIR,
                                                     lambda _: translation.load_tokenizers(workdir)))
