"""Every combination of the main ablation switches builds a GPT and trains a few steps."""

import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lm.layers.transformer import MoeConfig, TransformerConfig
from lm.losses import moe_objective
from lm.models.gpt import GPT, GPTConfig

VOCAB, LENGTH, STEPS = 16, 16, 8
GRID = list(
    itertools.product(
        ["pre", "post"], ["layer", "rms"], ["gelu", "swiglu"], ["learned", "sinusoidal", "rope", "alibi"], [0, 4]
    )
)


def cycle_batch() -> np.ndarray:
    """(4, LENGTH + 1) rows walking a fixed random cycle through the vocabulary: each token
    determines the next, so any working model learns quickly."""
    successor = np.roll(np.random.default_rng(0).permutation(VOCAB), 1)
    rows = np.zeros((4, LENGTH + 1), np.int32)
    rows[:, 0] = [0, 5, 9, 3]
    for t in range(LENGTH):
        rows[:, t + 1] = successor[rows[:, t]]
    return rows


def training_program(model: GPT, batch: jax.Array) -> jax.stages.Lowered:
    """Initialisation and STEPS Adam steps on one batch as one program (one compilation per
    combination keeps the grid fast), lowered but not compiled; it returns the STEPS losses."""
    optimizer = optax.adam(1e-2)

    def loss_fn(params):
        logits, collections = model.apply({"params": params}, batch[:, :-1], mutable=["moe"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()
        aux, _ = moe_objective(collections.get("moe", {}), 0.01, 0.001)
        return loss + aux, loss

    def step(carry, _):
        params, opt_state = carry
        (_, loss), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state)
        return (optax.apply_updates(params, updates), opt_state), loss

    def run():
        params = nn.unbox(model.init(jax.random.key(0), batch[:, :-1])["params"])
        _, losses = jax.lax.scan(step, (params, optimizer.init(params)), length=STEPS)
        return losses

    return jax.jit(run).lower()


def model(norm_position, norm, mlp, position, num_experts) -> GPT:
    blocks = TransformerConfig(
        num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=2, mlp=mlp, mlp_multiple=4, norm=norm,
        norm_position=norm_position, position=position, moe=MoeConfig(num_experts=num_experts, every=1, top_k=2),
    )
    return GPT(GPTConfig(VOCAB, LENGTH, blocks, vocab_multiple=16))


@pytest.mark.parametrize("combination", GRID, ids=["-".join(map(str, c)) for c in GRID])
def test_combination_trains_without_nan(combination):
    losses = np.asarray(training_program(model(*combination), jnp.asarray(cycle_batch())).compile()())
    assert np.all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0] - 0.3, losses
