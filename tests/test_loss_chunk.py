"""The language model's loss never holds the whole (B, T, V) logits where they are large: model.loss_chunk=-1
(the default) derives a chunk from the row's length and the vocabulary, and the chunked loss, its z-loss and
logged logsumexp, and their gradients are those of the whole logits."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm.cli.resolve import build_experiment
from lm.layers.transformer import TransformerConfig
from lm.losses import cross_entropy_and_logsumexp
from lm.models import gpt
from lm.models.gpt import AUTO_CHUNK, GPT, GPTConfig, derived_loss_chunk
from lm.train import setup


@pytest.mark.parametrize("length, vocab, expected", [
    (1024, 50304, 256),  # GPT-2: 4 chunks of (B, 256, 50304)
    (2048, 128256, 128),  # Llama 3
    (4096, 50304, 256),
    (256, 128, 0),  # a character-level model: the whole logits are small
    (128, 50304, 0),  # 6.4M logits a row fit the budget
    (1021, 50304, 0),  # a prime length: no divisor of 8 or more fits
])
def test_derived_loss_chunk(length, vocab, expected):
    chunk = derived_loss_chunk(length, vocab)
    assert chunk == expected
    assert chunk == 0 or (length % chunk == 0 and chunk * vocab <= gpt.LOGITS_PER_CHUNK_ROW)


@pytest.mark.slow
def test_the_auto_chunked_loss_z_loss_and_gradients_equal_the_whole_logits_ones(monkeypatch):
    """A budget of 1024 logits a row splits 32 positions x 64 (padded) ids into chunks of 16: the per-token
    cross-entropy and logsumexp, and the loss with a z-loss and its gradients, equal the unchunked model's."""
    monkeypatch.setattr(gpt, "LOGITS_PER_CHUNK_ROW", 1024)
    blocks = TransformerConfig(num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=2)
    whole = GPTConfig(vocab_size=50, context_length=32, transformer=blocks, loss_chunk=0)
    auto = dataclasses.replace(whole, loss_chunk=AUTO_CHUNK)
    assert derived_loss_chunk(32, whole.padded_vocab_size) == 16
    x, y = (jax.random.randint(jax.random.key(seed), (3, 32), 0, 50) for seed in (1, 2))
    params = nn.unbox(GPT(whole).init(jax.random.key(0), x)["params"])

    @functools.partial(jax.jit, static_argnums=0)
    def per_token_and_grads(config, params):
        def loss(p):
            out = GPT(config).apply({"params": p}, x, targets=y, logits_reduce=cross_entropy_and_logsumexp)
            return out["cross_entropy"].mean() + 0.1 * jnp.square(out["logsumexp"]).mean(), out

        return jax.value_and_grad(loss, has_aux=True)(params)

    (expected_loss, expected), expected_grads = per_token_and_grads(whole, params)
    (loss, chunked), grads = per_token_and_grads(auto, params)
    assert "scan" in str(jax.make_jaxpr(functools.partial(per_token_and_grads, auto))(params))  # it did chunk
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)
    for key in ("cross_entropy", "logsumexp"):
        assert chunked[key].dtype == jnp.float32
        np.testing.assert_allclose(chunked[key], expected[key], rtol=1e-6, atol=1e-6, err_msg=key)
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6), grads, expected_grads)


def test_the_gpt2_124m_train_step_never_holds_the_whole_logits():
    """configs/gpt2.py:124m's train step (batch 2 x 1024, width 768, vocabulary 50304, bf16), lowered from abstract
    shapes (nothing computed): no (2, 1024, 50304) array of any type in it, and (2, 256, 50304) chunks instead."""
    from configs.gpt2 import get_config

    config = get_config("124m")
    config.model.num_layers = 1  # (the logits' shapes are those of 12 layers; quicker to trace)
    config.data.dataset = "synthetic"
    config.train.update(batch_size=2, grad_accum_steps=1, compilation_cache_dir="none")
    run = setup.build(config, build_experiment, jax.devices()[:1])
    batch = {key: jax.ShapeDtypeStruct((2, 1024), jnp.int32) for key in ("inputs", "targets")}
    with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.rules):
        state, shardings = run.abstract_state()
        hlo = run.jit_train_step(shardings).lower(state, (batch,)).as_text()
    assert "tensor<2x256x50304xf32>" in hlo  # a chunk's float32 logits (so the search below can find one)
    assert "2x1024x50304x" not in hlo
