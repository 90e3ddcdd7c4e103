"""A pairwise set of the main ablation switches (every pair of switch values in some combination)
builds a GPT and trains a few steps."""

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
SWITCHES = {  # the values of each switch, in the order model() takes them
    "norm_position": ["pre", "post"], "norm": ["layer", "rms"], "mlp": ["gelu", "swiglu"],
    "position": ["learned", "sinusoidal", "rope", "alibi"], "num_experts": [0, 4],
}
# 8 combinations instead of the 64 of the full grid: each position with two complementary settings of
# the two-valued switches, chosen so that every pair of switches meets in all its value pairs (checked below).
PAIRWISE = [
    ("pre", "layer", "gelu", "learned", 0), ("post", "rms", "swiglu", "learned", 4),
    ("pre", "layer", "swiglu", "sinusoidal", 4), ("post", "rms", "gelu", "sinusoidal", 0),
    ("pre", "rms", "gelu", "rope", 4), ("post", "layer", "swiglu", "rope", 0),
    ("pre", "rms", "swiglu", "alibi", 0), ("post", "layer", "gelu", "alibi", 4),
]


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


def test_the_combinations_cover_every_pair_of_switch_values():
    for (i, a), (j, b) in itertools.combinations(enumerate(SWITCHES.values()), 2):
        assert {(c[i], c[j]) for c in PAIRWISE} == set(itertools.product(a, b)), (i, j)


@pytest.mark.parametrize("combination", PAIRWISE, ids=["-".join(map(str, c)) for c in PAIRWISE])
def test_combination_trains_without_nan(combination):
    losses = np.asarray(training_program(model(*combination), jnp.asarray(cycle_batch())).compile()())
    assert np.all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0] - 0.3, losses
