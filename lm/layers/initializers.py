"""Initialisation schemes for Transformer weights, selected by name (model.init).

  gpt2    N(0, 0.02) everywhere; the projections that write into the residual stream (attention
          output, MLP down) N(0, 0.02 / sqrt(2 L)), so the residual's variance does not grow with
          depth (Radford et al. 2019).
  normal  N(0, 0.02) everywhere, residual projections unscaled: the baseline for the scaling.
  xavier  Glorot-uniform matrices (Vaswani et al. 2017, via fan-in and fan-out), embeddings
          N(0, 1/sqrt(D)).
  small   "small init" N(0, sqrt(2 / (5 D))) (Nguyen & Salazar 2019) with residual projections
          N(0, 2 / (L sqrt(D))) (Wang 2021): the GPT-NeoX / Pythia scheme.
Biases start at zero and norm scales at one in every scheme.

Under μP (base_width > 0: model.parametrization=mup, Tensor Programs V, Table 3) each scheme is what it is at
base_width, then scaled to the width D: the hidden matrices (every kernel of the blocks) get the variance
their scheme has at base_width times base_width / D (variance 1/fan_in; xavier and small already scale so);
the embeddings and the readout (an untied output kernel) keep their base_width variance, whatever D (the
readout's logits are multiplied by base_width / D: lm/layers/heads.py). At D = base_width nothing changes.
"""

import dataclasses
import math
from collections.abc import Callable

import flax.linen as nn
import jax.numpy as jnp

from lm.errors import UserError

INIT_SCHEMES = ("gpt2", "normal", "xavier", "small")


@dataclasses.dataclass(frozen=True)
class Initializers:
    dense: Callable  # every matrix that reads from the residual stream (q, k, v, MLP in, router)
    residual: Callable  # matrices that write into it (attention output, MLP down)
    embedding: Callable  # token and learned position tables
    readout: Callable  # an untied output layer (GPT's lm_head)


def initializers(scheme: str, embed_dim: int, num_layers: int, base_width: int = 0) -> Initializers:
    """The scheme's initialisers at width embed_dim; base_width > 0: under μP from that base (module docstring)."""
    normal = nn.initializers.normal
    base = base_width or embed_dim
    shrink = math.sqrt(base / embed_dim)  # a hidden matrix's std at embed_dim over its std at the base width
    if scheme == "gpt2":
        return Initializers(normal(0.02 * shrink), normal(0.02 * shrink / math.sqrt(2 * num_layers)), normal(0.02),
                            normal(0.02))
    if scheme == "normal":
        return Initializers(normal(0.02 * shrink), normal(0.02 * shrink), normal(0.02), normal(0.02))
    if scheme == "xavier":  # hidden fans both grow with the width: the variance 2 / (fan_in + fan_out) is 1/fan_in
        xavier = nn.initializers.xavier_uniform()
        return Initializers(xavier, xavier, normal(1 / math.sqrt(base)), fan_in_at(xavier, base / embed_dim))
    if scheme == "small":  # sqrt(2 / (5 D)) and 2 / (L sqrt(D)): 1/fan_in already
        small = normal(math.sqrt(2 / (5 * base)))
        return Initializers(normal(math.sqrt(2 / (5 * embed_dim))), normal(2 / (num_layers * math.sqrt(embed_dim))),
                            small, small)
    raise UserError(f"model.init={scheme!r}: use one of {INIT_SCHEMES}")


def fan_in_at(init: Callable, ratio: float) -> Callable:
    """A fan-based init (of a (fan_in, fan_out) matrix) drawn as if its fan_in were ratio times what it is: the
    readout's xavier at the base width. ratio 1: init itself."""
    if ratio == 1:
        return init

    def scaled(key, shape, dtype=jnp.float32):
        fan_in, fan_out = shape[0], math.prod(shape[1:])
        return init(key, shape, dtype) * math.sqrt((fan_in + fan_out) / (ratio * fan_in + fan_out))

    return scaled
