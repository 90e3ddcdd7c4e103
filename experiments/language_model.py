"""Language modelling: next-token prediction with a GPT on a character-level corpus."""

import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from lm.data import text
from lm.errors import UserError
from lm.generate import generate
from lm.models.gpt import GPT, GPTConfig, flops_per_token

TOKENIZER_FILE = "tokenizer.json"
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def gpt_config(config: ml_collections.ConfigDict, vocab_size: int) -> GPTConfig:
    m = config.model
    if m.compute_dtype not in DTYPES:
        raise UserError(f"model.compute_dtype={m.compute_dtype!r}: use one of {sorted(DTYPES)}")
    return GPTConfig(
        vocab_size=vocab_size,
        context_length=config.data.context_length,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        num_kv_heads=m.num_kv_heads,
        embed_dim=m.embed_dim,
        mlp_ratio=m.mlp_ratio,
        dropout=m.dropout,
        norm_position=m.norm_position,
        tie_embeddings=m.tie_embeddings,
        use_bias=m.use_bias,
        compute_dtype=DTYPES[m.compute_dtype],
        vocab_multiple=m.vocab_multiple,
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
        logits = self.model.apply(
            {"params": params}, batch["inputs"], train=train, rngs={"dropout": rng}
        )  # (B, T, V)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()
        return loss, {}

    def train_data(self, batch_size: int, seed: int, shard: tuple[int, int]):
        return text.train_windows(
            self.train_tokens, self.config.data.context_length, batch_size, seed, shard
        )

    def eval_data(self):
        e = self.config.eval
        return text.eval_windows(
            self.val_tokens, self.config.data.context_length, e.batch_size, e.num_batches, seed=0
        )

    def flops_per_example(self, num_params: int) -> float:
        return flops_per_token(self.model.config, num_params) * self.config.data.context_length

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


def build(config: ml_collections.ConfigDict) -> LanguageModel:
    """Reads the corpus, fits the character vocabulary and splits train/val."""
    corpus = text.load_text(config.data.dataset)
    tokenizer = text.CharTokenizer.fit(corpus)
    train_tokens, val_tokens = text.split_tokens(tokenizer.encode(corpus), config.data.train_fraction)
    return LanguageModel(config, tokenizer, train_tokens, val_tokens)


def from_workdir(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> LanguageModel:
    """The experiment for sampling: tokenizer from the workdir, no corpus needed."""
    return LanguageModel(config, text.CharTokenizer.load(workdir / TOKENIZER_FILE))
