"""Language modelling: next-token prediction with a GPT on a character-level corpus."""

import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from lm.data import text
from lm.generate import generate
from lm.layers.moe import moe_objective, parameter_counts
from lm.models.config import transformer_config
from lm.models.gpt import GPT, GPTConfig, flops_per_token

TOKENIZER_FILE = "tokenizer.json"


def gpt_config(config: ml_collections.ConfigDict, vocab_size: int) -> GPTConfig:
    return GPTConfig(
        vocab_size=vocab_size,
        context_length=config.data.context_length,
        transformer=transformer_config(config.model),
        tie_embeddings=config.model.tie_embeddings,
        vocab_multiple=config.model.vocab_multiple,
        scale_embeddings=config.model.scale_embeddings,
    )


class LanguageModel:
    unit = "tokens"

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        tokenizer: text.CharTokenizer,
        train_tokens: np.ndarray | None = None,
        val_tokens: np.ndarray | None = None,
    ):
        self.config = config
        self.tokenizer = tokenizer
        self.train_tokens = train_tokens
        self.val_tokens = val_tokens
        self.model = GPT(gpt_config(config, tokenizer.vocab_size))
        self.units_per_example = config.data.context_length

    def init(self, rng: jax.Array) -> dict:
        tokens = jnp.zeros((1, self.config.data.context_length), jnp.int32)
        return self.model.init({"params": rng}, tokens)

    def loss(self, params, batch, rng, train: bool):
        """Cross-entropy plus the weighted mixture-of-experts auxiliary losses (zero when dense)."""
        logits, collections = self.model.apply(
            {"params": params}, batch["inputs"], train=train, rngs={"dropout": rng}, mutable=["moe"]
        )  # (B, T, V)
        cross_entropy = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()
        moe = self.config.model.moe
        aux_loss, moe_metrics = moe_objective(
            collections.get("moe", {}), moe.load_balance_weight, moe.router_z_weight
        )
        return cross_entropy + aux_loss, {"cross_entropy": cross_entropy, **moe_metrics}

    def train_data(self, batch_size: int, seed: int, shard: tuple[int, int], start_step: int):
        return text.train_windows(
            self.train_tokens, self.config.data.context_length, batch_size, seed, shard, start_step
        )

    def eval_data(self):
        e = self.config.eval
        return text.eval_windows(
            self.val_tokens, self.config.data.context_length, e.batch_size, e.num_batches, seed=0
        )

    def eval_weight(self, batch) -> jax.Array:
        return jnp.asarray(batch["targets"].size, jnp.float32)  # every batch has the same tokens

    def active_params(self, params) -> int:
        return parameter_counts(params, self.config.model.moe.top_k)[1]

    def flops_per_example(self, active_params: int) -> float:
        return flops_per_token(self.model.config, active_params) * self.config.data.context_length

    def save_assets(self, workdir: pathlib.Path) -> None:
        self.tokenizer.save(workdir / TOKENIZER_FILE)

    def sample(self, params, prompt: str, max_new_tokens: int, temperature: float, top_k: int,
               seed: int = 0) -> str:
        prompt_ids = self.tokenizer.encode(prompt)[None]  # (1, P)
        ids = generate(
            self.model, params, prompt_ids, max_new_tokens, jax.random.key(seed), temperature, top_k
        )
        return self.tokenizer.decode(ids[0])

    def texts(self, params) -> dict[str, str]:
        s = self.config.sample
        return {"sample": self.sample(params, s.prompt, s.max_new_tokens, s.temperature, s.top_k)}

    def final_results(self, params, evaluate, workdir: pathlib.Path) -> dict[str, float]:
        """Val cross-entropy in windows of each eval.context_lengths, e.g. twice the training length to
        see which positions extrapolate: 'val_cross_entropy_ctx128'. Learned positions have no table
        rows past the training length, so longer lengths are left out for them. (The corpus has no test
        split; benchmarks/gpt_baby.py reports the loss over the whole val split.)"""
        e, trained_length = self.config.eval, self.config.data.context_length
        results = {}
        for length in e.context_lengths:
            if self.config.model.position == "learned" and length > trained_length:
                print(f"val at context {length}: left out, learned positions stop at {trained_length}")
                continue
            batches = text.eval_windows(self.val_tokens, length, e.batch_size, e.num_batches, seed=0)
            results[f"val_cross_entropy_ctx{length}"] = evaluate(batches)["cross_entropy"]
        return results


def build(config: ml_collections.ConfigDict) -> LanguageModel:
    """Reads the corpus, fits the character vocabulary and splits train/val."""
    corpus = text.load_text(config.data.dataset)
    tokenizer = text.CharTokenizer.fit(corpus)
    train_tokens, val_tokens = text.split_tokens(tokenizer.encode(corpus), config.data.train_fraction)
    return LanguageModel(config, tokenizer, train_tokens, val_tokens)


def from_workdir(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> LanguageModel:
    """The experiment for sampling: tokenizer from the workdir, no corpus needed."""
    return LanguageModel(config, text.CharTokenizer.load(workdir / TOKENIZER_FILE))
