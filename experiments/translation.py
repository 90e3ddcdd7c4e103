"""Translation on Multi30k: a recurrent seq2seq (no attention, Bahdanau or Luong) or the Transformer
encoder-decoder, trained with teacher forcing on length-bucketed batches.

config.model.architecture picks the family: "rnn" (lm/models/seq2seq.py, options cell, attention,
embed_dim, hidden_dim, num_layers, dropout) or "transformer" (lm/models/transformer.py, every shared
block option of lm/models/config.py).
Loss: cross-entropy over the real target tokens (padding never counts), with label smoothing
train.label_smoothing; `cross_entropy` (unsmoothed, for perplexity) and `accuracy` are logged too.
"""

import functools
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from lm import sharding
from lm.data import translation
from lm.errors import UserError
from lm.layers.moe import moe_objective, parameter_counts
from lm.models.config import compute_dtype, transformer_config
from lm.models.seq2seq import Seq2Seq, Seq2SeqConfig
from lm.models.transformer import EncoderDecoder, EncoderDecoderConfig
from lm.search import beam_search, greedy_search, rnn_step_fn, transformer_step_fn

ARCHITECTURES = ("rnn", "transformer")


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
        ))
    raise UserError(f"model.architecture={m.architecture!r}: use one of {ARCHITECTURES}")


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of values (B, T) over the positions where mask (B, T) is 1."""
    mask = mask.astype(jnp.float32)
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


class Translation:
    unit = "tokens"  # target tokens; throughput counts the mean per sentence (batches vary in length)

    def __init__(self, config: ml_collections.ConfigDict, source_tokenizer, target_tokenizer,
                 splits: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] | None = None):
        self.config = config
        self.source_tokenizer, self.target_tokenizer = source_tokenizer, target_tokenizer
        self.splits = splits or {}
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
        smoothing = self.config.train.label_smoothing
        labels = optax.smooth_labels(jax.nn.one_hot(targets, logits.shape[-1]), smoothing)
        smoothed = masked_mean(optax.softmax_cross_entropy(logits, labels), mask)
        cross_entropy = masked_mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets), mask)
        accuracy = masked_mean((jnp.argmax(logits, -1) == targets).astype(jnp.float32), mask)
        aux_loss, moe_metrics = moe_objective(collections.get("moe", {}), *self._moe_weights())
        return smoothed + aux_loss, {"cross_entropy": cross_entropy, "accuracy": accuracy, **moe_metrics}

    def _moe_weights(self) -> tuple[float, float]:
        moe = self.config.model.get("moe")
        return (moe.load_balance_weight, moe.router_z_weight) if moe else (0.0, 0.0)

    def train_data(self, batch_size: int, seed: int, shard: tuple[int, int]):
        sources, targets = self.splits["train"]
        return translation.train_batches(sources, targets, batch_size, seed, shard, self.config.data.buckets)

    def eval_data(self):
        sources, targets = self.splits["val"]
        shard = (jax.process_index(), jax.process_count())
        return translation.eval_batches(sources, targets, self.config.eval.batch_size // shard[1], shard,
                                        self.config.data.buckets)

    def active_params(self, params) -> int:
        moe = self.config.model.get("moe")
        return parameter_counts(params, moe.top_k if moe else 1)[1]

    def flops_per_example(self, active_params: int) -> float:
        """6 N per target token (forward + backward matmuls), the encoder's share included."""
        return 6 * active_params * self.units_per_example

    def save_assets(self, workdir: pathlib.Path) -> None:
        translation.save_tokenizers(workdir, self.source_tokenizer, self.target_tokenizer)

    def translate(self, params, sentences: list[str], beam_size: int = 1, length_penalty: float = 0.6) -> list[str]:
        """Greedy (beam_size 1) or beam-search translations of source sentences."""
        max_length = self.config.data.buckets[-1]
        ids = [[*self.source_tokenizer.encode(s), translation.EOS_ID][:max_length] for s in sentences]
        source = np.zeros((len(ids), max(map(len, ids))), np.int32)
        for row, sentence_ids in enumerate(ids):
            source[row, : len(sentence_ids)] = sentence_ids
        outputs = self._search(params, jnp.asarray(source), jnp.asarray(source > 0, jnp.int32), beam_size,
                               length_penalty)
        return [self.target_tokenizer.decode(row) for row in np.asarray(outputs)]

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
        sources, references = translation.load_pairs("val", self.config.data.source_lang,
                                                     self.config.data.target_lang)
        count = 5
        hypotheses = self.translate(params, sources[:count])
        lines = [f"{s}\n  -> {h}\n  (reference: {r})" for s, h, r in
                 zip(sources[:count], hypotheses, references[:count], strict=True)]
        return {"translations": "\n".join(lines)}


def build(config: ml_collections.ConfigDict) -> Translation:
    """Reads Multi30k, fits the tokenizers on the training split and encodes every split."""
    d = config.data
    pairs = {split: translation.load_pairs(split, d.source_lang, d.target_lang) for split in translation.SPLITS}
    source_tokenizer, target_tokenizer = translation.build_tokenizers(
        d.tokenizer, *pairs["train"], vocab_size=d.vocab_size, model_type=d.sentencepiece_model, min_freq=d.min_freq
    )
    splits = {
        split: translation.encode_pairs(*pairs[split], source_tokenizer, target_tokenizer) for split in pairs
    }
    return Translation(config, source_tokenizer, target_tokenizer, splits)


def base_config() -> ml_collections.ConfigDict:
    """What every translation config shares: data, optimiser, trainer, eval and mesh sections
    (configs/translate_*.py add the model)."""
    config = ml_collections.ConfigDict()
    config.experiment = "translation"
    config.seed = 0

    config.data = ml_collections.ConfigDict()
    config.data.source_lang = "de"
    config.data.target_lang = "en"
    config.data.tokenizer = "sentencepiece"  # sentencepiece | word (lowercased, as the PyTorch tutorials)
    config.data.vocab_size = 8000  # per language, for sentencepiece
    config.data.sentencepiece_model = "unigram"  # unigram | bpe
    config.data.min_freq = 2  # for word: rarer words become <unk>
    config.data.buckets = (16, 24, 32, 48, 64)  # padded lengths; longer training pairs are dropped

    config.optimizer = ml_collections.ConfigDict()
    config.optimizer.learning_rate = 1e-3
    config.optimizer.min_learning_rate = 1e-5
    config.optimizer.warmup_steps = 200
    config.optimizer.decay_steps = 6000
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.98
    config.optimizer.weight_decay = 0.0
    config.optimizer.grad_clip_norm = 1.0

    config.train = ml_collections.ConfigDict()
    config.train.batch_size = 128  # sentences, global
    config.train.num_steps = 6000
    config.train.grad_accum_steps = 1
    config.train.label_smoothing = 0.1
    config.train.log_every = 100
    config.train.checkpoint_every = 1000
    config.train.keep_checkpoints = 2
    config.train.peak_flops = 0.0
    config.train.wandb_project = ""

    config.eval = ml_collections.ConfigDict()
    config.eval.every = 1000
    config.eval.batch_size = 128

    config.mesh = sharding.mesh_options()
    config.sharding_rules = sharding.DEFAULT_RULES
    return config
