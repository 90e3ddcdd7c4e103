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
"""

import dataclasses
import math
from collections.abc import Callable

import flax.linen as nn

from lm.errors import UserError

INIT_SCHEMES = ("gpt2", "normal", "xavier", "small")


@dataclasses.dataclass(frozen=True)
class Initializers:
    dense: Callable  # every matrix that reads from the residual stream (q, k, v, MLP in, router)
    residual: Callable  # matrices that write into it (attention output, MLP down)
    embedding: Callable  # token and learned position tables


def initializers(scheme: str, embed_dim: int, num_layers: int) -> Initializers:
    normal = nn.initializers.normal
    if scheme == "gpt2":
        return Initializers(normal(0.02), normal(0.02 / math.sqrt(2 * num_layers)), normal(0.02))
    if scheme == "normal":
        return Initializers(normal(0.02), normal(0.02), normal(0.02))
    if scheme == "xavier":
        xavier = nn.initializers.xavier_uniform()
        return Initializers(xavier, xavier, normal(1 / math.sqrt(embed_dim)))
    if scheme == "small":
        small = normal(math.sqrt(2 / (5 * embed_dim)))
        return Initializers(small, normal(2 / (num_layers * math.sqrt(embed_dim))), small)
    raise UserError(f"model.init={scheme!r}: use one of {INIT_SCHEMES}")
